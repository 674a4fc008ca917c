//! The pure core of a campaign: which pairs to test in which round, and what the results say.
//!
//! A *test* runs every rail of a pair of nodes at once (HCA *i* of A to HCA *i* of B), so one
//! test is a group test over `2 x rails` rail ends plus the links between them. A pass clears
//! the whole group (a working end-to-end write proves both ends and the wire); a failing rail
//! is bisected by testing each end separately against a reference node already proven good on
//! that rail. Planning:
//!
//! 1. **Sweep:** the nodes form a ring (optionally shuffled); its edges, coloured into 2 rounds
//!    (3 for an odd ring), are the first tests. Every node meets two distinct peers in N tests.
//! 2. **Confirm:** every rail end that is neither proven good nor blamed is paired with a fresh
//!    known-good reference, one node per pair per round, until the rules below decide it or
//!    its attempt budget runs out (then it stays *unresolved*, never blamed).
//!
//! Rules (per rail):
//! - a rail end that failed with two or more distinct peers proven good on that rail is the
//!   node's rail;
//! - a failure between two ends that both passed with other peers is the link (cable, switch
//!   port) between them; seen with one peer only, it is a suspect until a third node decides;
//! - a node whose every rail is blamed is the node.
//!
//! With few faults this costs N sweep tests plus a handful of confirmations (O(N), below the
//! O(N log N) budget), against C(N,2) for all pairs. Inconclusive tests (refusals, protocol
//! errors) are evidence of nothing: they only use up attempts.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

/// Index of a node in the campaign's node list.
pub type NodeIx = usize;
/// Index of a rail in the campaign's rail list.
pub type RailIx = usize;

/// Limits and options of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// Shuffle the ring with this seed (`None` keeps the given order).
    pub shuffle_seed: Option<u64>,
    /// Confirmation tests one node may take part in as the node under suspicion.
    pub max_confirmations_per_node: usize,
    /// Hard stop on the number of rounds (a campaign must end).
    pub max_rounds: usize,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            shuffle_seed: None,
            max_confirmations_per_node: 4,
            max_rounds: 64,
        }
    }
}

/// Why a pair is tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Purpose {
    /// A ring edge of the sweep.
    Sweep,
    /// `suspect` is paired with a known-good reference node.
    Confirm { suspect: NodeIx },
    /// Two undecided nodes without a known-good reference, paired with each other.
    Pairing,
}

/// One planned test: `initiator` writes into `responder`, every rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairTest {
    pub initiator: NodeIx,
    pub responder: NodeIx,
    pub purpose: Purpose,
}

impl PairTest {
    pub fn involves(&self, n: NodeIx) -> bool {
        self.initiator == n || self.responder == n
    }
    pub fn peer_of(&self, n: NodeIx) -> Option<NodeIx> {
        if self.initiator == n {
            Some(self.responder)
        } else if self.responder == n {
            Some(self.initiator)
        } else {
            None
        }
    }
}

/// Outcome of one rail in one pair test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RailOutcome {
    /// Bandwidth and latency within the profile's limits.
    Pass,
    /// Below the limits, or the writes failed (dead wire, error completions, unreachable).
    Fail,
    /// No evidence: refused, protocol error, peer vanished mid-test.
    Inconclusive,
}

/// Results of one pair test, one outcome per rail (in the campaign's rail order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairResult {
    pub test: PairTest,
    pub rails: Vec<RailOutcome>,
}

/// A campaign plan could not be built or fed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("a campaign needs at least 3 nodes to tell a node from a link, got {nodes}")]
    TooFewNodes { nodes: usize },
    #[error("a campaign needs at least one rail")]
    NoRails,
    #[error("result for {initiator}<->{responder} has {got} rail outcomes, the campaign has {want} rails")]
    RailCount {
        initiator: NodeIx,
        responder: NodeIx,
        got: usize,
        want: usize,
    },
    #[error("result for a test that was not planned in this round: {initiator}<->{responder}")]
    Unplanned {
        initiator: NodeIx,
        responder: NodeIx,
    },
}

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

