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

/// One candidate for one Lease: a leader election (the fleet controller, the campaign
/// coordinator) or a slot (a node's invasive run). Cheap to clone; clones share the
/// leader flag.
#[derive(Clone)]
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

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its `leaseDurationSeconds`.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// Whether this candidate held the Lease at its last try (shared with the renew task).
    pub fn leader_flag(&self) -> Arc<AtomicBool> {
        self.leader.clone()
    }

    /// One round at the current time; see [`LeaderLease::try_lead_at`].
    pub async fn try_lead(&self) -> Result<bool, kube::Error> {
        self.try_lead_at(Timestamp::now()).await
    }

    /// One round: read the Lease and renew, take or leave it ([`lease_decision`] at `now`).
    /// Returns whether this candidate holds it now. A lost race (409) means not holding it;
    /// any other API error is returned (and clears the leader flag's claim to nothing: the
    /// caller decides how long a holder that cannot renew still counts as one).
    pub async fn try_lead_at(&self, now: Timestamp) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let current_spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let decision = lease_decision(current_spec, &self.identity, now);
        let led = match decision {
            LeaseDecision::Follow => false,
            LeaseDecision::Renew | LeaseDecision::Acquire => {
                let transitions = current_spec.and_then(|s| s.lease_transitions).unwrap_or(0);
                let acquired = match (decision, current_spec) {
                    (LeaseDecision::Renew, Some(s)) => s.acquire_time.clone(),
                    _ => Some(MicroTime(now)),
                };
                let spec = LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(
                        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX),
                    ),
                    acquire_time: acquired,
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(if decision == LeaseDecision::Acquire {
                        transitions + i32::from(current.is_some())
                    } else {
                        transitions
                    }),
                    ..LeaseSpec::default()
                };
                // Replace carries the resourceVersion read: a concurrent taker makes it a 409.
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
                tracing::info!(lease = %self.name, identity = %self.identity, "holds the lease");
            } else {
                tracing::info!(lease = %self.name, identity = %self.identity, "does not hold the lease");
            }
        }
        Ok(led)
    }

    /// Gives the Lease up if this candidate holds it (the holder cleared, so the next taker
    /// need not wait for it to expire). `Ok(false)`: someone else holds it, or it was taken
    /// meanwhile (a 409); nothing written.
    pub async fn release(&self) -> Result<bool, kube::Error> {
        self.leader.store(false, Ordering::SeqCst);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        lease.spec = Some(spec);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
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
        if self.leader.load(Ordering::SeqCst) {
            if let Err(e) = self.release().await {
                tracing::warn!(lease = %self.name, error = %e, "cannot give the leader lease up");
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
