//! The differentiable ops, one file per op family: each file holds the `Var` methods of its
//! family and their gradients.

mod elementwise;
mod index;
mod matmul;
mod nn;
mod reduce;
mod shape;
mod softmax;
