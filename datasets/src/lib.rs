#![doc = "oxtrain-datasets"]

pub mod decode;
pub mod error;
pub mod rng;
pub mod transforms;

pub use error::{Error, Result};
