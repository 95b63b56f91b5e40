//! Containers: `Sequential` (chains single-input modules) and `ModuleList` (a typed list of
//! modules named by index).

use crate::{Forward, Module, Visitor};
use oxtrain_autograd::Var;

/// Modules applied one after another (`nn.Sequential`); children are named `"0"`, `"1"`, ...
/// so their state-dict names are `0.weight`, `1.running_mean`, ...
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Forward>>,
}

impl Sequential {
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends `layer` and returns the container (builder style, as PyTorch's `append`):
    /// `Sequential::new().append(a).append(b)`.
    pub fn append(mut self, layer: impl Forward + 'static) -> Sequential {
        self.push(layer);
        self
    }

    pub fn push(&mut self, layer: impl Forward + 'static) {
        self.layers.push(Box::new(layer));
    }

    pub fn push_boxed(&mut self, layer: Box<dyn Forward>) {
        self.layers.push(layer);
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    pub fn get(&self, index: usize) -> Option<&dyn Forward> {
        self.layers.get(index).map(|b| &**b)
    }

    pub fn iter(&self) -> impl Iterator<Item = &dyn Forward> {
        self.layers.iter().map(|b| &**b)
    }
}

impl FromIterator<Box<dyn Forward>> for Sequential {
    fn from_iter<I: IntoIterator<Item = Box<dyn Forward>>>(iter: I) -> Self {
        Sequential { layers: iter.into_iter().collect() }
    }
}

impl Module for Sequential {
    fn visit(&self, v: &mut dyn Visitor) {
        for (i, layer) in self.layers.iter().enumerate() {
            v.child(&i.to_string(), layer);
        }
    }
}

impl Forward for Sequential {
    fn forward(&self, x: &Var) -> Var {
        self.layers.iter().fold(x.clone(), |x, layer| layer.forward(&x))
    }
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sequential({} layers)", self.layers.len())
    }
}

/// Modules of one type held in a list (`nn.ModuleList`), named `"0"`, `"1"`, ...; it has no
/// forward of its own, the owner iterates it (a Transformer's blocks: `h.0.attn...`).
#[derive(Debug)]
pub struct ModuleList<M> {
    modules: Vec<M>,
}

impl<M> Default for ModuleList<M> {
    fn default() -> Self {
        ModuleList { modules: Vec::new() }
    }
}

impl<M: Module> ModuleList<M> {
    pub fn new() -> ModuleList<M> {
        ModuleList::default()
    }

    pub fn push(&mut self, module: M) {
        self.modules.push(module);
    }

    pub fn len(&self) -> usize {
        self.modules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, M> {
        self.modules.iter()
    }
}

impl<M> std::ops::Index<usize> for ModuleList<M> {
    type Output = M;
    fn index(&self, i: usize) -> &M {
        &self.modules[i]
    }
}

impl<M: Module> FromIterator<M> for ModuleList<M> {
    fn from_iter<I: IntoIterator<Item = M>>(iter: I) -> Self {
        ModuleList { modules: iter.into_iter().collect() }
    }
}

impl<M: Module> Module for ModuleList<M> {
    fn visit(&self, v: &mut dyn Visitor) {
        for (i, m) in self.modules.iter().enumerate() {
            v.child(&i.to_string(), m);
        }
    }
}
