//! Errors of the webhook's shell: TLS pairs, the self-managed certificates and their sync.

use std::path::PathBuf;

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
