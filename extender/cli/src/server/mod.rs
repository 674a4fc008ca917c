//! The HTTP shell around the decisions: `POST /filter` and `POST /prioritize` on the
//! extender port (TLS optional), `/healthz`, `/readyz` and `/metrics` on a plain port. The
//! binary serves both routers with `railguard_runtime::serve` and its limits.
//!
//! [`answer_filter`] and [`answer_prioritize`] decide a decoded request against the state
//! ([`AppState`]); the `http` part decodes bodies, maps errors to responses and serves.

mod answer;
mod http;

use std::sync::Arc;

use railguard_api::FabricProfile;

use crate::cache::ClusterState;
use crate::metrics::Metrics;
use railguard_extender::cache::ProfileSet;
use railguard_extender::decision::ExtenderConfig;
use railguard_extender::error::Unsynced;

pub use answer::{answer_filter, answer_prioritize};
pub use http::{extender_router, health_router};

/// Where node and profile state comes from.
#[derive(Debug)]
pub enum Source {
    /// No cluster: profiles from a file, nodes only as full objects in each request.
    Standalone { profiles: Arc<Vec<FabricProfile>> },
    /// Watches of the cluster.
    Cluster(Arc<ClusterState>),
}

/// Shared state of the handlers.
#[derive(Debug)]
pub struct AppState {
    pub source: Source,
    pub config: ExtenderConfig,
    /// Upper bound on candidate nodes per request.
    pub max_nodes: usize,
    pub metrics: Arc<Metrics>,
}

/// Default bound on candidates: above the largest clusters Kubernetes supports.
pub const DEFAULT_MAX_NODES: usize = 15_000;

/// Room for the Pod in a request body (the API server caps objects near 3 MiB; JSON escapes).
pub const POD_BODY_ALLOWANCE: usize = 6 << 20;
/// Room per candidate in a request body: a name is at most 253 bytes; a full Node of a
/// GPU node with its images and conditions is a few KiB (larger lists need the flag).
pub const NODE_BODY_ALLOWANCE: usize = 2 << 10;
/// No derived body limit goes above this.
pub const MAX_BODY_CEILING: usize = 256 << 20;

/// The body limit when `--max-body-bytes` is not given: the Pod plus `max_nodes` candidates,
/// capped at [`MAX_BODY_CEILING`]. With the defaults, about 35 MiB.
pub fn default_max_body_bytes(max_nodes: usize) -> usize {
    max_nodes
        .saturating_mul(NODE_BODY_ALLOWANCE)
        .saturating_add(POD_BODY_ALLOWANCE)
        .min(MAX_BODY_CEILING)
}

/// The profiles a request is decided against.
enum Profiles {
    Standalone(Arc<Vec<FabricProfile>>),
    Cluster(Arc<ProfileSet>),
}

impl Profiles {
    fn list(&self) -> &[FabricProfile] {
        match self {
            Profiles::Standalone(p) => p,
            Profiles::Cluster(set) => &set.profiles,
        }
    }
}

impl AppState {
    fn profiles(&self) -> Profiles {
        match &self.source {
            Source::Standalone { profiles } => Profiles::Standalone(profiles.clone()),
            Source::Cluster(c) => Profiles::Cluster(c.profile_set()),
        }
    }

    /// `Err` names the caches still listing.
    pub fn ready(&self) -> Result<(), Unsynced> {
        match &self.source {
            Source::Standalone { .. } => Ok(()),
            Source::Cluster(c) => {
                let pending = c.unsynced();
                if pending.is_empty() {
                    Ok(())
                } else {
                    Err(Unsynced(pending))
                }
            }
        }
    }
}
