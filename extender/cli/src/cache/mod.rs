//! The extender's cluster state and the watches that keep it current: the shell's side of
//! `railguard_extender::cache` (the pure stores and indexes it holds).

mod cluster;
mod watch;

pub use cluster::ClusterState;
