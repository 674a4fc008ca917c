//! Errors of the extender library.

/// Everything that can go wrong answering the scheduler or serving.
#[derive(Debug, thiserror::Error)]
pub enum ExtenderError {
    #[error("ExtenderArgs is not valid JSON: {source}")]
    Json {
        #[source]
        source: serde_json::Error,
    },
    #[error("ExtenderArgs has no Pod")]
    MissingPod,
    #[error("ExtenderArgs.Pod is not a valid Pod: {source}")]
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
    #[error("ExtenderArgs.Nodes.items[{index}] is not a valid Node: {source}")]
    NodeJson {
        index: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("ExtenderArgs.Nodes.items[{index}] has no metadata.name")]
    NodeWithoutName { index: usize },
    #[error("ExtenderArgs carries NodeNames but this extender runs --standalone without a node cache; configure the extender with nodeCacheCapable: false")]
    NamesWithoutCache,
    #[error("extender caches are not synced yet ({pending}); failing closed")]
    NotSynced { pending: String },
    #[error("cannot encode the extender response: {source}")]
    Encode {
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot read {what} {path}: {source}")]
    ReadFile {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid FabricProfiles in {path}: {source}")]
    Profiles {
        path: String,
        #[source]
        source: railguard_api::ProfileError,
    },
    #[error("cannot load TLS certificate {cert} and key {key}: {source}")]
    Tls {
        cert: String,
        key: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot serve on {addr}: {source}")]
    Serve {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}
