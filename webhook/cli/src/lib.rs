//! `railguard-webhook`'s shell: the command line ([`Cli`]) and how it becomes the library's
//! configuration ([`settings`]). The binary (`src/main.rs`) adds the runtime, the signal and
//! the wiring. A library as well, so the chart's contract test parses the Deployment's
//! arguments with the binary's own definition.
#![forbid(unsafe_code)]

pub mod args;
pub mod settings;

pub use args::{Cli, FailureMode, EXAMPLES};
