//! The plumbing every railguard binary repeats, in one place: logging set-up
//! ([`init_logging`], one `--log-format` for all), start-up failures that print as one line
//! naming the thing and the fix ([`StartupError`], [`error_line`]), listeners bound with
//! that error ([`bind`]), FabricProfiles from a file ([`read_profiles`]), the shutdown
//! signal ([`shutdown_signal`]), hardened serving ([`serve`], [`limit_requests`]) and TLS
//! files reloaded as they change ([`TlsReloader`]). Nothing here talks to the API server:
//! that is `railguard-kube`'s (`kube/`).
//!
//! Exit codes shared by the binaries: [`EXIT_FAIL`] for a failed verdict (prober only),
//! [`EXIT_ERROR`] for usage, configuration and runtime errors (clap's own usage errors
//! exit 2 as well).

mod error;
mod files;
mod listen;
mod logging;
mod profiles;
mod serve;
mod signal;
mod tls;
mod tls_reload;

pub use error::{describe_io, error_chain, error_line, StartupError};
pub use files::write_atomic;
pub use listen::{bind, logged_listen_addr};
pub use logging::{
    filter_directives, init_logging, init_logging_with, use_ansi, LogFormat, LOG_FILTER_VARS,
};
pub use profiles::read_profiles;
pub use serve::{
    limit_requests, serve, spawn_serve, RequestLimits, ServeArgs, ServeLimits, Served,
    TlsConfigSource, ADMISSION_WAIT,
};
pub use signal::shutdown_signal;
pub use tls::{server_tls, TlsFiles};
pub use tls_reload::{ReloadEvent, TlsReloader};

/// Exit code of a failed verdict or a critical finding.
pub const EXIT_FAIL: u8 = 1;
/// Exit code of a usage, configuration or runtime error.
pub const EXIT_ERROR: u8 = 2;
