//! railguard prober: reads a node's GPU/RDMA fabric (discovery), benchmarks and certifies it,
//! and publishes the result on the Node object. Typed operations with typed errors; the
//! command line, runtimes, serving and Kubernetes client wiring are the shell's
//! (`railguard-prober-cli`), simulation is `railguard-sim`'s.

pub mod analyze;
pub mod certify;
pub mod discover;
pub mod gpu_check;
pub mod nccl;
pub mod preflight;
pub mod progress;
pub mod publish;
pub mod rdma;
pub mod telemetry;
pub mod test_lock;
pub mod topo;
