//! Gradients of elementwise ops: arithmetic with broadcasting (the engine sums a gradient
//! back to its input's shape), functions of one tensor, `where_cond` and `masked_fill`, and
//! the operator overloads.

use crate::Var;
use oxtrain_tensor::{CmpOp, Tensor};

/// A 0/1 tensor of `like`'s dtype from a bool mask.
fn as_float(mask: &Tensor, like: &Tensor) -> Tensor {
    mask.to_dtype(like.dtype())
}

impl Var {
    /// A one-input op whose input gradient is `g * dfdx(x)`; saves only the input.
    fn unary_x(
        &self,
        name: &'static str,
        f: impl Fn(&Tensor) -> Tensor,
        dfdx: impl Fn(&Tensor) -> Tensor + Send + Sync + 'static,
    ) -> Var {
        let x = self.tensor().clone();
        Var::from_op(name, f(&x), &[self], move |g, _| vec![Some(g.mul(&dfdx(&x)))])
    }

    /// A one-input op whose input gradient is `g * dfdy(y)` from its output; saves only the output.
    fn unary_y(
        &self,
        name: &'static str,
        f: impl Fn(&Tensor) -> Tensor,
        dfdy: impl Fn(&Tensor) -> Tensor + Send + Sync + 'static,
    ) -> Var {
        let out = f(self.tensor());
        let y = out.clone();
        Var::from_op(name, out, &[self], move |g, _| vec![Some(g.mul(&dfdy(&y)))])
    }

    pub fn add(&self, rhs: &Var) -> Var {
        if self.dtype() != rhs.dtype() {
            let (a, b) = self.promote_pair(rhs);
            return a.add(&b);
        }
        let out = self.tensor().add(rhs.tensor());
        Var::from_op("add", out, &[self, rhs], |g, _| vec![Some(g.clone()), Some(g.clone())])
    }

    pub fn sub(&self, rhs: &Var) -> Var {
        if self.dtype() != rhs.dtype() {
            let (a, b) = self.promote_pair(rhs);
            return a.sub(&b);
        }
        let out = self.tensor().sub(rhs.tensor());
        Var::from_op("sub", out, &[self, rhs], |g, needs| vec![Some(g.clone()), needs[1].then(|| g.neg())])
    }

    pub fn mul(&self, rhs: &Var) -> Var {
        if self.dtype() != rhs.dtype() {
            let (a, b) = self.promote_pair(rhs);
            return a.mul(&b);
        }
        let out = self.tensor().mul(rhs.tensor());
        let (a, b) = (self.tensor().clone(), rhs.tensor().clone());
        Var::from_op("mul", out, &[self, rhs], move |g, needs| {
            vec![needs[0].then(|| g.mul(&b)), needs[1].then(|| g.mul(&a))]
        })
    }

    pub fn div(&self, rhs: &Var) -> Var {
        if self.dtype() != rhs.dtype() {
            let (a, b) = self.promote_pair(rhs);
            return a.div(&b);
        }
        let out = self.tensor().div(rhs.tensor());
        let (b, y) = (rhs.tensor().clone(), out.clone());
        Var::from_op("div", out, &[self, rhs], move |g, needs| {
            let ga = g.div(&b);
            let gb = needs[1].then(|| ga.mul(&y).neg());
            vec![needs[0].then_some(ga), gb]
        })
    }

    /// Elementwise maximum; where both are equal each gets half the gradient, as in PyTorch.
    pub fn maximum(&self, rhs: &Var) -> Var {
        self.select_op("maximum", rhs, CmpOp::Gt)
    }

    /// Elementwise minimum; ties split the gradient like [`Var::maximum`].
    pub fn minimum(&self, rhs: &Var) -> Var {
        self.select_op("minimum", rhs, CmpOp::Lt)
    }

    fn select_op(&self, name: &'static str, rhs: &Var, wins: CmpOp) -> Var {
        if self.dtype() != rhs.dtype() {
            let (a, b) = self.promote_pair(rhs);
            return a.select_op(name, &b, wins);
        }
        let (a, b) = (self.tensor().clone(), rhs.tensor().clone());
        let out = if wins == CmpOp::Gt { a.maximum(&b) } else { a.minimum(&b) };
        Var::from_op(name, out, &[self, rhs], move |g, _| {
            let share = as_float(&a.cmp(&b, wins), g).add(&as_float(&a.eq(&b), g).mul_scalar(0.5));
            let ga = g.mul(&share);
            let gb = g.sub(&ga);
            vec![Some(ga), Some(gb)]
        })
    }

