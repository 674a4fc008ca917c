//! Bounded live lookups of namespaces the cache does not hold yet (created a moment ago).
//! Every `/mutate` for such a namespace would otherwise cost one GET to the API server, and
//! anyone who can reach the webhook can name any namespace. So: one GET at a time per
//! namespace (later callers wait for it and share its answer), a few GETs at a time overall
//! (beyond them a call gets no labels rather than queueing), and each answer, found or not,
//! is remembered briefly in a bounded table.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

/// Labels of a namespace; None when it does not exist or could not be read.
pub type Labels = Option<BTreeMap<String, String>>;

/// Limits of [`NamespaceLookups`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupLimits {
    /// How long a namespace that was found is remembered (the watch takes over soon).
    pub found_ttl: Duration,
    /// How long a miss or a failed lookup is remembered.
    pub missing_ttl: Duration,
    /// Most GETs in flight at once.
    pub max_in_flight: usize,
    /// Most answers remembered.
    pub max_entries: usize,
}

impl Default for LookupLimits {
    fn default() -> Self {
        Self {
            found_ttl: Duration::from_secs(10),
            missing_ttl: Duration::from_secs(5),
            max_in_flight: 4,
            max_entries: 1024,
        }
    }
}

struct Answer {
    at: Instant,
    labels: Labels,
}

/// See the module docs.
pub struct NamespaceLookups {
    limits: LookupLimits,
    answers: Mutex<HashMap<String, Answer>>,
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    gets: Semaphore,
}

impl NamespaceLookups {
    pub fn new(limits: LookupLimits) -> Self {
        Self {
            gets: Semaphore::new(limits.max_in_flight.max(1)),
            limits,
            answers: Mutex::new(HashMap::new()),
            flights: Mutex::new(HashMap::new()),
        }
    }

    /// The labels of `name`: a remembered answer, the answer of a GET already in flight for
    /// it, or `fetch`'s (`Err` is a failed lookup, remembered like a miss).
    pub async fn labels<F, Fut>(&self, name: &str, fetch: F) -> Labels
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Labels, String>>,
    {
        if let Some(labels) = self.remembered(name) {
            return labels;
        }
        let flight = match self.flights.lock() {
            Ok(mut flights) => flights.entry(name.to_string()).or_default().clone(),
            Err(_) => return None,
        };
        let _turn = flight.lock().await;
        if let Some(labels) = self.remembered(name) {
            return labels;
        }
        let labels = match self.gets.try_acquire() {
            Ok(_permit) => match fetch().await {
                Ok(labels) => labels,
                Err(e) => {
                    tracing::warn!(namespace = name, error = %e, "namespace lookup failed");
                    None
                }
            },
            Err(_) => {
                // Too many lookups at once: no labels for this call, nothing remembered.
                tracing::warn!(
                    namespace = name,
                    "namespace lookup skipped: too many in flight"
                );
                self.land(name);
                return None;
            }
        };
        self.remember(name, labels.clone());
        self.land(name);
        labels
    }

    fn land(&self, name: &str) {
        if let Ok(mut flights) = self.flights.lock() {
            flights.remove(name);
        }
    }

    fn remembered(&self, name: &str) -> Option<Labels> {
        let answers = self.answers.lock().ok()?;
        let answer = answers.get(name)?;
        let ttl = match answer.labels {
            Some(_) => self.limits.found_ttl,
            None => self.limits.missing_ttl,
        };
        (answer.at.elapsed() < ttl).then(|| answer.labels.clone())
    }

    fn remember(&self, name: &str, labels: Labels) {
        let Ok(mut answers) = self.answers.lock() else {
            return;
        };
        if answers.len() >= self.limits.max_entries {
            let ttl = self.limits.found_ttl.max(self.limits.missing_ttl);
            answers.retain(|_, a| a.at.elapsed() < ttl);
            if answers.len() >= self.limits.max_entries {
                answers.clear();
            }
        }
        answers.insert(
            name.to_string(),
            Answer {
                at: Instant::now(),
                labels,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    async fn slow_miss(gets: &AtomicUsize) -> Result<Labels, String> {
        gets.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(None)
    }

    #[tokio::test]
    async fn concurrent_calls_for_one_missing_namespace_cost_one_get() {
        let lookups = Arc::new(NamespaceLookups::new(LookupLimits::default()));
        let gets = Arc::new(AtomicUsize::new(0));
        let calls = (0..64).map(|_| {
            let (lookups, gets) = (lookups.clone(), gets.clone());
            tokio::spawn(async move { lookups.labels("fresh", || slow_miss(&gets)).await })
        });
        for call in futures::future::join_all(calls).await {
            assert_eq!(call.unwrap(), None);
        }
        assert_eq!(gets.load(Ordering::SeqCst), 1);
        // Remembered: later calls cost nothing until the miss expires.
        assert_eq!(lookups.labels("fresh", || slow_miss(&gets)).await, None);
        assert_eq!(gets.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn lookups_are_capped_overall_and_answers_expire() {
        let limits = LookupLimits {
            found_ttl: Duration::from_millis(100),
            missing_ttl: Duration::from_millis(100),
            max_in_flight: 2,
            max_entries: 8,
        };
        let lookups = Arc::new(NamespaceLookups::new(limits));
        let gets = Arc::new(AtomicUsize::new(0));
        let calls = (0..20).map(|i| {
            let (lookups, gets) = (lookups.clone(), gets.clone());
            tokio::spawn(async move {
                lookups
                    .labels(&format!("ns-{i}"), || slow_miss(&gets))
                    .await
            })
        });
        futures::future::join_all(calls).await;
        assert!(gets.load(Ordering::SeqCst) <= 2, "{gets:?}");
        assert!(lookups.answers.lock().unwrap().len() <= 8);
        let found = || async { Ok(Some(BTreeMap::from([("a".into(), "b".into())]))) };
        assert!(lookups.labels("ns-x", found).await.is_some());
        tokio::time::sleep(Duration::from_millis(150)).await;
        let before = gets.load(Ordering::SeqCst);
        lookups.labels("ns-x", || slow_miss(&gets)).await;
        assert_eq!(gets.load(Ordering::SeqCst), before + 1, "expired");
    }
}
