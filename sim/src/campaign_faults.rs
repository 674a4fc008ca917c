//! Fault simulation for the campaign planner ([`railguard_campaign::plan`]): a fabric
//! with injected faults that answers pair tests the way the hardware would, a whole campaign
//! run against it in memory, random fault placements for the scale benchmark, and the check
//! that a localization found every fault and blamed nothing healthy.

use std::collections::BTreeSet;

use railguard_campaign::plan::{
    sweep_order, CampaignPlan, Localization, NodeIx, PairResult, PairTest, PlanError, PlanOptions,
    RailIx, RailOutcome,
};
use serde::{Deserialize, Serialize};

/// Injected faults of a simulated fabric, for tests and the scale benchmark: answers a pair
/// test the way the hardware would.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultSet {
    /// `(node, rail)` ends that fail with everyone.
    pub rails: BTreeSet<(NodeIx, RailIx)>,
    /// Dead nodes: every rail fails with everyone.
    pub nodes: BTreeSet<NodeIx>,
    /// `(a, b, rail)` with `a < b`: the wire between a and b on that rail.
    pub links: BTreeSet<(NodeIx, NodeIx, RailIx)>,
}

impl FaultSet {
    /// The outcome a test of `t` would have.
    pub fn run(&self, t: &PairTest, rails: usize) -> PairResult {
        let (a, b) = (t.initiator.min(t.responder), t.initiator.max(t.responder));
        let rails = (0..rails)
            .map(|r| {
                let bad = self.nodes.contains(&a)
                    || self.nodes.contains(&b)
                    || self.rails.contains(&(a, r))
                    || self.rails.contains(&(b, r))
                    || self.links.contains(&(a, b, r));
                if bad {
                    RailOutcome::Fail
                } else {
                    RailOutcome::Pass
                }
            })
            .collect();
        PairResult { test: *t, rails }
    }

    /// Nodes touched by any fault.
    pub fn faulty_nodes(&self) -> BTreeSet<NodeIx> {
        let mut s: BTreeSet<NodeIx> = self.nodes.clone();
        s.extend(self.rails.iter().map(|(n, _)| *n));
        s.extend(self.links.iter().flat_map(|(a, b, _)| [*a, *b]));
        s
    }
}

/// Runs a whole campaign against `faults` in memory. Returns the plan (for counts) and
/// the localization.
pub fn simulate(
    nodes: usize,
    rails: usize,
    faults: &FaultSet,
    opts: PlanOptions,
) -> Result<(CampaignPlan, Localization), PlanError> {
    let mut plan = CampaignPlan::new(nodes, rails, opts)?;
    while let Some(round) = plan.next_round() {
        for t in &round {
            plan.record(faults.run(t, rails))?;
        }
    }
    let loc = plan.localize();
    Ok((plan, loc))
}

/// Places `k` faults on distinct nodes (cycling rail fault, link fault, dead node), for the
/// scale simulation. Faults touch disjoint nodes: two faults sharing a node can be
/// indistinguishable from a third fault (two bad links of one node look like its rail).
/// A fault that only shows between two particular nodes is observable only if that pair is
/// tested, so link faults sit on pairs of the sweep ring (`ring`, from [`sweep_order`]).
pub fn random_faults(ring: &[NodeIx], rails: usize, k: usize, seed: u64) -> FaultSet {
    let n = ring.len();
    // The planner's deterministic shuffle of 0..n, seeded apart from the ring's own.
    let positions = sweep_order(n, Some(seed ^ 0xFA17));
    let mut used = vec![false; n];
    let mut f = FaultSet::default();
    let mut cursor = positions.into_iter();
    for i in 0..k {
        let rail = ((seed as usize).wrapping_add(i * 7)) % rails;
        let Some(pos) = cursor.by_ref().find(|&p| !used[p] && !used[(p + 1) % n]) else {
            break;
        };
        let (a, b) = (ring[pos], ring[(pos + 1) % n]);
        used[pos] = true;
        match i % 3 {
            0 => {
                f.rails.insert((a, rail));
            }
            1 => {
                used[(pos + 1) % n] = true;
                f.links.insert((a.min(b), a.max(b), rail));
            }
            _ => {
                f.nodes.insert(a);
            }
        }
    }
    f
}

/// The first way a localization disagrees with the injected faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LocalizationMismatch {
    #[error("rail fault ({node},{rail}) not found")]
    RailNotFound { node: NodeIx, rail: RailIx },
    #[error("dead node {node} not found")]
    NodeNotFound { node: NodeIx },
    #[error("link fault ({a}, {b}, {rail}) not found")]
    LinkNotFound { a: NodeIx, b: NodeIx, rail: RailIx },
    #[error("healthy rail ({node},{rail}) blamed")]
    HealthyRailBlamed { node: NodeIx, rail: RailIx },
    #[error("healthy node {node} blamed as dead")]
    HealthyNodeBlamed { node: NodeIx },
    #[error("healthy link ({a}, {b}, {rail}) blamed")]
    HealthyLinkBlamed { a: NodeIx, b: NodeIx, rail: RailIx },
}

impl LocalizationMismatch {
    /// Whether something healthy was blamed (rather than a fault missed).
    pub fn blames_healthy(&self) -> bool {
        matches!(
            self,
            Self::HealthyRailBlamed { .. }
                | Self::HealthyNodeBlamed { .. }
                | Self::HealthyLinkBlamed { .. }
        )
    }
}

/// Checks a localization against the injected faults: every fault found, nothing healthy
/// blamed. Returns the first mismatch.
pub fn check_localization(f: &FaultSet, loc: &Localization) -> Result<(), LocalizationMismatch> {
    use LocalizationMismatch::*;
    if let Some(&(node, rail)) = f.rails.iter().find(|k| !loc.rail_faults.contains_key(k)) {
        return Err(RailNotFound { node, rail });
    }
    if let Some(&node) = f.nodes.iter().find(|n| !loc.node_faults.contains(n)) {
        return Err(NodeNotFound { node });
    }
    if let Some(&(a, b, rail)) = f.links.iter().find(|l| !loc.link_faults.contains(l)) {
        return Err(LinkNotFound { a, b, rail });
    }
    if let Some(&(node, rail)) = loc
        .rail_faults
        .keys()
        .find(|(n, r)| !f.rails.contains(&(*n, *r)) && !f.nodes.contains(n))
    {
        return Err(HealthyRailBlamed { node, rail });
    }
    for &node in &loc.node_faults {
        // With every rail of a node faulty, "the node" is the right answer too.
        let all_rails = loc
            .rail_faults
            .keys()
            .filter(|(m, _)| *m == node)
            .all(|k| f.rails.contains(k));
        if !f.nodes.contains(&node) && !all_rails {
            return Err(HealthyNodeBlamed { node });
        }
    }
    if let Some(&(a, b, rail)) = loc.link_faults.iter().find(|l| !f.links.contains(l)) {
        return Err(HealthyLinkBlamed { a, b, rail });
    }
    Ok(())
}
