//! railguard's mutating admission webhook.
//!
//! The decision is the pure [`mutate()`]: a Pod, its namespace and the FabricProfiles in, a
//! [`Plan`] (typed JSON-patch operations, warnings, the list of mutations and an optional
//! denial) out. Everything else — AdmissionReview decoding, the axum/rustls server, the
//! certificate reloader and the reflector caches — only adapts data around it.
#![forbid(unsafe_code)]

pub mod catalog;
pub mod cert_sync;
pub mod certs;
pub mod config;
pub mod decisions;
pub mod error;
pub mod json_text;
pub mod metrics;
pub mod mutate;
pub mod namespace_lookup;
pub mod networks;
pub mod node_guard;
pub mod patch;
pub mod review;
pub mod runbook;
pub mod selection;
pub mod server;
pub mod tls;

pub use config::{
    FailureMode, NamespaceInfo, WebhookConfig, DEFAULT_NCCL_CONFIG_PATH, DEFAULT_NCCL_PLUGIN_PATH,
};
pub use error::{
    CertError, CertSpecError, CertSyncError, DecodeError, MutateError, NetworksError, TlsError,
};
pub use mutate::{mutate, Mutation, Outcome, Plan, Warning, WarningKind};
pub use patch::PatchOp;