/// The state of a campaign: the plan so far and the evidence collected.
#[derive(Debug, Clone)]
pub struct CampaignPlan {
    nodes: usize,
    rails: usize,
    opts: PlanOptions,
    /// Sweep rounds not yet handed out.
    sweep: Vec<Vec<PairTest>>,
    /// The round handed out and not yet fully recorded.
    in_flight: Vec<PairTest>,
    results: Vec<PairResult>,
    /// `good[n][r]`: end `r` of node `n` passed with some peer.
    good: Vec<Vec<bool>>,
    /// `failed_with[n][r]`: peers `n` failed with on rail `r`.
    failed_with: Vec<Vec<BTreeSet<NodeIx>>>,
    /// Pairs (min, max) already tested in this campaign.
    tested: HashSet<(NodeIx, NodeIx)>,
    /// Distinct peers each node had a conclusive test with.
    met: Vec<BTreeSet<NodeIx>>,
    confirmations: Vec<usize>,
    rounds: usize,
}

impl CampaignPlan {
    pub fn new(nodes: usize, rails: usize, opts: PlanOptions) -> Result<Self, PlanError> {
        if nodes < 3 {
            return Err(PlanError::TooFewNodes { nodes });
        }
        if rails == 0 {
            return Err(PlanError::NoRails);
        }
        let order = sweep_order(nodes, opts.shuffle_seed);
        Ok(CampaignPlan {
            nodes,
            rails,
            sweep: ring_rounds(&order),
            in_flight: Vec::new(),
            results: Vec::new(),
            good: vec![vec![false; rails]; nodes],
            failed_with: vec![vec![BTreeSet::new(); rails]; nodes],
            tested: HashSet::new(),
            met: vec![BTreeSet::new(); nodes],
            confirmations: vec![0; nodes],
            rounds: 0,
            opts,
        })
    }

    pub fn nodes(&self) -> usize {
        self.nodes
    }
    pub fn rails(&self) -> usize {
        self.rails
    }
    /// Rounds handed out so far.
    pub fn rounds(&self) -> usize {
        self.rounds
    }
    /// Tests recorded so far.
    pub fn tests(&self) -> usize {
        self.results.len()
    }
    pub fn results(&self) -> &[PairResult] {
        &self.results
    }

    /// The next round: disjoint pairs that may run at once. `None` when the campaign is over.
    /// Call [`CampaignPlan::record`] for every test of the round before asking again (tests
    /// left unrecorded count as inconclusive).
    pub fn next_round(&mut self) -> Option<Vec<PairTest>> {
        for t in std::mem::take(&mut self.in_flight) {
            // A test the caller never reported produced no evidence but still happened.
            self.tested.insert(key(t.initiator, t.responder));
        }
        if self.rounds >= self.opts.max_rounds {
            return None;
        }
        let round = if !self.sweep.is_empty() {
            self.sweep.remove(0)
        } else {
            self.confirm_round()
        };
        if round.is_empty() {
            return None;
        }
        self.rounds += 1;
        self.in_flight = round.clone();
        Some(round)
    }

    /// Feeds the result of a test of the current round.
    pub fn record(&mut self, result: PairResult) -> Result<(), PlanError> {
        let t = result.test;
        let Some(pos) = self
            .in_flight
            .iter()
            .position(|p| key(p.initiator, p.responder) == key(t.initiator, t.responder))
        else {
            return Err(PlanError::Unplanned {
                initiator: t.initiator,
                responder: t.responder,
            });
        };
        if result.rails.len() != self.rails {
            return Err(PlanError::RailCount {
                initiator: t.initiator,
                responder: t.responder,
                got: result.rails.len(),
                want: self.rails,
            });
        }
        self.in_flight.remove(pos);
        let (a, b) = (t.initiator, t.responder);
        self.tested.insert(key(a, b));
        let mut conclusive = false;
        for (r, outcome) in result.rails.iter().enumerate() {
            match outcome {
                RailOutcome::Pass => {
                    self.good[a][r] = true;
                    self.good[b][r] = true;
                    conclusive = true;
                }
                RailOutcome::Fail => {
                    self.failed_with[a][r].insert(b);
                    self.failed_with[b][r].insert(a);
                    conclusive = true;
                }
                RailOutcome::Inconclusive => {}
            }
        }
        if conclusive {
            self.met[a].insert(b);
            self.met[b].insert(a);
        }
        match t.purpose {
            Purpose::Confirm { suspect } if suspect < self.nodes => {
                self.confirmations[suspect] += 1
            }
            Purpose::Pairing => {
                self.confirmations[a] += 1;
                self.confirmations[b] += 1;
            }
            _ => {}
        }
        self.results.push(result);
        Ok(())
    }

