//! A list of modules named `0`, `1`, ... (`nn.ModuleList` of one module type).

use oxtrain_nn::{Module, Visitor};

#[derive(Debug)]
pub struct List<T>(pub Vec<T>);

impl<T: Module> Module for List<T> {
    fn visit(&self, v: &mut dyn Visitor) {
        for (i, m) in self.0.iter().enumerate() {
            v.child(&i.to_string(), m);
        }
    }
}
