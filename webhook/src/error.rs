//! Errors of the webhook library.

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
