//! Multi-node rail campaigns: pairwise RDMA tests between nodes of a profile, rail by rail,
//! that say which node, rail or link is at fault without testing all N² pairs.
//!
//! - [`plan`]: the pure planner and localization rules (no IO);
//! - [`wire`]: the coordinator's authenticated control channel to a peer endpoint;
//! - [`endpoint`]: the peer endpoint a prober runs (control channel + RDMA side channel);
//! - [`coordinator`]: runs a plan against endpoints and judges each rail;
//! - the findings merge lives in [`railguard_api::campaign_findings`];
//! - [`kube`]: the thin Kubernetes shell (nodes, endpoints, server-side apply, Lease);
//! - [`nccl_pair`]: the endpoint's half of an NCCL pair test (this node's ranks in a child
//!   process, the unique id sent to the peer over the control channel);
//! - [`mpijob`]: the 2-node nccl-tests MPIJob manifest from a template;
//! - [`summary`]: whether a report found a fault, and its text summary;
//! - [`token`]: the shared token of coordinator and endpoints;
//! - [`identity`]: who speaks on the control channel (node identity by TokenReview).

pub mod coordinator;
pub mod endpoint;
pub mod identity;
pub mod kube;
pub mod mpijob;
pub mod nccl_pair;
pub mod plan;
pub mod summary;
pub mod token;
pub mod wire;

use railguard_prober::rdma::RdmaError;

/// Everything a campaign can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CampaignError {
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error("cannot reach endpoint {peer}")]
    Unreachable {
        peer: String,
        #[source]
        source: std::io::Error,
    },
    #[error("control channel to {peer} failed")]
    Io {
        peer: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{peer} closed the control channel")]
    Closed { peer: String },
    #[error("{peer} violated the control protocol: {reason}")]
    Protocol { peer: String, reason: String },
    #[error("authentication with {peer} failed: {reason}")]
    Auth { peer: String, reason: String },
    #[error("{peer} refused: {reason}")]
    Refused { peer: String, reason: String },
    #[error("{peer} did not answer within {after_ms} ms")]
    Timeout { peer: String, after_ms: u64 },
    #[error("cannot read the shared token from {path}")]
    TokenRead {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid shared token: {reason}")]
    Token { reason: String },
    #[error(transparent)]
    Rdma(#[from] RdmaError),
    #[error("kubernetes {what} failed")]
    Kube {
        what: String,
        #[source]
        source: ::kube::Error,
    },
    #[error("profile {profile}: {reason}")]
    Profile { profile: String, reason: String },
    #[error("node {node}: {reason}")]
    Node { node: String, reason: String },
    #[error("certificate of node {node} is unreadable")]
    Certificate {
        node: String,
        #[source]
        source: railguard_api::CertificateError,
    },
    #[error("workload template: {reason}")]
    Template { reason: String },
    #[error("endpoint of node {node} failed the identity check: {reason}")]
    Identity { node: String, reason: String },
    #[error("no longer the leader of lease {lease}: {reason}; nothing more is written")]
    LeaseLost { lease: String, reason: String },
}

/// Default TCP port of the peer endpoint.
pub const DEFAULT_PEER_PORT: u16 = 7470;
