//! Gradients of `softmax` and `log_softmax` along one dim, from their saved outputs.

use crate::Var;
use oxtrain_tensor::{Dim, SoftmaxOp};

impl Var {
    /// `exp(x) / sum(exp(x))` along `dim`; the gradient is `y * (g - sum(g * y))`.
    pub fn softmax<D: Dim>(&self, dim: D) -> Var {
        if crate::autocast_dtype().is_some() {
            let x = self.autocast_f32();
            return crate::autocast_disabled(|| x.softmax(dim));
        }
        let d =
            if self.rank() == 0 { dim.to_index(1, "softmax") } else { dim.to_index(self.rank(), "softmax") };
        let out = self.tensor().softmax(d);
        let y = out.clone();
        Var::from_op("softmax", out, &[self], move |g, _| {
            vec![Some(g.softmax_backward(&y, SoftmaxOp::Softmax, d))]
        })
    }

    /// `log(softmax(x))` along `dim`; the gradient is `g - exp(y) * sum(g)`.
    pub fn log_softmax<D: Dim>(&self, dim: D) -> Var {
        if crate::autocast_dtype().is_some() {
            let x = self.autocast_f32();
            return crate::autocast_disabled(|| x.log_softmax(dim));
        }
        let d = if self.rank() == 0 {
            dim.to_index(1, "log_softmax")
        } else {
            dim.to_index(self.rank(), "log_softmax")
        };
        let out = self.tensor().log_softmax(d);
        let y = out.clone();
        Var::from_op("log_softmax", out, &[self], move |g, _| {
            vec![Some(g.softmax_backward(&y, SoftmaxOp::LogSoftmax, d))]
        })
    }
}
