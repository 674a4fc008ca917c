//! Errors of the webhook library.

use std::path::PathBuf;

/// The pod could not be turned into a patch (an internal error: the failure mode decides).
#[derive(Debug, thiserror::Error)]
pub enum MutateError {
    #[error("pod has no spec")]
    NoSpec,
    #[error("cannot serialize {what} for the patch")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A `delivery: Plugin` path of the configuration has no directory to mount (the CLI
    /// refuses such flags; the core does not mount `/` or a relative path either way).
    #[error("{what} {path:?} is not an absolute file path below a directory")]
    NcclPath { what: &'static str, path: String },
}

/// The request body is not an `admission.k8s.io/v1` AdmissionReview (answered with HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("request body is empty; expected an admission.k8s.io/v1 AdmissionReview")]
    Empty,
    #[error("request body is not an AdmissionReview JSON object")]
    Json {
        #[source]
        source: serde_json::Error,
    },
    #[error("apiVersion is {found:?}; expected \"admission.k8s.io/v1\"")]
    ApiVersion { found: String },
    #[error("kind is {found:?}; expected \"AdmissionReview\"")]
    Kind { found: String },
    #[error("AdmissionReview has no request")]
    NoRequest,
    #[error("AdmissionReview request has no uid")]
    NoUid,
}

/// A certificate/key pair could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key")]
    NoKey { path: PathBuf },
    #[error("cannot parse PEM in {path}")]
    Pem {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate and key are not a usable pair")]
    Pair {
        #[source]
        source: rustls::Error,
    },
}

/// Self-managed certificates could not be specified or issued.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("invalid self-signed certificate settings: {0}")]
    Spec(CertSpecError),
    #[error("cannot generate a certificate")]
    Generate {
        #[source]
        source: railguard_kube::PkiError,
    },
}

/// What is wrong with the self-signed certificate settings.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CertSpecError {
    #[error("service name is empty")]
    EmptyService,
    #[error("namespace is empty")]
    EmptyNamespace,
    #[error("certificate validity must be at least 1 day")]
    NoValidity,
    #[error(
        "rotate-before ({rotate_before_days} days) must be shorter than the validity \
         ({validity_days} days), or every certificate would be renewed at once"
    )]
    RotateBeforeTooLong {
        rotate_before_days: u32,
        validity_days: u32,
    },
}

/// The Multus networks annotation, or a network the profile names, is not usable.
#[derive(Debug, thiserror::Error)]
pub enum NetworksError {
    #[error("network {text:?} has an empty interface")]
    EmptyInterface { text: String },
    #[error("network {text:?} has an empty namespace")]
    EmptyNamespace { text: String },
    #[error("network {text:?} has no valid name")]
    NoName { text: String },
    #[error("JSON network list does not parse")]
    Json {
        #[source]
        source: serde_json::Error,
    },
    #[error("JSON network list has an entry without a name")]
    UnnamedEntry,
    #[error("cannot render network list")]
    Render {
        #[source]
        source: serde_json::Error,
    },
}

/// Keeping the Secret, the serving files and the caBundle in step failed.
#[derive(Debug, thiserror::Error)]
pub enum CertSyncError {
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error("cannot {action} secret {namespace}/{name}")]
    Secret {
        action: &'static str,
        namespace: String,
        name: String,
        // Boxed: kube::Error is large and this enum travels through every sync step.
        #[source]
        source: Box<kube::Error>,
    },
    #[error("secret {namespace}/{name} kept changing under concurrent writers")]
    Contended { namespace: String, name: String },
    #[error("cannot {action} {kind} {name}")]
    WebhookConfig {
        action: &'static str,
        /// `MutatingWebhookConfiguration` or `ValidatingWebhookConfiguration`.
        kind: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
