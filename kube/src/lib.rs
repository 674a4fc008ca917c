//! railguard's Kubernetes layer: every conversation a component has with the API server
//! that is not a one-off of its shell lives here, in one copy. The client from
//! `--kubeconfig` ([`kube_client`]); leader and slot election on a Lease ([`lease`]); the
//! FabricProfile catalog's status and Events ([`ProfileStatusWriter`], [`log_profile_changes`]);
//! Secrets a component fills once ([`secret_fill`]) and the private PKIs they hold
//! ([`pki`]).
//!
//! Decisions stay pure and in `railguard-api` or the component libraries; this crate only
//! reads, writes and retries.

mod client;
mod error;
pub mod events;
pub mod lease;
pub mod node_writer;
pub mod pki;
mod profile_reports;
pub mod secret_fill;
pub mod store;
pub mod watch;

pub use client::kube_client;
pub use error::{PkiError, SecretFillError};
pub use profile_reports::{
    log_profile_changes, record_profile_changes, InvalidProfileGauge, ProfileLabels,
    ProfileStatusWriter, PROFILE_STATUS_MANAGER,
};
