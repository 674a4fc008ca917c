//! Errors of the extender library.

use std::fmt;

/// Why a scheduler request got no decision. The handlers answer each with the error's chain
/// (`railguard_api::error::error_chain`) and map every variant to a status and a metric reason
/// (in the server's HTTP part).
#[derive(Debug, thiserror::Error)]
pub enum ExtenderError {
    #[error("ExtenderArgs is larger than the limit of {max} bytes (--max-body-bytes)")]
    BodyTooLarge { max: usize },
    #[error("cannot read the request body: {detail}")]
    Body { detail: String },
    #[error("ExtenderArgs is not valid JSON")]
    Json {
        #[source]
        source: serde_json::Error,
    },
    #[error("ExtenderArgs has no Pod")]
    MissingPod,
    #[error("ExtenderArgs.Pod is not a valid Pod")]
    PodJson {
        #[source]
        source: serde_json::Error,
    },
    #[error("ExtenderArgs has neither Nodes nor NodeNames")]
    NoNodes,
    #[error("ExtenderArgs has both Nodes and NodeNames; a scheduler sends exactly one (nodeCacheCapable decides which)")]
    BothNodeForms,
    #[error("ExtenderArgs lists {count} nodes, more than the limit of {max} (--max-nodes)")]
    TooManyNodes { count: usize, max: usize },
    #[error("ExtenderArgs.Nodes.items[{index}] is not a valid Node")]
    NodeJson {
        index: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("ExtenderArgs.Nodes.items[{index}] has no metadata.name")]
    NodeWithoutName { index: usize },
    #[error("ExtenderArgs carries NodeNames but this extender runs --standalone without a node cache; configure the extender with nodeCacheCapable: false")]
    NamesWithoutCache,
    #[error("extender caches are not synced yet ({0}); failing closed")]
    NotSynced(Unsynced),
}

/// The caches that have not finished their first list, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsynced(pub Vec<&'static str>);

impl fmt::Display for Unsynced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}
