//! The node cache laid out for the filter path ([`NodeIndex`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashTable};
use railguard_api::NodeFabric;

use crate::cache::{CachedNode, ProfileSet};
use crate::decision::{NodeSlot, Precheck};

/// The node cache laid out for the filter path. A `/filter` call looks up thousands of names;
/// through the node map each lookup compares its key behind a heap pointer and then follows
/// `Arc<CachedNode>` and its precheck vector into a heap full of certificates, a cache miss
/// at every step. Here the names sit in one arena, the hash table holds slot numbers, and
/// each profile's prechecks are one contiguous array, so a lookup stays in a few hundred
/// kilobytes that the CPU caches hold.
///
/// Built whole when nodes come or go or the profiles change ([`NodeIndex::build`]), copying
/// each node's topology ids, interned when the node was cached; a changed node that was
/// already indexed (a kubelet status write, a new certificate) only replaces its own slot
/// in a copy that shares the name table ([`NodeIndex::with_node`]). Handlers use it only
/// while [`NodeIndex::is_current`] says it reflects the node cache and the profile set they
/// decide with; otherwise they read the node cache (same answers).
#[derive(Clone, Debug, Default)]
pub struct NodeIndex {
    /// [`Store::version`] of the node cache this index was built from.
    nodes_version: u64,
    /// [`ProfileSet::generation`] of the prechecks.
    generation: u64,
    /// Names to slots; shared by every index with the same node names.
    slots: Arc<NameSlots>,
    fabrics: Vec<Arc<NodeFabric>>,
    /// Whether the fleet controller marked slot `i` an outlier: scoring reads this instead of
    /// following each fabric.
    fleet_outliers: Vec<bool>,
    /// Profiles in the set the prechecks were made for.
    profiles: usize,
    /// `prechecks[profile * len + slot]`; `None` where the node's prechecks were made for an
    /// older profile set (decisions then check its certificate instead).
    prechecks: Vec<Option<Precheck>>,
    /// The keys behind every slot's topology ids ([`ProfileSet::topology_keys`]).
    topology_keys: Vec<String>,
    /// `topology[slot * keys + k]`: the id of the slot's value for key `k`.
    topology: Vec<Option<u32>>,
}

/// Node names laid out for lookups: every name back to back, and their slot numbers hashed.
#[derive(Debug, Default)]
struct NameSlots {
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
}

impl NameSlots {
    fn lookup(&self, name: &str) -> Option<usize> {
        let hash = self.hasher.hash_one(name);
        self.table
            .find(hash, |&s| self.name(s as usize) == name)
            .map(|&s| s as usize)
    }

    fn name(&self, slot: usize) -> &str {
        let start = match slot {
            0 => 0,
            _ => self.ends.get(slot - 1).map_or(0, |&e| e as usize),
        };
        let end = self.ends.get(slot).map_or(start, |&e| e as usize);
        self.names.get(start..end).unwrap_or_default()
    }

    /// Appends `name` as the next slot; `false` (nothing added) past 4 GiB of names.
    fn push(&mut self, name: &str) -> bool {
        let Ok(end) = u32::try_from(self.names.len() + name.len()) else {
            return false;
        };
        let slot = self.ends.len() as u32;
        self.names.push_str(name);
        self.ends.push(end);
        let hash = self.hasher.hash_one(name);
        let (names, ends, hasher) = (&self.names, &self.ends, &self.hasher);
        self.table.insert_unique(hash, slot, |&s| {
            hasher.hash_one(name_at(names, ends, s as usize))
        });
        true
    }
}

