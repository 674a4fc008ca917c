//! The FabricProfiles decisions are made against, as one versioned set.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use railguard_api::FabricProfile;

use crate::decision::TopologyInterner;

/// The valid FabricProfiles, as handlers and the node cache read them.
#[derive(Debug, Default)]
pub struct ProfileSet {
    /// Bumped on every profile change; node prechecks carry the generation they were made for.
    pub generation: u64,
    /// Sorted by name.
    pub profiles: Vec<FabricProfile>,
    /// Each profile's own rail-layout signature (what the webhook writes on pods), same order.
    pub signatures: Vec<String>,
    /// Topology label values as ids, for every key a decision may score on (the extender's
    /// defaults, then each profile's own): nodes are interned once, when they are cached
    /// for this set, so the node index copies ids instead of reading labels. Ids of values
    /// no node has any more stay until the next profile change makes a new set; topology
    /// values are rack and spine names, a bounded set.
    topology: Mutex<TopologyInterner>,
    topology_keys: Vec<String>,
}

impl ProfileSet {
    /// The set of `profiles`, interning the topology keys `default_keys` and each profile's own.
    pub fn new(generation: u64, mut profiles: Vec<FabricProfile>, default_keys: &[String]) -> Self {
        profiles.sort_by(|a, b| a.name().cmp(b.name()));
        let signatures = profiles.iter().map(|p| p.spec.signature()).collect();
        let mut keys = default_keys.to_vec();
        for key in profiles.iter().flat_map(|p| &p.spec.topology_keys) {
            if !keys.contains(key) {
                keys.push(key.clone());
            }
        }
        ProfileSet {
            generation,
            profiles,
            signatures,
            topology: Mutex::new(TopologyInterner::new(keys.clone())),
            topology_keys: keys,
        }
    }

    /// The keys behind every id slice [`ProfileSet::intern_topology`] writes.
    pub fn topology_keys(&self) -> &[String] {
        &self.topology_keys
    }

    /// A node's topology ids, one per [`ProfileSet::topology_keys`] (`None`: label absent).
    pub fn intern_topology(&self, labels: &BTreeMap<String, String>) -> Vec<Option<u32>> {
        let mut ids = Vec::with_capacity(self.topology_keys.len());
        self.topology
            .lock()
            // Interning is one insert per new value: a panic elsewhere leaves it whole.
            .unwrap_or_else(PoisonError::into_inner)
            .intern_into(labels, &mut ids);
        ids
    }

    /// Position of `profile` when `signature` is its own; prechecks exist only for those.
    pub fn index_of(&self, profile: &str, signature: &str) -> Option<usize> {
        self.profiles
            .iter()
            .zip(&self.signatures)
            .position(|(p, s)| p.name() == profile && s == signature)
    }
}
