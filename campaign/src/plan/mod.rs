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

mod localization;
mod planner;
mod sweep;

use serde::{Deserialize, Serialize};

pub use localization::Localization;
pub use planner::CampaignPlan;
pub use sweep::{ring_rounds, sweep_order};

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
