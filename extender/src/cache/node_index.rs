//! The node cache laid out for the filter path ([`NodeIndex`]).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};
use railguard_api::NodeFabric;

use crate::cache::{CachedNode, ProfileSet};
use crate::decision::{NodeSlot, Precheck, TopologyInterner};

/// The node cache laid out for the filter path. A `/filter` call looks up thousands of names;
/// through the node map each lookup compares its key behind a heap pointer and then follows
/// `Arc<CachedNode>` and its precheck vector into a heap full of certificates, a cache miss
/// at every step. Here the names sit in one arena, the hash table holds slot numbers, and
/// each profile's prechecks are one contiguous array, so a lookup stays in a few hundred
/// kilobytes that the CPU caches hold.
///
/// Rebuilt whole after a node or profile change (cheap next to the watch event that caused
/// it). Handlers use it only while [`NodeIndex::is_current`] says it reflects the node cache
/// and the profile set they decide with; otherwise they read the node cache (same answers).
#[derive(Debug, Default)]
pub struct NodeIndex {
    /// [`Store::version`] of the node cache this index was built from.
    nodes_version: u64,
    /// [`ProfileSet::generation`] of the prechecks.
    generation: u64,
    /// Every node name, back to back.
    names: String,
    /// Slot `i`'s name is `names[ends[i - 1]..ends[i]]` (from 0 for slot 0).
    ends: Vec<u32>,
    /// Slot numbers, hashed by name.
    table: HashTable<u32>,
    /// foldhash instead of SipHash: node names come from the API server (the node watch) and
    /// from kube-scheduler (requests), both trusted, so flooding resistance buys nothing and
    /// SipHash would cost more than the rest of a lookup.
    hasher: DefaultHashBuilder,
    fabrics: Vec<Arc<NodeFabric>>,
    /// Whether the fleet controller marked slot `i` an outlier: scoring reads this instead of
    /// following each fabric.
    fleet_outliers: Vec<bool>,
    /// `prechecks[profile * len + slot]`; `None` where the node's prechecks were made for an
    /// older profile set (decisions then check its certificate instead).
    prechecks: Vec<Option<Precheck>>,
    /// The topology keys interned below: the extender's defaults and every profile's own.
    topology_keys: Vec<String>,
    /// `topology[slot * topology_keys.len() + k]`: the id of the slot's value for key `k`.
    topology: Vec<Option<u32>>,
}

impl NodeIndex {
    /// Indexes `nodes` (the node cache at `nodes_version`) for the profiles of `set`, with
    /// their values of `topology_keys` interned.
    pub fn build(
        nodes: &HashMap<String, Arc<CachedNode>>,
        nodes_version: u64,
        set: &ProfileSet,
        topology_keys: Vec<String>,
    ) -> Self {
        let len = nodes.len();
        let mut index = NodeIndex {
            nodes_version,
            generation: set.generation,
            names: String::with_capacity(nodes.keys().map(String::len).sum()),
            ends: Vec::with_capacity(len),
            table: HashTable::with_capacity(len),
            hasher: DefaultHashBuilder::default(),
            fabrics: Vec::with_capacity(len),
            fleet_outliers: Vec::with_capacity(len),
            prechecks: Vec::with_capacity(len * set.profiles.len()),
            topology: Vec::with_capacity(len * topology_keys.len()),
            topology_keys: Vec::new(),
        };
        let mut interner = TopologyInterner::new(topology_keys);
        // Sorted, so slots (and the arena) follow name order whatever the map's order.
        let mut entries: Vec<(&String, &Arc<CachedNode>)> = nodes.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (name, cached) in &entries {
            let Ok(end) = u32::try_from(index.names.len() + name.len()) else {
                // Over 4 GiB of names: leave the rest to the node cache path.
                break;
            };
            let slot = index.ends.len() as u32;
            index.names.push_str(name);
            index.ends.push(end);
            index.fabrics.push(cached.fabric.clone());
            index
                .fleet_outliers
                .push(cached.fabric.fleet_outlier.is_some());
            interner.intern_into(&cached.fabric.labels, &mut index.topology);
            let hash = index.hasher.hash_one(name.as_str());
            let (names, ends, hasher) = (&index.names, &index.ends, &index.hasher);
            index.table.insert_unique(hash, slot, |&s| {
                hasher.hash_one(name_at(names, ends, s as usize))
            });
        }
        index.topology_keys = interner.keys().to_vec();
        let indexed = index.ends.len();
        for p in 0..set.profiles.len() {
            index.prechecks.extend(
                entries[..indexed]
                    .iter()
                    .map(|(_, cached)| cached.precheck(set, p).cloned()),
            );
        }
        index
    }

    /// Whether this index reflects the node cache at `nodes_version` and the profile set of
    /// `generation`.
    pub fn is_current(&self, nodes_version: u64, generation: u64) -> bool {
        self.nodes_version == nodes_version && self.generation == generation
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The slot of the node called `name`.
    pub fn lookup(&self, name: &str) -> Option<usize> {
        let hash = self.hasher.hash_one(name);
        self.table
            .find(hash, |&s| {
                name_at(&self.names, &self.ends, s as usize) == name
            })
            .map(|&s| s as usize)
    }

    /// The keys behind every slot's [`NodeIndex::topology`], in id order.
    pub fn topology_keys(&self) -> &[String] {
        &self.topology_keys
    }

    /// The interned topology values of `slot`, one per [`NodeIndex::topology_keys`].
    pub fn topology(&self, slot: usize) -> &[Option<u32>] {
        let width = self.topology_keys.len();
        self.topology
            .get(slot * width..(slot + 1) * width)
            .unwrap_or_default()
    }

    /// The decision input for `name`: its fabric and, when `profile` (a position in the
    /// profile set this index was built for) is given, its precheck for that profile.
    pub fn slot<'a>(&'a self, name: &'a str, profile: Option<usize>) -> NodeSlot<'a> {
        match self.lookup(name) {
            Some(slot) => NodeSlot {
                name,
                fabric: self.fabrics.get(slot).map(|f| &**f),
                precheck: profile
                    .and_then(|p| self.prechecks.get(p * self.len() + slot))
                    .and_then(Option::as_ref),
                topology: self.topology(slot),
                fleet_outlier: self.fleet_outliers.get(slot).copied().unwrap_or(false),
            },
            None => NodeSlot::new(name, None),
        }
    }
}

fn name_at<'a>(names: &'a str, ends: &[u32], slot: usize) -> &'a str {
    let start = match slot {
        0 => 0,
        _ => ends.get(slot - 1).map_or(0, |&e| e as usize),
    };
    let end = ends.get(slot).map_or(start, |&e| e as usize);
    names.get(start..end).unwrap_or_default()
}
