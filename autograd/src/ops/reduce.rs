//! Gradients of reductions: `sum`, `mean`, `max`, `min` over dims (and their whole-tensor
//! forms), and `var`, `std`, `logsumexp` composed from them.

use crate::Var;
use oxtrain_tensor::ops::reduce::reduced_dims;
use oxtrain_tensor::{Dims, Tensor};

/// The input's shape with the reduced dims set to 1 (the `keepdim` shape).
fn kept_shape(shape: &[usize], dims: &[usize]) -> Vec<usize> {
    shape.iter().enumerate().map(|(i, &d)| if dims.contains(&i) { 1 } else { d }).collect()
}

/// `g` (the gradient of a reduction's output) spread back over the input's shape.
fn spread(g: &Tensor, kept: &[usize], input: &[usize]) -> Tensor {
    g.reshape(kept).broadcast_as(input)
}

impl Var {
    fn reduce_op(
        &self,
        name: &'static str,
        dims: Vec<usize>,
        keepdim: bool,
        max_or_min: Option<bool>,
    ) -> Var {
        let x = self.tensor();
        let input = x.dims().to_vec();
        let kept = kept_shape(&input, &dims);
        let count: usize = dims.iter().map(|&d| input[d]).product();
        let out = match (name, max_or_min) {
            ("sum", _) => x.sum(dims.clone(), keepdim),
            ("mean", _) => x.mean(dims.clone(), keepdim),
            (_, Some(true)) => x.max(dims.clone(), keepdim),
            _ => x.min(dims.clone(), keepdim),
        };
        // Max and min need the input and output to find the winners; sum and mean nothing.
        let saved = max_or_min.map(|_| (x.clone(), out.clone()));
        Var::from_op(name, out, &[self], move |g, _| {
            let g = spread(g, &kept, &input);
            let grad = match &saved {
                None if name == "mean" => g.mul_scalar(1.0 / count as f64),
                None => g,
                // Ties share the gradient evenly, as `torch.amax` does.
                Some((x, y)) => {
                    let winners = x.eq(&y.reshape(kept.as_slice())).to_dtype(g.dtype());
                    let n = winners.sum(dims.clone(), true);
                    g.mul(&winners).div(&n)
                }
            };
            vec![Some(grad)]
        })
    }

    /// Sum over `dims` (all dims when empty).
    pub fn sum<D: Dims>(&self, dims: D, keepdim: bool) -> Var {
        let dims = reduced_dims(self.dims(), &dims, "sum");
        self.reduce_op("sum", dims, keepdim, None)
    }

    pub fn mean<D: Dims>(&self, dims: D, keepdim: bool) -> Var {
        let dims = reduced_dims(self.dims(), &dims, "mean");
        self.reduce_op("mean", dims, keepdim, None)
    }

    /// Largest values over `dims` (`torch.amax`); tied maxima share the gradient equally.
    pub fn max<D: Dims>(&self, dims: D, keepdim: bool) -> Var {
        let dims = reduced_dims(self.dims(), &dims, "max");
        self.reduce_op("max", dims, keepdim, Some(true))
    }

    /// Smallest values over `dims` (`torch.amin`); tied minima share the gradient equally.
    pub fn min<D: Dims>(&self, dims: D, keepdim: bool) -> Var {
        let dims = reduced_dims(self.dims(), &dims, "min");
        self.reduce_op("min", dims, keepdim, Some(false))
    }

    pub fn sum_all(&self) -> Var {
        self.sum(&[] as &[usize], false)
    }

    pub fn mean_all(&self) -> Var {
        self.mean(&[] as &[usize], false)
    }

    pub fn max_all(&self) -> Var {
        self.max(&[] as &[usize], false)
    }

    pub fn min_all(&self) -> Var {
        self.min(&[] as &[usize], false)
    }

    /// Variance over `dims` with `correction` (1: unbiased), as `torch.var`.
    pub fn var<D: Dims>(&self, dims: D, correction: usize, keepdim: bool) -> Var {
        let dims = reduced_dims(self.dims(), &dims, "var");
        let n: usize = dims.iter().map(|&d| self.dims()[d]).product();
        let centered = self.sub(&self.mean(dims.clone(), true));
        let denom = n.saturating_sub(correction) as f64;
        centered.square().sum(dims, keepdim).mul_scalar(1.0 / denom)
    }

    /// Standard deviation over `dims`, the square root of [`Var::var`].
    pub fn std<D: Dims>(&self, dims: D, correction: usize, keepdim: bool) -> Var {
        self.var(dims, correction, keepdim).sqrt()
    }

    /// `log(sum(exp(x)))` over `dims`, computed stably by shifting by the (constant) maximum.
    pub fn logsumexp<D: Dims>(&self, dims: D, keepdim: bool) -> Var {
        let dims = reduced_dims(self.dims(), &dims, "logsumexp");
        let shift = Var::constant(self.tensor().max(dims.clone(), true));
        let lse = self.sub(&shift).exp().sum(dims.clone(), true).log().add(&shift);
        if keepdim {
            lse
        } else {
            let out: Vec<usize> =
                self.dims().iter().enumerate().filter(|(i, _)| !dims.contains(i)).map(|(_, &d)| d).collect();
            lse.reshape(out)
        }
    }
}
