//! railguard prober: reads a node's GPU/RDMA fabric (discovery), benchmarks and certifies it,
//! and publishes the result on the Node object.

pub mod analyze;
pub mod campaign;
pub mod certify;
pub mod cli;
pub mod daemon;
pub mod discover;
pub mod nccl;
pub mod preflight;
pub mod progress;
pub mod publish;
pub mod rdma;
pub mod sim;
pub mod topo;
