//! The FabricProfiles decisions are made against, as one versioned set.

use railguard_api::FabricProfile;

/// The valid FabricProfiles, as handlers and the node cache read them.
#[derive(Debug, Default)]
pub struct ProfileSet {
    /// Bumped on every profile change; node prechecks carry the generation they were made for.
    pub generation: u64,
    /// Sorted by name.
    pub profiles: Vec<FabricProfile>,
    /// Each profile's own rail-layout signature (what the webhook writes on pods), same order.
    pub signatures: Vec<String>,
}

impl ProfileSet {
    pub fn new(generation: u64, mut profiles: Vec<FabricProfile>) -> Self {
        profiles.sort_by(|a, b| a.name().cmp(b.name()));
        let signatures = profiles.iter().map(|p| p.spec.signature()).collect();
        ProfileSet {
            generation,
            profiles,
            signatures,
        }
    }

    /// Position of `profile` when `signature` is its own; prechecks exist only for those.
    pub fn index_of(&self, profile: &str, signature: &str) -> Option<usize> {
        self.profiles
            .iter()
            .zip(&self.signatures)
            .position(|(p, s)| p.name() == profile && s == signature)
    }
}