    /// Number of distinct peers `n` failed with on rail `r` that are proven good on `r`.
    fn healthy_failures(&self, n: NodeIx, r: RailIx) -> BTreeSet<NodeIx> {
        self.failed_with[n][r]
            .iter()
            .copied()
            .filter(|&p| self.good[p][r])
            .collect()
    }

    fn rail_blamed(&self, n: NodeIx, r: RailIx) -> bool {
        !self.good[n][r] && self.healthy_failures(n, r).len() >= 2
    }

    /// Rails of `n` that still need evidence.
    fn open_rails(&self, n: NodeIx) -> Vec<RailIx> {
        (0..self.rails)
            .filter(|&r| !self.good[n][r] && !self.rail_blamed(n, r))
            .collect()
    }

    fn needs_confirmation(&self, n: NodeIx) -> bool {
        if self.confirmations[n] >= self.opts.max_confirmations_per_node {
            return false;
        }
        !self.open_rails(n).is_empty() || self.met[n].len() < 2
    }

    /// Pairs every undecided node with a fresh reference proven good on the rails it needs.
    fn confirm_round(&self) -> Vec<PairTest> {
        let mut busy = vec![false; self.nodes];
        let mut round = Vec::new();
        let suspects: Vec<NodeIx> = (0..self.nodes)
            .filter(|&n| self.needs_confirmation(n))
            .collect();
        // Suspects are not references this round: their own verdict is pending.
        for &s in &suspects {
            busy[s] = true;
        }
        let mut unmatched = Vec::new();
        for &s in &suspects {
            let open = self.open_rails(s);
            let wanted: Vec<RailIx> = if open.is_empty() {
                (0..self.rails).collect()
            } else {
                open
            };
            // Best reference: good on the most wanted rails, then the least used so far.
            let best = (0..self.nodes)
                .filter(|&g| g != s && !busy[g] && !self.tested.contains(&key(s, g)))
                .map(|g| {
                    let covered = wanted.iter().filter(|&&r| self.good[g][r]).count();
                    (covered, std::cmp::Reverse(self.met[g].len()), g)
                })
                .filter(|(covered, _, _)| *covered > 0)
                .max();
            if let Some((_, _, g)) = best {
                busy[g] = true;
                round.push(PairTest {
                    initiator: g,
                    responder: s,
                    purpose: Purpose::Confirm { suspect: s },
                });
            } else {
                unmatched.push(s);
            }
        }
        // No proven-good reference for them (e.g. every sweep test of theirs was
        // inconclusive): pair undecided nodes with each other. A pass proves both; a failure
        // blames nobody, since blame needs peers proven good.
        let mut taken = vec![false; unmatched.len()];
        for i in 0..unmatched.len() {
            if taken[i] {
                continue;
            }
            let a = unmatched[i];
            if let Some(j) = (i + 1..unmatched.len())
                .find(|&j| !taken[j] && !self.tested.contains(&key(a, unmatched[j])))
            {
                taken[i] = true;
                taken[j] = true;
                round.push(PairTest {
                    initiator: a,
                    responder: unmatched[j],
                    purpose: Purpose::Pairing,
                });
            }
        }
        round
    }

    /// Applies the rules to the evidence so far.
    pub fn localize(&self) -> Localization {
        let mut loc = Localization::default();
        for n in 0..self.nodes {
            let mut all = true;
            for r in 0..self.rails {
                if self.rail_blamed(n, r) {
                    loc.rail_faults.insert((n, r), self.healthy_failures(n, r));
                } else {
                    all = false;
                    if !self.good[n][r] {
                        loc.unresolved.insert((n, r));
                    }
                }
            }
            if all {
                loc.node_faults.insert(n);
            }
        }
        for n in 0..self.nodes {
            for r in 0..self.rails {
                for &p in self.failed_with[n][r].iter().filter(|&&p| p > n) {
                    if loc.rail_faults.contains_key(&(n, r))
                        || loc.rail_faults.contains_key(&(p, r))
                    {
                        continue; // explained by a blamed end
                    }
                    if self.good[n][r] && self.good[p][r] {
                        loc.link_faults.insert((n, p, r));
                    } else {
                        loc.suspect_links.insert((n, p, r));
                    }
                }
            }
        }
        loc
    }