impl NodeIndex {
    /// Indexes `nodes` (the node cache at `nodes_version`) for the profiles of `set`.
    pub fn build(
        nodes: &HashMap<String, Arc<CachedNode>>,
        nodes_version: u64,
        set: &ProfileSet,
    ) -> Self {
        let len = nodes.len();
        let width = set.topology_keys().len();
        let mut index = NodeIndex {
            nodes_version,
            generation: set.generation,
            slots: Arc::default(),
            fabrics: Vec::with_capacity(len),
            fleet_outliers: Vec::with_capacity(len),
            profiles: set.profiles.len(),
            prechecks: Vec::with_capacity(len * set.profiles.len()),
            topology_keys: set.topology_keys().to_vec(),
            topology: Vec::with_capacity(len * width),
        };
        // Sorted, so slots (and the arena) follow name order whatever the map's order.
        let mut entries: Vec<(&String, &Arc<CachedNode>)> = nodes.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut slots = NameSlots {
            names: String::with_capacity(nodes.keys().map(String::len).sum()),
            ends: Vec::with_capacity(len),
            table: HashTable::with_capacity(len),
            hasher: DefaultHashBuilder::default(),
        };
        for (name, cached) in &entries {
            if !slots.push(name) {
                // Over 4 GiB of names: leave the rest to the node cache path.
                break;
            }
            index.fabrics.push(cached.fabric.clone());
            index
                .fleet_outliers
                .push(cached.fabric.fleet_outlier.is_some());
            index.topology.extend_from_slice(&topology_of(cached, set));
        }
        index.slots = Arc::new(slots);
        let indexed = index.fabrics.len();
        for p in 0..set.profiles.len() {
            index.prechecks.extend(
                entries[..indexed]
                    .iter()
                    .map(|(_, cached)| cached.precheck(set, p).cloned()),
            );
        }
        index
    }

    /// This index with the node in slot `cached.fabric.name` replaced by `cached` (the node
    /// cache is now at `nodes_version`): a copy that shares the name table, so a node's
    /// status write costs a few copies of flat arrays, not a rebuild. `None` where the node
    /// is not indexed or `set` is not the profile set of this index: then
    /// [`NodeIndex::build`] it.
    pub fn with_node(
        &self,
        cached: &CachedNode,
        nodes_version: u64,
        set: &ProfileSet,
    ) -> Option<NodeIndex> {
        if set.generation != self.generation || set.profiles.len() != self.profiles {
            return None;
        }
        let slot = self.slots.lookup(&cached.fabric.name)?;
        let width = self.topology_keys.len();
        let mut index = self.clone();
        index.nodes_version = nodes_version;
        *index.fabrics.get_mut(slot)? = cached.fabric.clone();
        *index.fleet_outliers.get_mut(slot)? = cached.fabric.fleet_outlier.is_some();
        let len = index.len();
        for p in 0..self.profiles {
            *index.prechecks.get_mut(p * len + slot)? = cached.precheck(set, p).cloned();
        }
        let ids = topology_of(cached, set);
        index
            .topology
            .get_mut(slot * width..(slot + 1) * width)?
            .copy_from_slice(ids.get(..width)?);
        Some(index)
    }

    /// Whether this index and `other` share their name table: one was made from the other by
    /// [`NodeIndex::with_node`], no rebuild between them.
    pub fn shares_name_table(&self, other: &NodeIndex) -> bool {
        Arc::ptr_eq(&self.slots, &other.slots)
    }

    /// Whether this index reflects the node cache at `nodes_version` and the profile set of
    /// `generation`.
    pub fn is_current(&self, nodes_version: u64, generation: u64) -> bool {
        self.nodes_version == nodes_version && self.generation == generation
    }

    pub fn len(&self) -> usize {
        self.fabrics.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fabrics.is_empty()
    }

    /// The slot of the node called `name`.
    pub fn lookup(&self, name: &str) -> Option<usize> {
        self.slots.lookup(name)
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

/// `cached`'s topology ids in `set`: as cached, or interned now where the node was cached
/// for an older set (its ids are that set's).
fn topology_of<'c>(cached: &'c CachedNode, set: &ProfileSet) -> Cow<'c, [Option<u32>]> {
    if cached.generation == set.generation && cached.topology.len() == set.topology_keys().len() {
        Cow::Borrowed(&cached.topology)
    } else {
        Cow::Owned(set.intern_topology(&cached.fabric.labels))
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
