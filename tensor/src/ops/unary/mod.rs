//! Elementwise functions of one tensor, and of a tensor and scalars (`affine`, `powf`, `clamp`).
//! The result is a new contiguous tensor of the input's dtype.

pub(crate) mod cpu;
pub(crate) mod cuda;
#[cfg(test)]
mod tests;

use crate::memory_order::MemoryOrder;
use crate::storage::Storage;
use crate::Tensor;

/// An elementwise function; the CUDA backend maps each to a kernel by name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Log1p,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    /// The exact GELU, `x * Phi(x)` with the normal CDF through erf.
    Gelu,
    /// GELU's tanh approximation (`approximate="tanh"` in PyTorch).
    GeluTanh,
    Silu,
    Square,
    Recip,
    Sign,
    Floor,
    Ceil,
    Round,
    /// `x * mul + add`.
    Affine {
        mul: f64,
        add: f64,
    },
    /// `x ^ exponent`.
    Powf(f64),
    /// `min(max(x, min), max)`; either bound may be infinite.
    Clamp {
        min: f64,
        max: f64,
    },
}

impl UnaryOp {
    pub fn name(&self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Silu => "silu",
            UnaryOp::Square => "square",
            UnaryOp::Recip => "reciprocal",
            UnaryOp::Sign => "sign",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Affine { .. } => "affine",
            UnaryOp::Powf(_) => "pow",
            UnaryOp::Clamp { .. } => "clamp",
        }
    }

    /// Ops that also make sense on integer tensors (computed exactly, without floats).
    pub fn works_on_integers(&self) -> bool {
        matches!(
            self,
            UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Relu
                | UnaryOp::Square
                | UnaryOp::Sign
                | UnaryOp::Affine { .. }
                | UnaryOp::Clamp { .. }
        )
    }
}

impl Tensor {
    /// Applies `op` elementwise.
    pub fn unary(&self, op: UnaryOp) -> Tensor {
        let dtype = self.dtype();
        assert!(dtype != crate::DType::Bool, "{}: not defined for bool tensors", op.name());
        assert!(
            dtype.is_float() || op.works_on_integers(),
            "{}: not defined for integer tensors (dtype {dtype}); convert with .to_dtype(DType::F32)",
            op.name()
        );
        if let Some(m) = MemoryOrder::of(self.dims(), &[self]) {
            return m.leave(m.enter(self).unary(op));
        }
        let storage = match &*self.storage() {
            Storage::Cpu(s) => Storage::Cpu(cpu::unary(s, self.layout(), op)),
            Storage::Cuda(s) => Storage::Cuda(cuda::unary(s, self.layout(), op)),
        };
        Tensor::from_storage(storage, self.dims())
    }

    pub fn neg(&self) -> Tensor {
        self.unary(UnaryOp::Neg)
    }
    pub fn abs(&self) -> Tensor {
        self.unary(UnaryOp::Abs)
    }
    pub fn exp(&self) -> Tensor {
        self.unary(UnaryOp::Exp)
    }
    pub fn log(&self) -> Tensor {
        self.unary(UnaryOp::Log)
    }
    pub fn log1p(&self) -> Tensor {
        self.unary(UnaryOp::Log1p)
    }
    pub fn sqrt(&self) -> Tensor {
        self.unary(UnaryOp::Sqrt)
    }
    pub fn rsqrt(&self) -> Tensor {
        self.unary(UnaryOp::Rsqrt)
    }
    pub fn sin(&self) -> Tensor {
        self.unary(UnaryOp::Sin)
    }
    pub fn cos(&self) -> Tensor {
        self.unary(UnaryOp::Cos)
    }
    pub fn tanh(&self) -> Tensor {
        self.unary(UnaryOp::Tanh)
    }
    pub fn sigmoid(&self) -> Tensor {
        self.unary(UnaryOp::Sigmoid)
    }
    pub fn relu(&self) -> Tensor {
        self.unary(UnaryOp::Relu)
    }
    /// Exact GELU (erf form), PyTorch's default.
    pub fn gelu(&self) -> Tensor {
        self.unary(UnaryOp::Gelu)
    }
    /// GELU's tanh approximation, as GPT-2 uses (`gelu_new` in transformers).
    pub fn gelu_tanh(&self) -> Tensor {
        self.unary(UnaryOp::GeluTanh)
    }
    pub fn silu(&self) -> Tensor {
        self.unary(UnaryOp::Silu)
    }
    pub fn square(&self) -> Tensor {
        self.unary(UnaryOp::Square)
    }
    pub fn recip(&self) -> Tensor {
        self.unary(UnaryOp::Recip)
    }
    pub fn sign(&self) -> Tensor {
        self.unary(UnaryOp::Sign)
    }
    pub fn floor(&self) -> Tensor {
        self.unary(UnaryOp::Floor)
    }
    pub fn ceil(&self) -> Tensor {
        self.unary(UnaryOp::Ceil)
    }
    /// Rounds half to even, as `torch.round`.
    pub fn round(&self) -> Tensor {
        self.unary(UnaryOp::Round)
    }
    /// `self * mul + add` in one pass.
    pub fn affine(&self, mul: f64, add: f64) -> Tensor {
        self.unary(UnaryOp::Affine { mul, add })
    }
    pub fn add_scalar(&self, v: f64) -> Tensor {
        self.affine(1.0, v)
    }
    pub fn mul_scalar(&self, v: f64) -> Tensor {
        self.affine(v, 0.0)
    }
    /// `self ^ exponent` with a scalar exponent (`torch.pow(t, 2.0)`).
    pub fn powf(&self, exponent: f64) -> Tensor {
        self.unary(UnaryOp::Powf(exponent))
    }
    /// Clamps into `[min, max]` (`torch.clamp`); pass `f64::NEG_INFINITY`/`INFINITY` for one side.
    pub fn clamp(&self, min: f64, max: f64) -> Tensor {
        assert!(min <= max || min.is_nan() || max.is_nan(), "clamp: min {min} is greater than max {max}");
        self.unary(UnaryOp::Clamp { min, max })
    }
}