    /// Whether node `n`'s rail `r` passed with some peer.
    pub fn is_good(&self, n: NodeIx, r: RailIx) -> bool {
        self.good
            .get(n)
            .and_then(|g| g.get(r))
            .copied()
            .unwrap_or(false)
    }

    /// Distinct peers `n` had a conclusive test with.
    pub fn peers_met(&self, n: NodeIx) -> usize {
        self.met.get(n).map_or(0, BTreeSet::len)
    }
}

fn key(a: NodeIx, b: NodeIx) -> (NodeIx, NodeIx) {
    (a.min(b), a.max(b))
}

/// Edge-colours the ring `order[0] - order[1] - ... - order[n-1] - order[0]` into rounds of
/// disjoint pairs: 2 rounds for an even ring, 3 for an odd one (the closing edge alone).
pub fn ring_rounds(order: &[NodeIx]) -> Vec<Vec<PairTest>> {
    let n = order.len();
    if n < 2 {
        return Vec::new();
    }
    let edge = |i: usize| PairTest {
        initiator: order[i],
        responder: order[(i + 1) % n],
        purpose: Purpose::Sweep,
    };
    if n == 2 {
        return vec![vec![edge(0)]];
    }
    let mut rounds = vec![Vec::new(), Vec::new()];
    // The closing edge of an odd ring goes to a third round.
    let last = n - n % 2;
    for i in 0..last {
        rounds[i % 2].push(edge(i));
    }
    if n % 2 == 1 {
        rounds.push(vec![edge(n - 1)]);
    }
    rounds
}

