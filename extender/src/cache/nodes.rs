//! A cached Node: its fabric state and its prechecks for every profile of a set.

use std::sync::Arc;

use railguard_api::NodeFabric;

use crate::cache::ProfileSet;
use crate::decision::{precheck, Precheck};

/// A cached Node: its fabric state and its verdict for every profile, computed when the node
/// or the profiles change so that a filter call only compares expiry times.
#[derive(Clone, Debug)]
pub struct CachedNode {
    pub fabric: Arc<NodeFabric>,
    /// Generation of the [`ProfileSet`] `prechecks` were made for.
    pub generation: u64,
    /// One per profile of that set, in its order, each for the profile's own signature.
    pub prechecks: Vec<Precheck>,
    /// The node's topology ids in that set ([`ProfileSet::intern_topology`]).
    pub topology: Vec<Option<u32>>,
}

impl CachedNode {
    pub fn new(fabric: Arc<NodeFabric>, profiles: &ProfileSet) -> Self {
        let prechecks = profiles
            .profiles
            .iter()
            .zip(&profiles.signatures)
            .map(|(p, s)| precheck(&fabric, p, s))
            .collect();
        let topology = profiles.intern_topology(&fabric.labels);
        CachedNode {
            fabric,
            generation: profiles.generation,
            prechecks,
            topology,
        }
    }

    /// The precheck for profile `index` of `profiles`, unless it was made for another set.
    pub fn precheck(&self, profiles: &ProfileSet, index: usize) -> Option<&Precheck> {
        if self.generation == profiles.generation {
            self.prechecks.get(index)
        } else {
            None
        }
    }
}
