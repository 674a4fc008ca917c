//! The cluster-wide cap on invasive runs (`certification.maxConcurrentInvasive`): a
//! semaphore of `coordination.k8s.io/v1` Leases, one per slot, each held by the node that
//! runs. A node takes the first free (or expired, or already its own) slot in an order of its
//! own, so that nodes coming due together do not all contend for slot 0, and keeps it
//! renewed for the length of its run; a prober that dies mid-run frees its slot when the
//! Lease expires.

use std::time::Duration;

use jiff::Timestamp;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use railguard_api::error::error_chain;
use railguard_kube::lease::LeaderLease;

/// An invasive slot's Lease could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} invasive slot lease {lease}")]
pub struct SlotError {
    /// `take` or `release`.
    pub what: &'static str,
    pub lease: String,
    #[source]
    pub source: kube::Error,
}

/// One round on `lease` at `now` ([`LeaderLease::try_lead_at`]).
async fn take_slot(lease: &LeaderLease, now: Timestamp) -> Result<bool, SlotError> {
    lease.try_lead_at(now).await.map_err(|source| SlotError {
        what: "take",
        lease: lease.name().to_string(),
        source,
    })
}

/// How long a slot stays held without renewal: a prober killed mid-run frees it then.
pub const SLOT_LEASE_SECONDS: i32 = 60;

/// Pure: the order in which `identity` tries `slots` slots: a rotation starting at a stable
/// hash of the identity (FNV-1a), so concurrent takers start apart.
pub fn slot_order(slots: usize, identity: &str) -> Vec<usize> {
    if slots == 0 {
        return Vec::new();
    }
    let hash = identity.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let start = usize::try_from(hash % slots as u64).unwrap_or(0);
    (0..slots).map(|i| (start + i) % slots).collect()
}

/// The slots of one profile, as seen by one node.
pub struct InvasiveSlots {
    leases: Vec<LeaderLease>,
}

/// A slot this node holds; renewed by [`HeldSlot::keep`] and given back by
/// [`HeldSlot::release`].
pub struct HeldSlot {
    lease: LeaderLease,
}

impl InvasiveSlots {
    /// The slots named `names` (the profile's [`railguard_api::FabricProfile::invasive_slot_leases`])
    /// in `namespace`, taken as `identity` (the node's name).
    pub fn new(client: &Client, namespace: &str, names: &[String], identity: &str) -> Self {
        let order = slot_order(names.len(), identity);
        let leases = order
            .into_iter()
            .filter_map(|i| names.get(i))
            .map(|name| {
                LeaderLease::new(
                    Api::namespaced(client.clone(), namespace),
                    name,
                    identity,
                    Duration::from_secs(u64::from(SLOT_LEASE_SECONDS.unsigned_abs())),
                )
            })
            .collect();
        InvasiveSlots { leases }
    }

    /// Takes a slot: `Ok(None)` when every slot is held by another node. An API error is an
    /// error: no run starts on a slot it could not prove it holds.
    pub async fn acquire(&self, now: Timestamp) -> Result<Option<HeldSlot>, SlotError> {
        for lease in &self.leases {
            if take_slot(lease, now).await? {
                return Ok(Some(HeldSlot {
                    lease: lease.clone(),
                }));
            }
        }
        Ok(None)
    }
}

impl HeldSlot {
    /// The Lease's name.
    pub fn name(&self) -> &str {
        self.lease.name()
    }

    /// Renews the slot every third of its lifetime until `stop` is cancelled. A renewal that
    /// fails is logged (the run under way is not abandoned: stopping it half-way would leave
    /// the node less certain than finishing it).
    pub async fn keep(&self, stop: CancellationToken) {
        let period = Duration::from_secs(u64::from(SLOT_LEASE_SECONDS.unsigned_abs() / 3).max(1));
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
            match take_slot(&self.lease, Timestamp::now()).await {
                Ok(true) => {}
                Ok(false) => {
                    warn!(lease = %self.name(), "the invasive slot was taken by another node mid-run");
                }
                Err(e) => {
                    warn!(lease = %self.name(), error = %error_chain(&e), "cannot renew the invasive slot");
                }
            }
        }
    }

    /// Gives the slot back.
    pub async fn release(self) -> Result<(), SlotError> {
        self.lease
            .release()
            .await
            .map(|_| ())
            .map_err(|source| SlotError {
                what: "release",
                lease: self.lease.name().to_string(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_is_tried_once_from_a_start_of_the_nodes_own() {
        for n in [1, 2, 4, 7] {
            let mut order = slot_order(n, "gpu-a");
            assert_eq!(order.len(), n);
            order.sort_unstable();
            assert_eq!(order, (0..n).collect::<Vec<_>>());
        }
        assert!(slot_order(0, "gpu-a").is_empty());
        // Stable for a node, and nodes spread over the starts.
        assert_eq!(slot_order(4, "gpu-a"), slot_order(4, "gpu-a"));
        let starts: std::collections::BTreeSet<usize> = (0..64)
            .map(|i| slot_order(4, &format!("gpu-{i}"))[0])
            .collect();
        assert_eq!(starts.len(), 4, "{starts:?}");
    }
}
