//! The HTTP shell around the decisions: `POST /filter` and `POST /prioritize` on the
//! extender port (TLS optional), `/healthz`, `/readyz` and `/metrics` on a plain port.
//!
//! [`answer_filter`] and [`answer_prioritize`] decide a decoded request against the state
//! ([`AppState`]); the `http` part decodes bodies, maps errors to responses and serves.

mod answer;
mod http;

use std::sync::Arc;

use railguard_api::FabricProfile;

use crate::cache::{ClusterState, ProfileSet};
use crate::decision::ExtenderConfig;
use crate::error::Unsynced;
use crate::metrics::Metrics;

pub use answer::{answer_filter, answer_prioritize};
pub use http::{extender_router, health_router, serve_extender};

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
