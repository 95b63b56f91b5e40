//! What the DDP tests share: the small models trained on every backend (`ddp_train`, also
//! used by oxtrain-comm's mpi and netns tests) and the child-process helpers of comm's tests.
#![allow(dead_code)]

pub mod ddp_train;
#[path = "../../../comm/tests/common/procs.rs"]
pub mod procs;
pub mod zero_train;

use oxtrain_comm::{Communicator, ShmOptions};
use std::sync::Arc;

/// Runs `f` on `world` rank threads over the local backend; returns each rank's result.
pub fn on_ranks<R: Send + 'static>(
    world: usize,
    f: impl Fn(Arc<dyn Communicator>) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let worlds = oxtrain_comm::shm::local_group(world, &ShmOptions::default()).unwrap();
    let handles: Vec<_> = worlds
        .into_iter()
        .map(|w| {
            let f = f.clone();
            std::thread::spawn(move || f(Arc::new(w.comm) as Arc<dyn Communicator>))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("a rank thread panicked")).collect()
}
