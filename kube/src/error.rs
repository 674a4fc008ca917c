//! The errors of railguard's Kubernetes layer, one enum or struct per conversation.

use std::error::Error;

/// A certificate or key could not be generated ([`crate::pki`]).
#[derive(Debug, thiserror::Error)]
#[error("cannot generate {what}")]
pub struct PkiError {
    pub what: &'static str,
    #[source]
    pub source: rcgen::Error,
}

impl PkiError {
    pub(crate) fn generate(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
        move |source| PkiError { what, source }
    }
}

/// A Secret could not be filled ([`crate::secret_fill`]).
#[derive(Debug, thiserror::Error)]
pub enum SecretFillError {
    #[error("cannot {action} Secret {namespace}/{name}")]
    Api {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("cannot generate the keys of Secret {namespace}/{name}")]
    Generate {
        namespace: String,
        name: String,
        #[source]
        source: Box<dyn Error + Send + Sync>,
    },
    /// The generator did not produce every key the Secret must hold (a bug).
    #[error("the generated data of Secret {namespace}/{name} lacks {missing:?}")]
    Incomplete {
        namespace: String,
        name: String,
        missing: Vec<String>,
    },
    #[error("Secret {namespace}/{name} kept changing while it was being filled; giving up after {rounds} rounds")]
    Contended {
        namespace: String,
        name: String,
        rounds: usize,
    },
}
