//! GPU memory through the CUDA driver API and collectives through NCCL, both loaded at run
//! time.
//!
//! railguard's RDMA engine allocates its benchmark buffers here when a rail is tested from GPU
//! memory (GPUDirect RDMA): [`CudaDriver::load`] opens `libcuda.so.1` (or the library at a
//! given path: a test double built by the tests is loaded by this same code), [`Device`]
//! names a GPU by PCI bus id so CUDA's ordinal order never decides which GPU is tested, and
//! [`DeviceBuffer`] is an allocation that can be filled, copied and exported as a DMA-BUF file
//! descriptor for `ibv_reg_dmabuf_mr`.
//!
//! Why a minimal FFI over `libloading` rather than `cudarc`: railguard needs fifteen driver
//! calls, must load a library from an explicit path (the test double), must report a missing
//! or broken driver as a value (CPU-only nodes run the same binary), and must stay small
//! enough to audit, since this is one of the crate's two `unsafe` modules (see [`driver`]).
//! There is no link-time CUDA dependency.
//!
//! [`Nccl`] does the same for `libnccl.so.2`: a unique id made by rank 0, a communicator per
//! rank ([`Nccl::init_rank`]) and a timed, checked all-reduce sweep
//! ([`Communicator::all_reduce_sweep`]) whose bandwidths follow nccl-tests ([`collective`]).

pub mod collective;
pub mod doubles;
mod driver;
mod error;
mod nccl;

pub use driver::{CudaDriver, Device, DeviceBuffer, Event, Stream, DEFAULT_LIBRARY};
pub use error::{CudaError, NcclError};
pub use nccl::{
    bundled_nccl_library, Communicator, Nccl, UniqueId, BUNDLED_NCCL_LIBRARY, DEFAULT_NCCL_LIBRARY,
    UNIQUE_ID_BYTES,
};
