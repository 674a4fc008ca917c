//! `railguard-webhook`'s shell: the command line ([`Cli`]) and how it becomes the library's
//! configuration ([`settings`]). The binary (`src/main.rs`) adds the runtime, the signal and
//! the wiring. A library as well, so the chart's contract test parses the Deployment's
//! arguments with the binary's own definition.
#![forbid(unsafe_code)]

pub mod args;
pub mod catalog;
pub mod cert_sync;
pub mod certs;
pub mod error;
pub mod metrics;
pub mod namespace_lookup;
pub mod node_guard_cache;
pub mod server;
pub mod settings;
pub mod tls;

pub use args::{Cli, FailureMode, EXAMPLES};
pub use error::{CertError, CertSpecError, CertSyncError, TlsError};
