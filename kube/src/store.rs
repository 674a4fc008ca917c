//! One keyed cache fed by a watch ([`Store`]), and how watch events reach it ([`Applier`]):
//! a list is buffered and swapped in whole, so readers never see half of one. Pure; the
//! watch that feeds it is [`crate::watch::watch_into`]. Every cache railguard keeps (the
//! extender's cluster state, the node guard's Nodes and prober pods, the fleet controller's
//! Nodes, profiles and DRA objects) is one of these.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

/// How often [`Store::wait_synced`] looks.
const SYNC_POLL: Duration = Duration::from_millis(20);

/// One keyed cache fed by a watch.
#[derive(Debug)]
pub struct Store<V> {
    pub name: &'static str,
    map: RwLock<HashMap<String, Arc<V>>>,
    /// Bumped by every write, so derived indexes can tell whether they are current.
    version: AtomicU64,
    synced: AtomicBool,
    last_heard: Mutex<Option<Instant>>,
}

impl<V> Store<V> {
    pub fn new(name: &'static str) -> Self {
        Store {
            name,
            map: RwLock::new(HashMap::new()),
            version: AtomicU64::new(0),
            synced: AtomicBool::new(false),
            last_heard: Mutex::new(None),
        }
    }

    /// Read access; a panic elsewhere while writing cannot leave a half-applied map (every
    /// write is a single insert, remove or swap), so a poisoned lock is still consistent.
    pub fn read(&self) -> RwLockReadGuard<'_, HashMap<String, Arc<V>>> {
        self.map.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get(&self, key: &str) -> Option<Arc<V>> {
        self.read().get(key).cloned()
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Number of writes so far. Read under [`Store::read`] it names exactly the content seen.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Time since the API server last sent this cache anything.
    pub fn age(&self) -> Option<Duration> {
        self.last_heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map(|t| t.elapsed())
    }

    fn heard(&self) {
        *self
            .last_heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    pub fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<V>>> {
        let guard = self.map.write().unwrap_or_else(PoisonError::into_inner);
        // Bumped while holding the lock: a reader comparing versions either sees the bump or
        // reads the map before this write.
        self.version.fetch_add(1, Ordering::AcqRel);
        guard
    }

    /// A snapshot of every value (for a recomputation over the whole cache).
    pub fn values(&self) -> Vec<Arc<V>> {
        self.read().values().cloned().collect()
    }

    /// Waits for the first complete list.
    pub async fn synced(&self) {
        while !self.is_synced() {
            tokio::time::sleep(SYNC_POLL).await;
        }
    }

    /// Waits up to `timeout` for the first complete list; whether it came.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.synced()).await.is_ok()
    }

    /// Replaces the whole content (end of a list) and marks the cache synced.
    pub fn replace(&self, items: HashMap<String, Arc<V>>) {
        *self.write() = items;
        self.synced.store(true, Ordering::Release);
    }
}

/// A watch event reduced to what a [`Store`] needs: the object's key and its converted
/// value (`None` when the object is deleted or not of interest).
#[derive(Debug)]
pub enum Change<V> {
    /// A (re)list starts.
    Restart,
    /// An object seen while listing.
    Listed(String, Option<V>),
    /// The list is complete.
    ListDone,
    /// An object changed after the list.
    Changed(String, Option<V>),
}

/// What one [`Change`] did to a store, for indexes derived from it.
#[derive(Debug)]
pub enum Applied<V> {
    /// Buffered (a list in progress); readers see nothing new yet.
    Staged,
    /// A complete list replaced the whole content.
    Replaced,
    /// One key changed: its value before and after (`None`: absent).
    Changed {
        old: Option<Arc<V>>,
        new: Option<Arc<V>>,
    },
}

/// Applies changes to a store, buffering a list so readers never see half of one.
#[derive(Debug)]
pub struct Applier<V> {
    staging: Option<HashMap<String, Arc<V>>>,
}

impl<V> Default for Applier<V> {
    fn default() -> Self {
        Applier { staging: None }
    }
}

impl<V> Applier<V> {
    pub fn apply(&mut self, store: &Store<V>, change: Change<V>) -> Applied<V> {
        let applied = match change {
            Change::Restart => {
                self.staging = Some(HashMap::new());
                Applied::Staged
            }
            Change::Listed(key, value) => {
                let staging = self.staging.get_or_insert_with(HashMap::new);
                match value {
                    Some(v) => {
                        staging.insert(key, Arc::new(v));
                    }
                    None => {
                        staging.remove(&key);
                    }
                }
                Applied::Staged
            }
            Change::ListDone => {
                store.replace(self.staging.take().unwrap_or_default());
                Applied::Replaced
            }
            Change::Changed(key, value) => {
                let new = value.map(Arc::new);
                let old = match &new {
                    Some(v) => store.write().insert(key, v.clone()),
                    None => store.write().remove(&key),
                };
                Applied::Changed { old, new }
            }
        };
        store.heard();
        applied
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn list_is_applied_atomically_and_marks_synced() {
        let store: Store<u32> = Store::new("t");
        let mut a = Applier::default();
        a.apply(&store, Change::Changed("old".into(), Some(1)));
        a.apply(&store, Change::Restart);
        a.apply(&store, Change::Listed("x".into(), Some(7)));
        // Readers still see the previous content until the list is complete.
        assert!(store.get("x").is_none());
        assert!(!store.is_synced());
        a.apply(&store, Change::Listed("skip".into(), None));
        a.apply(&store, Change::ListDone);
        assert!(store.is_synced());
        assert_eq!(store.get("x").as_deref(), Some(&7));
        assert!(store.get("old").is_none(), "objects not relisted are gone");
        a.apply(&store, Change::Changed("x".into(), None));
        assert!(store.is_empty());
        assert!(store.age().is_some());
    }
}
