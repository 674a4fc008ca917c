//! One test per rail at a time, on both sides of the side channel.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::rdma::RdmaError;
use crate::test_lock::{NodeTestLock, TestLockHold};

/// Rails of this node currently under test. One test per rail at a time: a second request is
/// refused as busy rather than queued.
#[derive(Debug, Clone, Default)]
pub struct RailLocks {
    held: Arc<Mutex<HashSet<(String, u32)>>>,
    /// The node's test lock, shared with its invasive runs ([`NodeTestLock`]): every rail
    /// test holds it shared, so none runs beside the node's own certification.
    node: Option<NodeTestLock>,
}

/// Holds a rail until dropped.
#[derive(Debug)]
pub struct RailGuard {
    locks: RailLocks,
    rail: (String, u32),
    _node: Option<TestLockHold>,
}

impl RailLocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rail locks that also take the node's test lock (`--test-lock-file`), shared.
    pub fn with_node_lock(node: NodeTestLock) -> Self {
        RailLocks {
            node: Some(node),
            ..Self::default()
        }
    }

    /// Takes the rail, or `RdmaError::Busy` if a test already holds it.
    pub fn try_acquire(&self, hca: &str, port: u32) -> Result<RailGuard, RdmaError> {
        let rail = (hca.to_string(), port);
        // The node's invasive run first: while it holds the node, no rail is lent.
        let node = match &self.node {
            None => None,
            Some(lock) => match lock.try_shared() {
                Ok(Some(hold)) => Some(hold),
                Ok(None) => {
                    return Err(RdmaError::NodeBusy {
                        hca: hca.to_string(),
                        port,
                        reason: "the node's own invasive certification is running".into(),
                    })
                }
                // Fail closed: a test that cannot prove the node is free does not run.
                Err(e) => {
                    return Err(RdmaError::NodeBusy {
                        hca: hca.to_string(),
                        port,
                        reason: railguard_api::error::error_chain(&e),
                    })
                }
            },
        };
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.insert(rail.clone()) {
            return Err(RdmaError::Busy {
                hca: hca.to_string(),
                port,
            });
        }
        Ok(RailGuard {
            locks: self.clone(),
            rail,
            _node: node,
        })
    }

    pub fn is_held(&self, hca: &str, port: u32) -> bool {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.contains(&(hca.to_string(), port))
    }
}

impl Drop for RailGuard {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock().unwrap_or_else(|p| p.into_inner());
        held.remove(&self.rail);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn no_rail_is_lent_while_the_nodes_invasive_run_holds_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let node = NodeTestLock::new(dir.path().join("rails.lock"));
        let locks = RailLocks::with_node_lock(node.clone());
        // The daemon's run holds the node (another open file, as another process would).
        let run = node.try_exclusive().unwrap().unwrap();
        let e = locks.try_acquire("mlx5_0", 1).unwrap_err();
        assert_eq!(e.kind(), "node-busy");
        assert!(e.to_string().contains("invasive certification"), "{e}");
        assert!(!locks.is_held("mlx5_0", 1), "a refused rail is not held");
        drop(run);
        // Free: two rails at once, and the run waits for both to end.
        let a = locks.try_acquire("mlx5_0", 1).unwrap();
        let b = locks.try_acquire("mlx5_1", 1).unwrap();
        assert!(node.try_exclusive().unwrap().is_none());
        drop((a, b));
        assert!(node.try_exclusive().unwrap().is_some());
        // Without a node lock, rails lock only against each other.
        let plain = RailLocks::new();
        let _g = plain.try_acquire("mlx5_0", 1).unwrap();
        assert_eq!(plain.try_acquire("mlx5_0", 1).unwrap_err().kind(), "busy");
    }
}
