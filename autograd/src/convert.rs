//! Conversions into [`Var`], so a forward pass takes what a user has at hand: a `Tensor` from
//! a data loader (it becomes a constant, as every input of a PyTorch model is) or a `Var`
//! from inside a graph. Functions that accept `impl Into<Var>` take `x`, `&x`, `t` and `&t`.

use crate::Var;
use oxtrain_tensor::Tensor;

/// A tensor as an input: a constant that gets no gradient ([`Var::constant`]).
impl From<Tensor> for Var {
    fn from(tensor: Tensor) -> Var {
        Var::constant(tensor)
    }
}

/// A tensor as an input: a constant sharing the tensor's storage (the clone is an `Arc`).
impl From<&Tensor> for Var {
    fn from(tensor: &Tensor) -> Var {
        Var::constant(tensor.clone())
    }
}

/// The same node of the graph (a cheap clone): gradients still flow into it.
impl From<&Var> for Var {
    fn from(var: &Var) -> Var {
        var.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxtrain_tensor::{DType, Device};

    fn through<X: Into<Var>>(x: X) -> Var {
        x.into()
    }

    #[test]
    fn a_tensor_becomes_a_constant_and_a_var_keeps_its_graph() {
        let t = Tensor::ones([2, 2], DType::F32, Device::Cpu).unwrap();
        assert!(!through(&t).requires_grad());
        assert!(!through(t.clone()).requires_grad());
        assert!(through(&t).tensor().same_storage(&t));

        let p = Var::parameter(t);
        let q = through(&p);
        assert!(q.requires_grad());
        q.sum_all().backward();
        assert_eq!(p.grad().unwrap().to_vec::<f32>(), [1.0; 4]);
    }
}
