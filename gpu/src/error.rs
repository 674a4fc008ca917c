//! Errors of the CUDA driver binding.

/// Why a CUDA operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The driver library could not be opened (no NVIDIA driver on this node, or a wrong path).
    #[error("cannot load the CUDA driver library {path}")]
    Load {
        path: String,
        #[source]
        source: libloading::Error,
    },
    /// The library lacks a driver API function (too old a driver, or not libcuda at all).
    #[error("the CUDA driver library {path} has no {symbol}")]
    Symbol {
        path: String,
        symbol: &'static str,
        #[source]
        source: libloading::Error,
    },
    /// A driver call returned an error code.
    #[error("{call} failed: {name} ({code})")]
    Call {
        call: &'static str,
        code: i32,
        name: String,
    },
    /// No GPU with this PCI bus id (or ordinal) is visible to CUDA.
    #[error("no CUDA device {selector}")]
    NoDevice { selector: String },
    /// A zero-byte allocation, or an argument CUDA would reject anyway.
    #[error("invalid argument: {reason}")]
    InvalidArgument { reason: String },
}

impl CudaError {
    /// The CUDA error code of a failed call, if this is one.
    pub fn code(&self) -> Option<i32> {
        match self {
            CudaError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Why an NCCL operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    /// NCCL is not installed where it was looked for.
    #[error("cannot load NCCL from {path}")]
    Load {
        path: String,
        #[source]
        source: libloading::Error,
    },
    #[error("the NCCL library {path} has no {symbol}")]
    Symbol {
        path: String,
        symbol: &'static str,
        #[source]
        source: libloading::Error,
    },
    /// An NCCL call failed; `message` is NCCL's own text (`unhandled system error`, ...).
    #[error("{call} failed: {message} ({code})")]
    Call {
        call: &'static str,
        code: i32,
        message: String,
    },
    /// The GPU side of a collective failed (allocation, copy, stream).
    #[error("GPU memory for the collective")]
    Cuda(#[from] CudaError),
    #[error("invalid argument: {reason}")]
    InvalidArgument { reason: String },
}
