//! One test per rail at a time, on both sides of the side channel.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::rdma::RdmaError;

/// Rails of this node currently under test. One test per rail at a time: a second request is
/// refused as busy rather than queued.
#[derive(Debug, Clone, Default)]
pub struct RailLocks {
    held: Arc<Mutex<HashSet<(String, u32)>>>,
}

/// Holds a rail until dropped.
#[derive(Debug)]
pub struct RailGuard {
    locks: RailLocks,
    rail: (String, u32),
}

impl RailLocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the rail, or `RdmaError::Busy` if a test already holds it.
    pub fn try_acquire(&self, hca: &str, port: u32) -> Result<RailGuard, RdmaError> {
        let rail = (hca.to_string(), port);
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