    /// `self ^ exponent` elementwise with a tensor exponent.
    pub fn pow(&self, exponent: &Var) -> Var {
        let (x, e) = (self.tensor().clone(), exponent.tensor().clone());
        let out = x.pow(&e);
        let y = out.clone();
        Var::from_op("pow", out, &[self, exponent], move |g, needs| {
            // d/dx = e x^(e-1); d/de = x^e ln x (0 where x is 0, as PyTorch gives).
            let gx = needs[0].then(|| g.mul(&e).mul(&x.pow(&e.add_scalar(-1.0))));
            let ge = needs[1].then(|| {
                let zero = x.cmp_scalar(0.0, CmpOp::Eq);
                g.mul(&y.mul(&x.log()).masked_fill(&zero, 0.0))
            });
            vec![gx, ge]
        })
    }

    pub fn neg(&self) -> Var {
        Var::from_op("neg", self.tensor().neg(), &[self], |g, _| vec![Some(g.neg())])
    }

    /// `self * mul + add`.
    pub fn affine(&self, mul: f64, add: f64) -> Var {
        Var::from_op("affine", self.tensor().affine(mul, add), &[self], move |g, _| {
            vec![Some(g.mul_scalar(mul))]
        })
    }

    pub fn add_scalar(&self, v: f64) -> Var {
        self.affine(1.0, v)
    }

    pub fn mul_scalar(&self, v: f64) -> Var {
        self.affine(v, 0.0)
    }

    pub fn exp(&self) -> Var {
        self.unary_y("exp", Tensor::exp, |y| y.clone())
    }

    pub fn log(&self) -> Var {
        self.unary_x("log", Tensor::log, |x| x.recip())
    }

    pub fn log1p(&self) -> Var {
        self.unary_x("log1p", Tensor::log1p, |x| x.add_scalar(1.0).recip())
    }

    pub fn sqrt(&self) -> Var {
        self.unary_y("sqrt", Tensor::sqrt, |y| y.recip().mul_scalar(0.5))
    }

    pub fn rsqrt(&self) -> Var {
        self.unary_y("rsqrt", Tensor::rsqrt, |y| y.powf(3.0).mul_scalar(-0.5))
    }

    pub fn sin(&self) -> Var {
        self.unary_x("sin", Tensor::sin, |x| x.cos())
    }

    pub fn cos(&self) -> Var {
        self.unary_x("cos", Tensor::cos, |x| x.sin().neg())
    }

    pub fn tanh(&self) -> Var {
        self.unary_y("tanh", Tensor::tanh, |y| y.square().affine(-1.0, 1.0))
    }

    pub fn sigmoid(&self) -> Var {
        self.unary_y("sigmoid", Tensor::sigmoid, |y| y.mul(&y.affine(-1.0, 1.0)))
    }

    /// Its gradient is 0 at 0, as in PyTorch.
    pub fn relu(&self) -> Var {
        // One pass: the gradient where the output is positive (exactly where the input is).
        let out = self.tensor().relu();
        let y = out.clone();
        Var::from_op("relu", out, &[self], move |g, _| vec![Some(g.threshold_backward(&y, 0.0))])
    }

    /// Exact GELU `x * Phi(x)`; its derivative is `Phi(x) + x * phi(x)` (one fused kernel).
    pub fn gelu(&self) -> Var {
        let x = self.tensor().clone();
        Var::from_op("gelu", x.gelu(), &[self], move |g, _| vec![Some(g.gelu_backward(&x, false))])
    }

    /// GELU's tanh approximation, `0.5 x (1 + tanh(c (x + 0.044715 x^3)))`.
    pub fn gelu_tanh(&self) -> Var {
        let x = self.tensor().clone();
        Var::from_op("gelu_tanh", x.gelu_tanh(), &[self], move |g, _| vec![Some(g.gelu_backward(&x, true))])
    }

    /// `x * sigmoid(x)`; its derivative is `s (1 + x (1 - s))`.
    pub fn silu(&self) -> Var {
        self.unary_x("silu", Tensor::silu, |x| {
            let s = x.sigmoid();
            s.mul(&x.mul(&s.affine(-1.0, 1.0)).add_scalar(1.0))
        })
    }

    pub fn square(&self) -> Var {
        self.unary_x("square", Tensor::square, |x| x.mul_scalar(2.0))
    }

