//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection`
//! does it (`tools/leaderelection/leaderelection.go`): a candidate takes the Lease when it
//! is free or its holder stopped renewing for `leaseDurationSeconds`, the holder renews it
//! well within that, and every write carries the resourceVersion it read, so of two
//! candidates racing for an expired Lease exactly one wins (the other gets 409 Conflict).
//!
//! [`LeaseDecision`] is the pure part; [`LeaderLease`] reads and writes the Lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::Api;
use tokio_util::sync::CancellationToken;

/// What a candidate does with the Lease it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseDecision {
    /// It holds the Lease: renew it.
    Renew,
    /// The Lease is free or expired: take it.
    Acquire,
    /// Another holder renewed it within the lease duration.
    Follow,
}

/// Decides from the Lease's holder and last renewal at `now`.
pub fn lease_decision(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> LeaseDecision {
    let Some(spec) = spec else {
        return LeaseDecision::Acquire;
    };
    match spec.holder_identity.as_deref() {
        Some(h) if h == me => LeaseDecision::Renew,
        None | Some("") => LeaseDecision::Acquire,
        Some(_) => {
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15).max(1));
            let renewed = spec
                .renew_time
                .as_ref()
                .or(spec.acquire_time.as_ref())
                .map(|t| t.0.as_second());
            match renewed {
                Some(r) if now.as_second() < r + duration => LeaseDecision::Follow,
                _ => LeaseDecision::Acquire,
            }
        }
    }
}

/// One candidate for one Lease.
pub struct LeaderLease {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    leader: Arc<AtomicBool>,
}

impl LeaderLease {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> Self {
        LeaderLease {
            api,
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
            leader: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether this candidate held the Lease at its last try (shared with the renew task).
    pub fn leader_flag(&self) -> Arc<AtomicBool> {
        self.leader.clone()
    }

    /// One round: read the Lease and renew, take or leave it. Returns whether this
    /// candidate holds it now. A lost race (409) or an API error means not leading.
    pub async fn try_lead(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let decision = lease_decision(
            current.as_ref().and_then(|l| l.spec.as_ref()),
            &self.identity,
            now,
        );
        let led = match decision {
            LeaseDecision::Follow => false,
            LeaseDecision::Renew | LeaseDecision::Acquire => {
                let transitions = current
                    .as_ref()
                    .and_then(|l| l.spec.as_ref())
                    .and_then(|s| s.lease_transitions)
                    .unwrap_or(0);
                let acquired = match (decision, current.as_ref().and_then(|l| l.spec.as_ref())) {
                    (LeaseDecision::Renew, Some(s)) => s.acquire_time.clone(),
                    _ => Some(MicroTime(now)),
                };
                let spec = LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
                    acquire_time: acquired,
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(if decision == LeaseDecision::Acquire {
                        transitions + i32::from(current.is_some())
                    } else {
                        transitions
                    }),
                    ..LeaseSpec::default()
                };
                let result = match current {
                    Some(mut lease) => {
                        lease.spec = Some(spec);
                        self.api
                            .replace(&self.name, &PostParams::default(), &lease)
                            .await
                    }
                    None => {
                        let lease = Lease {
                            metadata: ObjectMeta {
                                name: Some(self.name.clone()),
                                ..ObjectMeta::default()
                            },
                            spec: Some(spec),
                        };
                        self.api.create(&PostParams::default(), &lease).await
                    }
                };
                match result {
                    Ok(_) => true,
                    Err(kube::Error::Api(s)) if s.code == 409 => false,
                    Err(e) => return Err(e),
                }
            }
        };
        let was = self.leader.swap(led, Ordering::SeqCst);
        if was != led {
            if led {
                tracing::info!(lease = %self.name, identity = %self.identity, "became the leader");
            } else {
                tracing::info!(lease = %self.name, identity = %self.identity, "not the leader");
            }
        }
        Ok(led)
    }

    /// Tries every third of the lease duration until `stop`; then gives the Lease up (so a
    /// successor need not wait for it to expire).
    pub async fn run(self, stop: CancellationToken) {
        let period = (self.duration / 3).max(Duration::from_secs(1));
        loop {
            if let Err(e) = self.try_lead().await {
                // An unreachable API server: stop writing before the Lease could expire.
                self.leader.store(false, Ordering::SeqCst);
                tracing::warn!(lease = %self.name, error = %e, "cannot renew the leader lease");
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(period) => {}
            }
        }
        if self.leader.swap(false, Ordering::SeqCst) {
            if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await {
                if let Some(spec) = lease.spec.as_mut() {
                    spec.holder_identity = None;
                    spec.renew_time = None;
                }
                let _ = self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_candidate_takes_a_free_or_expired_lease_and_follows_a_live_holder() {
        let now = Timestamp::from_second(1_000).unwrap();
        assert_eq!(lease_decision(None, "a", now), LeaseDecision::Acquire);
        assert_eq!(
            lease_decision(Some(&spec(None, 990, 15)), "a", now),
            LeaseDecision::Acquire
        );
        assert_eq!(
            lease_decision(Some(&spec(Some("a"), 990, 15)), "a", now),
            LeaseDecision::Renew
        );
        assert_eq!(
            lease_decision(Some(&spec(Some("b"), 990, 15)), "a", now),
            LeaseDecision::Follow
        );
        assert_eq!(
            lease_decision(Some(&spec(Some("b"), 985, 15)), "a", now),
            LeaseDecision::Acquire,
            "b stopped renewing 15 s ago"
        );
    }
}
