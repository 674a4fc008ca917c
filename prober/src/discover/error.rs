//! Errors of discovery.

/// Discovery could not read the node at all. Problems with single files are findings
/// (severity, evidence), not errors.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("sysfs root {path} does not exist or is not a directory")]
    NoRoot { path: String },
    #[error("no PCI device directory at {path}: is this a sysfs root?")]
    NoPciTree {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no RDMA device {hca} under {path}")]
    NoSuchHca { hca: String, path: String },
    #[error("RDMA device {hca} has no port {port}")]
    NoSuchPort { hca: String, port: u32 },
    /// A file holds something discovery does not understand (the message names the file,
    /// what was expected and the content).
    #[error("{message}")]
    Junk { message: String },
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
}
