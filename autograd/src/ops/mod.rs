//! The differentiable ops, one file per op family: each file holds the `Var` methods of its
//! family and their gradients.

mod attention;
mod conv;
mod elementwise;
mod index;
mod layer_norm;
mod linear;
mod matmul;
mod norm;
mod pool;
pub mod profile;
mod reduce;
mod shape;
mod softmax;
