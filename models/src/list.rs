//! A list of modules named `0`, `1`, ... (`nn.ModuleList` of one module type).

use oxtrain_nn::{Module, Visitor};
use std::sync::Arc;

/// Each module sits behind an `Arc`, so a checkpointed forward can keep a handle to the
/// block it reruns in backward (`oxtrain_autograd::checkpoint` takes `'static` closures).
#[derive(Debug)]
pub struct List<T>(pub Vec<Arc<T>>);

impl<T> FromIterator<T> for List<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> List<T> {
        List(iter.into_iter().map(Arc::new).collect())
    }
}

impl<T: Module> Module for List<T> {
    fn visit(&self, v: &mut dyn Visitor) {
        for (i, m) in self.0.iter().enumerate() {
            v.child(&i.to_string(), &**m);
        }
    }
}
