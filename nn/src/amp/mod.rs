//! Mixed precision: [`GradScaler`] (dynamic loss scaling for f16 training).

mod grad_scaler;

pub use grad_scaler::{GradScaler, GradScalerConfig};
