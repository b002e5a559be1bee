//! Parsing of `--device` values (shared by the real backend and the stub).

use crate::error::{ElmError, Result};

/// Where a model runs, as given by `--device cpu | cuda | cuda:N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    /// CUDA device ordinal.
    Cuda(usize),
}

impl std::str::FromStr for DeviceSpec {
    type Err = ElmError;

    /// `cpu`, `cuda` (= `cuda:0`) or `cuda:N`; anything else is a typed `Config` error on `device`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            ElmError::config(
                "device",
                format!("`{s}` is not one of cpu, cuda, cuda:N (N = device ordinal)"),
            )
        };
        match s.trim() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            other => {
                let n = other.strip_prefix("cuda:").ok_or_else(bad)?;
                n.parse::<usize>().map(DeviceSpec::Cuda).map_err(|_| bad())
            }
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}
