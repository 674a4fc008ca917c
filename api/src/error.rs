//! Errors of the api crate.

/// One problem found by [`crate::profile::FabricProfileSpec::validate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldProblem {
    /// Path of the offending field, e.g. `spec.rails[2].rateGbps`.
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A FabricProfile failed validation or could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("invalid FabricProfile: {}", join_problems(.problems))]
    Invalid { problems: Vec<FieldProblem> },
    #[error("cannot parse FabricProfile YAML")]
    Yaml {
        #[source]
        source: serde_yaml_ng::Error,
    },
}

impl ProfileError {
    /// The field paths named by the problems, for callers that want to assert on them.
    pub fn fields(&self) -> Vec<&str> {
        match self {
            ProfileError::Invalid { problems } => {
                problems.iter().map(|p| p.field.as_str()).collect()
            }
            ProfileError::Yaml { .. } => Vec::new(),
        }
    }
}

fn join_problems(problems: &[FieldProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A certificate annotation could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("certificate is empty")]
    Empty,
    #[error("certificate is {bytes} bytes, over the 256 KiB limit")]
    TooLarge { bytes: usize },
    #[error("certificate has no numeric version field")]
    MissingVersion,
    #[error("certificate version {version} is not supported by this railguard (max 1)")]
    UnsupportedVersion { version: u64 },
    #[error("certificate JSON is malformed")]
    Json {
        #[source]
        source: serde_json::Error,
    },
}

/// A resource quantity could not be parsed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantity is empty")]
    Empty,
    #[error("quantity {0:?} is negative")]
    Negative(String),
    #[error("quantity {0:?} is not a Kubernetes quantity (e.g. 64Gi, 512M)")]
    Malformed(String),
}

/// `outer: inner: innermost` on one line, the way every railguard component prints an error
/// with its causes. A source whose text the message before it already contains (errors that
/// format their source into their own message) is skipped.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let one_line = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut s = one_line(&e.to_string());
    let mut cur = e.source();
    while let Some(inner) = cur {
        let text = one_line(&inner.to_string());
        if !text.is_empty() && !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = inner.source();
    }
    s
}

/// A `railguard.io/crd-version` annotation that is not a `MAJOR.MINOR.PATCH` version.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("crd version annotation {value:?} is not MAJOR.MINOR.PATCH[-pre]: remove or correct it")]
pub struct CrdVersionError {
    pub value: String,
}
