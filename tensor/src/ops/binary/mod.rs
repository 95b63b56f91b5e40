//! Elementwise functions of two tensors with numpy broadcasting: arithmetic, comparisons
//! (giving bool masks), `where_cond` and `masked_fill`. Both operands must share dtype and device.

mod cpu;
pub(crate) mod cuda;
#[cfg(test)]
mod tests;

use crate::memory_order::MemoryOrder;
use crate::shape::broadcast_shapes;
use crate::storage::Storage;
use crate::{DType, Layout, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Pow,
}

impl BinaryOp {
    pub fn name(&self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Pow => "pow",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub fn name(&self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

impl Tensor {
    /// Both operands' layouts broadcast to their common shape; panics naming `op` otherwise.
    pub(crate) fn broadcast_pair(&self, rhs: &Tensor, op: &str) -> (Vec<usize>, Layout, Layout) {
        self.same_device(rhs, op);
        let shape = broadcast_shapes(self.dims(), rhs.dims(), op);
        let la = self.layout().broadcast_as(&shape).expect("broadcast checked");
        let lb = rhs.layout().broadcast_as(&shape).expect("broadcast checked");
        (shape.into_vec(), la, lb)
    }

    /// Applies `op` elementwise with broadcasting.
    pub fn binary(&self, rhs: &Tensor, op: BinaryOp) -> Tensor {
        self.same_dtype(rhs, op.name());
        let (shape, la, lb) = self.broadcast_pair(rhs, op.name());
        if let Some(m) = MemoryOrder::of(&shape, &[self, rhs]) {
            return m.leave(m.enter(self).binary(&m.enter(rhs), op));
        }
        let storage = match (&*self.storage(), &*rhs.storage()) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Storage::Cpu(cpu::binary(a, &la, b, &lb, op)),
            (Storage::Cuda(a), Storage::Cuda(b)) => Storage::Cuda(cuda::binary(a, &la, b, &lb, op)),
            _ => unreachable!("devices checked equal"),
        };
        Tensor::from_storage(storage, shape)
    }

    /// Compares elementwise with broadcasting; the result is a bool tensor.
    pub fn cmp(&self, rhs: &Tensor, op: CmpOp) -> Tensor {
        self.same_dtype(rhs, op.name());
        let (shape, la, lb) = self.broadcast_pair(rhs, op.name());
        if let Some(m) = MemoryOrder::of(&shape, &[self, rhs]) {
            return m.leave(m.enter(self).cmp(&m.enter(rhs), op));
        }
        let storage = match (&*self.storage(), &*rhs.storage()) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Storage::Cpu(cpu::compare(a, &la, b, &lb, op)),
            (Storage::Cuda(a), Storage::Cuda(b)) => Storage::Cuda(cuda::compare(a, &la, b, &lb, op)),
            _ => unreachable!("devices checked equal"),
        };
        Tensor::from_storage(storage, shape)
    }

    /// Compares with a scalar (converted to this tensor's dtype).
    pub fn cmp_scalar(&self, rhs: f64, op: CmpOp) -> Tensor {
        self.cmp(&self.scalar_like(rhs), op)
    }

    /// A rank-0 tensor of `value` with this tensor's dtype and device.
    pub fn scalar_like(&self, value: f64) -> Tensor {
        Tensor::full((), value, self.dtype(), self.device()).expect("a scalar on the tensor's own device")
    }

    pub fn add(&self, rhs: &Tensor) -> Tensor {
        self.binary(rhs, BinaryOp::Add)
    }
    pub fn sub(&self, rhs: &Tensor) -> Tensor {
        self.binary(rhs, BinaryOp::Sub)
    }
    pub fn mul(&self, rhs: &Tensor) -> Tensor {
        self.binary(rhs, BinaryOp::Mul)
    }
    pub fn div(&self, rhs: &Tensor) -> Tensor {
        self.binary(rhs, BinaryOp::Div)
    }
    pub fn maximum(&self, rhs: &Tensor) -> Tensor {
        self.binary(rhs, BinaryOp::Maximum)
    }
    pub fn minimum(&self, rhs: &Tensor) -> Tensor {
        self.binary(rhs, BinaryOp::Minimum)
    }
    /// Elementwise power with a tensor exponent.
    pub fn pow(&self, exponent: &Tensor) -> Tensor {
        self.binary(exponent, BinaryOp::Pow)
    }
    pub fn eq(&self, rhs: &Tensor) -> Tensor {
        self.cmp(rhs, CmpOp::Eq)
    }
    pub fn ne(&self, rhs: &Tensor) -> Tensor {
        self.cmp(rhs, CmpOp::Ne)
    }
    pub fn lt(&self, rhs: &Tensor) -> Tensor {
        self.cmp(rhs, CmpOp::Lt)
    }
    pub fn le(&self, rhs: &Tensor) -> Tensor {
        self.cmp(rhs, CmpOp::Le)
    }
    pub fn gt(&self, rhs: &Tensor) -> Tensor {
        self.cmp(rhs, CmpOp::Gt)
    }
    pub fn ge(&self, rhs: &Tensor) -> Tensor {
        self.cmp(rhs, CmpOp::Ge)
    }

    /// ReLU's backward in one pass (`torch.ops.aten.threshold_backward` with the comparison
    /// reversed for NaN): `self`, the output gradient, where `input > threshold`, else 0.
    /// `input` may be ReLU's input or its output (both are positive at the same places).
    pub fn threshold_backward(&self, input: &Tensor, threshold: f64) -> Tensor {
        let op = "threshold_backward";
        self.same_dtype(input, op);
        assert!(self.dtype().is_float(), "{op}: expected a floating-point gradient, got {}", self.dtype());
        let (shape, lg, lx) = self.broadcast_pair(input, op);
        if let Some(m) = MemoryOrder::of(&shape, &[self, input]) {
            return m.leave(m.enter(self).threshold_backward(&m.enter(input), threshold));
        }
        let storage = match (&*self.storage(), &*input.storage()) {
            (Storage::Cpu(g), Storage::Cpu(x)) => {
                Storage::Cpu(cpu::threshold_backward(g, &lg, x, &lx, threshold))
            }
            (Storage::Cuda(g), Storage::Cuda(x)) => {
                Storage::Cuda(cuda::threshold_backward(g, &lg, x, &lx, threshold))
            }
            _ => unreachable!("devices checked equal"),
        };
        Tensor::from_storage(storage, shape)
    }

    /// GELU's backward in one pass (`torch.ops.aten.gelu_backward`): `self`, the output
    /// gradient, times the derivative of GELU at `input`: `Phi(x) + x phi(x)` for the exact
    /// (erf) form, or the derivative of `0.5 x (1 + tanh(c (x + 0.044715 x^3)))` with `tanh`
    /// (`approximate="tanh"`). f16 and bf16 compute in f32.
    pub fn gelu_backward(&self, input: &Tensor, tanh: bool) -> Tensor {
        let op = "gelu_backward";
        self.same_dtype(input, op);
        assert!(self.dtype().is_float(), "{op}: expected a floating-point gradient, got {}", self.dtype());
        let (shape, lg, lx) = self.broadcast_pair(input, op);
        if let Some(m) = MemoryOrder::of(&shape, &[self, input]) {
            return m.leave(m.enter(self).gelu_backward(&m.enter(input), tanh));
        }
        let storage = match (&*self.storage(), &*input.storage()) {
            (Storage::Cpu(g), Storage::Cpu(x)) => Storage::Cpu(cpu::gelu_backward(g, &lg, x, &lx, tanh)),
            (Storage::Cuda(g), Storage::Cuda(x)) => Storage::Cuda(cuda::gelu_backward(g, &lg, x, &lx, tanh)),
            _ => unreachable!("devices checked equal"),
        };
        Tensor::from_storage(storage, shape)
    }

    /// `self ? on_true : on_false` elementwise, all three broadcast together (`torch.where`).
    /// `self` is a bool mask.
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Tensor {
        assert_eq!(
            self.dtype(),
            DType::Bool,
            "where_cond: the condition must be a bool tensor, got {} with shape {:?}",
            self.dtype(),
            self.dims()
        );
        on_true.same_dtype(on_false, "where_cond");
        self.same_device(on_true, "where_cond");
        self.same_device(on_false, "where_cond");
        let shape = broadcast_shapes(
            broadcast_shapes(self.dims(), on_true.dims(), "where_cond").dims(),
            on_false.dims(),
            "where_cond",
        );
        let layout = |t: &Tensor| t.layout().broadcast_as(&shape).expect("broadcast checked");
        let (lc, lt, lf) = (layout(self), layout(on_true), layout(on_false));
        let storage = match (&*self.storage(), &*on_true.storage(), &*on_false.storage()) {
            (Storage::Cpu(c), Storage::Cpu(t), Storage::Cpu(f)) => {
                Storage::Cpu(cpu::where_cond(c, &lc, t, &lt, f, &lf))
            }
            (Storage::Cuda(c), Storage::Cuda(t), Storage::Cuda(f)) => {
                Storage::Cuda(cuda::where_cond((c, &lc), (t, &lt), (f, &lf)))
            }
            _ => unreachable!("devices checked equal"),
        };
        Tensor::from_storage(storage, shape)
    }

    /// `value` where `mask` is true, else `self`; `mask` broadcasts to `self`'s shape.
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Tensor {
        assert!(
            mask.layout().broadcast_as(self.dims()).is_some(),
            "masked_fill: mask of shape {:?} cannot be broadcast to the tensor's shape {:?}",
            mask.dims(),
            self.dims()
        );
        mask.where_cond(&self.scalar_like(value), self)
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident, $op:ident, $scalar:expr) => {
        impl std::ops::$trait<&Tensor> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary(rhs, BinaryOp::$op)
            }
        }
        impl std::ops::$trait<Tensor> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                self.binary(&rhs, BinaryOp::$op)
            }
        }
        impl std::ops::$trait<&Tensor> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary(rhs, BinaryOp::$op)
            }
        }
        impl std::ops::$trait<Tensor> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                self.binary(&rhs, BinaryOp::$op)
            }
        }
        impl std::ops::$trait<f64> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: f64) -> Tensor {
                let f: fn(&Tensor, f64) -> Tensor = $scalar;
                f(self, rhs)
            }
        }
        impl std::ops::$trait<f64> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: f64) -> Tensor {
                let f: fn(&Tensor, f64) -> Tensor = $scalar;
                f(&self, rhs)
            }
        }
    };
}
operator!(Add, add, Add, |t, v| t.affine(1.0, v));
operator!(Sub, sub, Sub, |t, v| t.affine(1.0, -v));
operator!(Mul, mul, Mul, |t, v| t.affine(v, 0.0));
operator!(Div, div, Div, |t, v| t.binary(&t.scalar_like(v), BinaryOp::Div));

impl std::ops::Neg for &Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        self.unary(crate::UnaryOp::Neg)
    }
}
impl std::ops::Neg for Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        self.unary(crate::UnaryOp::Neg)
    }
}
