//! railguard's mutating admission webhook.
//!
//! The decision is the pure [`mutate()`]: a Pod, its namespace and the FabricProfiles in, a
//! [`Plan`] (typed JSON-patch operations, warnings, the list of mutations and an optional
//! denial) out. Everything else — AdmissionReview decoding, the axum/rustls server, the
//! certificate reloader and the reflector caches — only adapts data around it.
#![forbid(unsafe_code)]

pub mod config;
pub mod decisions;
pub mod error;
pub mod json_text;
pub mod mutate;
pub mod networks;
pub mod node_guard;
pub mod patch;
pub mod review;
pub mod runbook;
pub mod selection;

pub use config::{
    FailureMode, NamespaceInfo, ProfileSet, WebhookConfig, DEFAULT_NCCL_CONFIG_PATH,
    DEFAULT_NCCL_PLUGIN_PATH,
};
pub use error::{DecodeError, MutateError, NetworksError};
pub use mutate::{mutate, Mutation, Outcome, Plan, Warning, WarningKind};
pub use patch::PatchOp;
