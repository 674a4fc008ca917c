//! The planner's state: hands out rounds (the sweep, then confirmations), records results
//! and applies the localization rules to the evidence.

use std::collections::{BTreeSet, HashSet};

use super::localization::Localization;
use super::sweep::{ring_rounds, sweep_order};
use super::{NodeIx, PairResult, PairTest, PlanError, PlanOptions, Purpose, RailIx, RailOutcome};

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

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
}
