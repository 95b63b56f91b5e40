//! Automatic mixed precision, as `torch.autocast`: inside [`autocast`], matrix products and
//! convolutions run in a 16-bit dtype (their f32 inputs, parameters included, are cast on the
//! way in, by differentiable casts, so gradients reach the f32 master weights in f32; a
//! parameter's cast is kept while it is unchanged, as PyTorch's autocast weight cache), while
//! softmax, log-softmax, the norms and the losses run in f32 (their 16-bit inputs are widened).
//! Everything else runs in whatever dtype its inputs have; mixed float inputs of elementwise
//! ops are promoted to the wider type, as PyTorch does.
//!
//! The state is per thread, like `no_grad`; backward runs outside it and keeps each op's dtypes.

use crate::Var;
use oxtrain_tensor::DType;
use std::cell::Cell;

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// The 16-bit dtype of the autocast region this thread is in, if any.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(Cell::get)
}

fn with_state<R>(state: Option<DType>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            AUTOCAST.with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(AUTOCAST.with(|a| a.replace(state)));
    f()
}

/// Runs `f` in an autocast region of `dtype` (bf16 or f16), as
/// `with torch.autocast(device_type, dtype=dtype):`. Nests; restores the previous state even
/// when `f` panics. Same behaviour on every device.
pub fn autocast<R>(dtype: DType, f: impl FnOnce() -> R) -> R {
    assert!(
        matches!(dtype, DType::BF16 | DType::F16),
        "autocast: the low-precision dtype must be bf16 or f16, got {dtype}"
    );
    with_state(Some(dtype), f)
}

/// Runs `f` with autocast off, as `torch.autocast(..., enabled=False)` inside a region.
pub fn autocast_disabled<R>(f: impl FnOnce() -> R) -> R {
    with_state(None, f)
}

/// The wider of two float dtypes (f64 > f32 > the 16-bit types; bf16 with f16 gives f32), as
/// PyTorch's type promotion.
pub(crate) fn promoted(a: DType, b: DType) -> DType {
    let rank = |d: DType| match d {
        DType::F64 => 3,
        DType::F32 => 2,
        _ => 1,
    };
    match rank(a).cmp(&rank(b)) {
        std::cmp::Ordering::Greater => a,
        std::cmp::Ordering::Less => b,
        std::cmp::Ordering::Equal if a == b => a,
        std::cmp::Ordering::Equal => DType::F32,
    }
}

impl Var {
    /// In an autocast region, an f32 value cast to the region's 16-bit dtype (differentiably);
    /// otherwise, or for any other dtype, the value itself. A parameter (or a view of one) is
    /// lowered through the casts its storage keeps, so its 16-bit copy is made once per change
    /// (a fused optimizer step rewrites it with the weight) instead of at every use.
    pub fn autocast_lower(&self) -> Var {
        match autocast_dtype() {
            Some(low) if self.dtype() == DType::F32 => self.to_dtype_cached(low),
            _ => self.clone(),
        }
    }

    /// In an autocast region, a 16-bit float value widened to f32; otherwise the value itself.
    pub fn autocast_f32(&self) -> Var {
        match autocast_dtype() {
            Some(_) if matches!(self.dtype(), DType::BF16 | DType::F16) => self.to_dtype(DType::F32),
            _ => self.clone(),
        }
    }

    /// Both values in their promoted dtype when they are floats of different dtypes.
    pub(crate) fn promote_pair(&self, rhs: &Var) -> (Var, Var) {
        let (a, b) = (self.dtype(), rhs.dtype());
        if a == b || !a.is_float() || !b.is_float() {
            return (self.clone(), rhs.clone());
        }
        let to = promoted(a, b);
        (self.to_dtype(to), rhs.to_dtype(to))
    }
}
