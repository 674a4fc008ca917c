//! The sweep: the ring of nodes (optionally shuffled) and its edges coloured into rounds.

use super::{NodeIx, PairTest, Purpose};

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
    use std::collections::BTreeSet;

    use super::*;

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
