//! railguard prober: reads a node's GPU/RDMA fabric (discovery), benchmarks and certifies it,
//! and publishes the result on the Node object.

pub mod campaign;
pub mod discover;
pub mod rdma;
pub mod sim;
pub mod topo;
