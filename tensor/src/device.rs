//! Where a tensor lives.

use crate::{Error, Result};

/// A compute device, as `torch.device`: the host, or a CUDA GPU by ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda(usize),
}

impl Device {
    /// `Device::Cuda(ordinal)` when a CUDA GPU with that ordinal can be used, else `Device::Cpu`.
    pub fn cuda_if_available(ordinal: usize) -> Device {
        if crate::cuda::is_available(ordinal) {
            Device::Cuda(ordinal)
        } else {
            Device::Cpu
        }
    }

    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu)
    }

    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    /// Errors, saying why, unless tensors can be made on this device.
    pub fn check_available(&self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            Device::Cuda(ordinal) => crate::cuda::device(*ordinal).map(|_| ()),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = Error;
    /// Parses PyTorch's spellings: `cpu`, `cuda`, `cuda:1`.
    fn from_str(s: &str) -> Result<Device> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s.strip_prefix("cuda:").and_then(|n| n.parse().ok()).map(Device::Cuda).ok_or_else(|| {
                Error::Msg(format!("unknown device `{s}`: expected `cpu`, `cuda` or `cuda:N`"))
            }),
        }
    }
}