    pub fn recip(&self) -> Var {
        self.unary_y("reciprocal", Tensor::recip, |y| y.square().neg())
    }

    /// Its gradient is 0 at 0, as in PyTorch.
    pub fn abs(&self) -> Var {
        self.unary_x("abs", Tensor::abs, |x| x.sign())
    }

    /// `self ^ exponent` with a scalar exponent.
    pub fn powf(&self, exponent: f64) -> Var {
        self.unary_x("pow", move |x| x.powf(exponent), move |x| x.powf(exponent - 1.0).mul_scalar(exponent))
    }

    /// Clamps into `[min, max]`; the gradient passes where the input is inside (bounds included).
    pub fn clamp(&self, min: f64, max: f64) -> Var {
        self.unary_x(
            "clamp",
            move |x| x.clamp(min, max),
            move |x| {
                let inside_low = as_float(&x.cmp_scalar(min, CmpOp::Ge), x);
                inside_low.mul(&as_float(&x.cmp_scalar(max, CmpOp::Le), x))
            },
        )
    }

    /// `cond ? on_true : on_false` (`torch.where`), with a bool mask `cond`; all broadcast.
    pub fn where_cond(cond: &Tensor, on_true: &Var, on_false: &Var) -> Var {
        let out = cond.where_cond(on_true.tensor(), on_false.tensor());
        let cond = cond.clone();
        Var::from_op("where", out, &[on_true, on_false], move |g, needs| {
            let zero = g.zeros_like();
            vec![needs[0].then(|| cond.where_cond(g, &zero)), needs[1].then(|| cond.where_cond(&zero, g))]
        })
    }

    /// `value` where `mask` is true, else `self`.
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Var {
        let out = self.tensor().masked_fill(mask, value);
        let mask = mask.clone();
        Var::from_op("masked_fill", out, &[self], move |g, _| vec![Some(g.masked_fill(&mask, 0.0))])
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident, $scalar:expr, $scalar_lhs:expr) => {
        impl std::ops::$trait<&Var> for &Var {
            type Output = Var;
            fn $method(self, rhs: &Var) -> Var {
                Var::$method(self, rhs)
            }
        }
        impl std::ops::$trait<Var> for Var {
            type Output = Var;
            fn $method(self, rhs: Var) -> Var {
                Var::$method(&self, &rhs)
            }
        }
        impl std::ops::$trait<&Var> for Var {
            type Output = Var;
            fn $method(self, rhs: &Var) -> Var {
                Var::$method(&self, rhs)
            }
        }
        impl std::ops::$trait<Var> for &Var {
            type Output = Var;
            fn $method(self, rhs: Var) -> Var {
                Var::$method(self, &rhs)
            }
        }
        impl std::ops::$trait<f64> for &Var {
            type Output = Var;
            fn $method(self, rhs: f64) -> Var {
                let f: fn(&Var, f64) -> Var = $scalar;
                f(self, rhs)
            }
        }
        impl std::ops::$trait<f64> for Var {
            type Output = Var;
            fn $method(self, rhs: f64) -> Var {
                let f: fn(&Var, f64) -> Var = $scalar;
                f(&self, rhs)
            }
        }
        impl std::ops::$trait<&Var> for f64 {
            type Output = Var;
            fn $method(self, rhs: &Var) -> Var {
                let f: fn(f64, &Var) -> Var = $scalar_lhs;
                f(self, rhs)
            }
        }
        impl std::ops::$trait<Var> for f64 {
            type Output = Var;
            fn $method(self, rhs: Var) -> Var {
                let f: fn(f64, &Var) -> Var = $scalar_lhs;
                f(self, &rhs)
            }
        }
    };
}
operator!(Add, add, |v, s| v.affine(1.0, s), |s, v| v.affine(1.0, s));
operator!(Sub, sub, |v, s| v.affine(1.0, -s), |s, v| v.affine(-1.0, s));
operator!(Mul, mul, |v, s| v.affine(s, 0.0), |s, v| v.affine(s, 0.0));
operator!(Div, div, |v, s| v.affine(1.0 / s, 0.0), |s, v| v.recip().affine(s, 0.0));

impl std::ops::Neg for &Var {
    type Output = Var;
    fn neg(self) -> Var {
        Var::neg(self)
    }
}
impl std::ops::Neg for Var {
    type Output = Var;
    fn neg(self) -> Var {
        Var::neg(&self)
    }
}