/// Fisher-Yates with splitmix64: deterministic for a seed, no RNG dependency in the core.
fn shuffle(v: &mut [NodeIx], seed: u64) {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    for i in (1..v.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

/// The ring order of the sweep for `nodes` nodes under `shuffle_seed`.
pub fn sweep_order(nodes: usize, shuffle_seed: Option<u64>) -> Vec<NodeIx> {
    let mut order: Vec<NodeIx> = (0..nodes).collect();
    if let Some(seed) = shuffle_seed {
        shuffle(&mut order, seed);
    }
    order
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

    #[test]
    fn ring_rounds_cover_every_node_twice_with_distinct_peers() {
        for n in [3usize, 4, 5, 8, 9, 64, 65] {
            let order: Vec<usize> = (0..n).collect();
            let rounds = ring_rounds(&order);
            assert_eq!(rounds.len(), if n % 2 == 0 { 2 } else { 3 }, "n={n}");
            let mut peers = vec![BTreeSet::new(); n];
            for round in &rounds {
                let mut seen = BTreeSet::new();
                for t in round {
                    assert!(seen.insert(t.initiator) && seen.insert(t.responder));
                    peers[t.initiator].insert(t.responder);
                    peers[t.responder].insert(t.initiator);
                }
            }
            assert!(peers.iter().all(|p| p.len() == 2), "n={n}: {peers:?}");
            assert_eq!(rounds.iter().map(Vec::len).sum::<usize>(), n);
        }
    }

    #[test]
    fn single_failure_without_third_node_evidence_stays_suspect_and_schedules_confirmation() {
        let mut plan = CampaignPlan::new(6, 1, PlanOptions::default()).unwrap();
        let round = plan.next_round().unwrap();
        // Only the 0-1 test fails; the others are never reported (inconclusive).
        let t = *round.iter().find(|t| t.involves(0)).unwrap();
        plan.record(PairResult {
            test: t,
            rails: vec![RailOutcome::Fail],
        })
        .unwrap();
        let loc = plan.localize();
        assert_eq!(loc.suspect_links, BTreeSet::from([(0, 1, 0)]));
        assert!(loc.rail_faults.is_empty() && loc.link_faults.is_empty());
        // The next rounds (sweep round 2) test 0 and 1 with third nodes.
        let next = plan.next_round().unwrap();
        let p0 = next.iter().find_map(|t| t.peer_of(0)).unwrap();
        let p1 = next.iter().find_map(|t| t.peer_of(1)).unwrap();
        assert!(p0 != 1 && p1 != 0);
    }

    #[test]
    fn inconclusive_tests_never_blame_and_leave_ends_unresolved() {
        let mut plan = CampaignPlan::new(
            5,
            1,
            PlanOptions {
                max_rounds: 10,
                ..Default::default()
            },
        )
        .unwrap();
        while let Some(round) = plan.next_round() {
            for t in round {
                let outcome = if t.involves(2) {
                    RailOutcome::Inconclusive
                } else {
                    RailOutcome::Pass
                };
                plan.record(PairResult {
                    test: t,
                    rails: vec![outcome],
                })
                .unwrap();
            }
        }
        let loc = plan.localize();
        assert!(!loc.blames_node(2));
        assert_eq!(loc.unresolved, BTreeSet::from([(2, 0)]));
        // Node 2 got its attempt budget and no more.
        assert!(plan.tests() <= 5 + PlanOptions::default().max_confirmations_per_node);
    }

    #[test]
    fn undecided_nodes_without_references_are_paired_with_each_other() {
        // Every sweep test is inconclusive (e.g. half the endpoints refuse): nobody is proven
        // good, so the planner pairs undecided nodes with each other until passes appear.
        let bad = [1usize, 3, 5, 7];
        let mut plan = CampaignPlan::new(8, 2, PlanOptions::default()).unwrap();
        while let Some(round) = plan.next_round() {
            for t in round {
                let inconclusive = bad.contains(&t.initiator) || bad.contains(&t.responder);
                let o = if inconclusive {
                    RailOutcome::Inconclusive
                } else {
                    RailOutcome::Pass
                };
                plan.record(PairResult {
                    test: t,
                    rails: vec![o; 2],
                })
                .unwrap();
            }
        }
        let loc = plan.localize();
        for n in [0usize, 2, 4, 6] {
            assert!(
                plan.is_good(n, 0) && plan.is_good(n, 1),
                "node {n} proven good"
            );
            assert!(
                plan.peers_met(n) >= 2,
                "node {n} met {} peers",
                plan.peers_met(n)
            );
        }
        assert!(loc.rail_faults.is_empty() && loc.node_faults.is_empty());
        for n in bad {
            assert!(loc.unresolved.contains(&(n, 0)));
        }
    }

    #[test]
    fn record_rejects_unplanned_and_wrong_rail_count() {
        let mut plan = CampaignPlan::new(4, 2, PlanOptions::default()).unwrap();
        let round = plan.next_round().unwrap();
        let bogus = PairTest {
            initiator: 0,
            responder: 2,
            purpose: Purpose::Sweep,
        };
        assert!(matches!(
            plan.record(PairResult {
                test: bogus,
                rails: vec![RailOutcome::Pass; 2]
            }),
            Err(PlanError::Unplanned { .. })
        ));
        let err = plan
            .record(PairResult {
                test: round[0],
                rails: vec![RailOutcome::Pass],
            })
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("1 rail outcomes, the campaign has 2"),
            "{err}"
        );
        assert!(matches!(
            CampaignPlan::new(2, 1, PlanOptions::default()),
            Err(PlanError::TooFewNodes { nodes: 2 })
        ));
        assert!(matches!(
            CampaignPlan::new(3, 0, PlanOptions::default()),
            Err(PlanError::NoRails)
        ));
    }

    #[test]
    fn shuffle_is_a_deterministic_permutation() {
        let mut a: Vec<usize> = (0..100).collect();
        let mut b = a.clone();
        shuffle(&mut a, 7);
        shuffle(&mut b, 7);
        assert_eq!(a, b);
        assert_ne!(a, (0..100).collect::<Vec<_>>());
        a.sort_unstable();
        assert_eq!(a, (0..100).collect::<Vec<_>>());
    }
}
