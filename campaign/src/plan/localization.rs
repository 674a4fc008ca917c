//! What the evidence says: the blamed rails, nodes and links of a campaign, and its JSON.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{NodeIx, RailIx};

/// What the evidence says about the fabric.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Localization {
    /// `(node, rail)` that failed with two or more healthy peers, with those peers. In JSON a
    /// list of `{"node", "rail", "peers"}` (JSON object keys are strings, not pairs).
    #[serde(with = "rail_faults_json")]
    pub rail_faults: BTreeMap<(NodeIx, RailIx), BTreeSet<NodeIx>>,
    /// Nodes whose every rail is blamed.
    pub node_faults: BTreeSet<NodeIx>,
    /// `(a, b, rail)` with `a < b`: failed while both ends passed with other peers.
    pub link_faults: BTreeSet<(NodeIx, NodeIx, RailIx)>,
    /// Failures not explained by a blamed rail whose link or ends are still undecided.
    pub suspect_links: BTreeSet<(NodeIx, NodeIx, RailIx)>,
    /// `(node, rail)` ends that are neither proven good nor blamed at the end.
    pub unresolved: BTreeSet<(NodeIx, RailIx)>,
}

/// [`Localization::rail_faults`] as a list of objects.
mod rail_faults_json {
    use std::collections::{BTreeMap, BTreeSet};

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{NodeIx, RailIx};

    type RailFaults = BTreeMap<(NodeIx, RailIx), BTreeSet<NodeIx>>;

    #[derive(Serialize, Deserialize)]
    struct RailFault {
        node: NodeIx,
        rail: RailIx,
        peers: BTreeSet<NodeIx>,
    }

    pub fn serialize<S: Serializer>(faults: &RailFaults, s: S) -> Result<S::Ok, S::Error> {
        let list: Vec<RailFault> = faults
            .iter()
            .map(|(&(node, rail), peers)| RailFault {
                node,
                rail,
                peers: peers.clone(),
            })
            .collect();
        list.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RailFaults, D::Error> {
        let list = Vec::<RailFault>::deserialize(d)?;
        Ok(list
            .into_iter()
            .map(|f| ((f.node, f.rail), f.peers))
            .collect())
    }
}

impl Localization {
    /// Whether `node` is blamed for anything (a rail or the whole node).
    pub fn blames_node(&self, node: NodeIx) -> bool {
        self.node_faults.contains(&node) || self.rail_faults.keys().any(|(n, _)| *n == node)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_localization_with_faults_is_json() {
        let mut l = Localization::default();
        l.rail_faults.insert((2, 4), BTreeSet::from([1, 3]));
        l.node_faults.insert(7);
        l.link_faults.insert((4, 5, 0));
        let v = serde_json::to_value(&l).unwrap();
        assert_eq!(
            v["rail_faults"],
            serde_json::json!([{"node": 2, "rail": 4, "peers": [1, 3]}])
        );
        let back: Localization = serde_json::from_value(v).unwrap();
        assert_eq!(back, l);
    }
}
