//! railguard-extender's shell: the command line ([`Cli`]) and how it becomes the library's
//! configuration. `main.rs` starts the runtime, the caches and the servers.
//!
//! A library as well as the binary, so the chart's contract test parses the Deployment's
//! arguments with the binary's own definition.

mod args;
pub mod cache;
pub mod metrics;
pub mod server;
pub mod tls_bootstrap;
pub mod tls_material;

pub use args::{Cli, Command, EXAMPLES};
