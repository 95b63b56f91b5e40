//! What the DDP tests share: the small models trained on every backend (`ddp_train`, also
//! used by oxtrain-comm's mpi and netns tests) and the child-process helpers of comm's tests.
#![allow(dead_code)]

pub mod ddp_train;
#[path = "../../../comm/tests/common/procs.rs"]
pub mod procs;
pub mod zero_train;
