//! Passive renewal (issue #45 item 4): a busy node keeps a living certificate from its jobs'
//! own traffic. Invasive runs are held back while GPU pods are on the node, as they must be,
//! so without this the busiest nodes hold the stalest certificates, and an expiry locks a
//! job out of its own healthy nodes when it restarts from a checkpoint.
//!
//! Pure: the certificate a passive check made, the traffic the telemetry task tallied since
//! the last check, and the policy in; the renewed certificate, or why not, out. A renewal
//! moves `expiresAt` to one `ttlSeconds` from now and records what it rests on
//! ([`railguard_api::TrafficRenewal`]); `issuedAt` stays the last invasive pass. Renewals are
//! bounded ([`RenewalPolicy::max_renewals`]); the invasive run stays due and runs once the
//! node is idle.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use railguard_api::{
    Certificate, FabricProfileSpec, RailVerdict, RenewedBy, TrafficRenewal, Verdict,
};

/// What passive evidence does not prove, recorded on every renewal.
pub const NOT_PROVEN: &[&str] = &[
    "each rail's RDMA write bandwidth and latency against the profile's thresholds (only an invasive run measures them)",
    "the GPU-memory path (GPUDirect RDMA): rail counters do not show whether the job's traffic came from GPU memory",
    "NCCL bus bandwidth against the profile's plateau",
];

/// When traffic may renew a certificate.
#[derive(Clone, Debug, PartialEq)]
pub struct RenewalPolicy {
    /// Renewals allowed since the last invasive pass.
    pub max_renewals: u32,
    /// Bytes (sent + received) every rail must have carried in the window.
    pub min_bytes_per_rail: u64,
    /// Every rail's bytes must be at least this share of the rails' median: a rail-optimized
    /// job spreads its collectives over all of them.
    pub min_share: f64,
}

impl Default for RenewalPolicy {
    fn default() -> Self {
        RenewalPolicy {
            max_renewals: 24,
            min_bytes_per_rail: 1 << 30,
            min_share: 0.5,
        }
    }
}

/// The jobs' traffic between two passive checks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrafficTally {
    pub start: Option<Timestamp>,
    pub end: Option<Timestamp>,
    /// `hca:port` → bytes sent and received.
    pub bytes_per_rail: BTreeMap<String, u64>,
    /// Rails the grey-rail judge holds grey now.
    pub grey: Vec<String>,
}

/// What became of a renewal.
#[derive(Clone, Debug, PartialEq)]
pub enum Renewal {
    /// More than half the validity is left: nothing to do.
    NotDue,
    /// Due, and the evidence does not carry it: why.
    Refused(String),
    /// Renewed: the certificate with its new expiry and the renewal's record.
    Renewed(Box<Certificate>),
}

/// Pure: renews `cert` (the certificate a passive check just made) by `tally` at `now`, if
/// more than half of its validity is gone, the node and every rail are healthy, no rail is
/// grey, and every rail of the profile carried at least the policy's bytes, none below its
/// share of the median.
pub fn renew_by_traffic(
    cert: &Certificate,
    profile: &FabricProfileSpec,
    tally: &TrafficTally,
    policy: &RenewalPolicy,
    now: Timestamp,
) -> Renewal {
    let ttl = SignedDuration::from_secs(
        i64::try_from(profile.certification.ttl_seconds).unwrap_or(i64::MAX / 2),
    );
    let left = cert.expires_at.duration_since(now);
    if left > ttl / 2 {
        return Renewal::NotDue;
    }
    if cert.verdict != Verdict::Certified {
        return Renewal::Refused(format!(
            "the certificate is {}: only a certified node renews",
            cert.verdict.as_label()
        ));
    }
    if let Some(r) = cert
        .rails
        .iter()
        .find(|r| r.verdict != RailVerdict::Healthy)
    {
        return Renewal::Refused(format!("rail {} is not healthy", r.id()));
    }
    let renewals = cert.renewal.as_ref().map_or(0, |r| r.renewals);
    if renewals >= policy.max_renewals {
        return Renewal::Refused(format!(
            "renewed {renewals} times since the last invasive pass (at most {}): an invasive run is due once the node is idle",
            policy.max_renewals
        ));
    }
    if !tally.grey.is_empty() {
        return Renewal::Refused(format!("grey rails: {}", tally.grey.join(", ")));
    }
    let (Some(start), Some(end)) = (tally.start, tally.end) else {
        return Renewal::Refused("no traffic tallied since the last check".into());
    };
    let mut bytes = BTreeMap::new();
    for rail in &profile.rails {
        let id = rail.id();
        let b = tally.bytes_per_rail.get(&id).copied().unwrap_or(0);
        if b < policy.min_bytes_per_rail {
            return Renewal::Refused(format!(
                "rail {id} carried {b} bytes since the last check (at least {} to renew)",
                policy.min_bytes_per_rail
            ));
        }
        bytes.insert(id, b);
    }
    let mut sorted: Vec<u64> = bytes.values().copied().collect();
    sorted.sort_unstable();
    let median = match sorted.len() {
        0 => return Renewal::Refused("the profile names no rails".into()),
        n if n % 2 == 1 => sorted[n / 2] as f64,
        n => (sorted[n / 2 - 1] as f64 + sorted[n / 2] as f64) / 2.0,
    };
    if let Some((id, b)) = bytes
        .iter()
        .find(|(_, b)| (**b as f64) < policy.min_share * median)
    {
        return Renewal::Refused(format!(
            "rail {id} carried {b} bytes, under {:.0}% of the rails' median {median:.0}: the traffic is not symmetric",
            policy.min_share * 100.0
        ));
    }
    let mut renewed = cert.clone();
    renewed.expires_at = now + ttl;
    renewed.renewal = Some(TrafficRenewal {
        renewed_by: RenewedBy::Traffic,
        renewed_at: now,
        window_start: start,
        window_end: end,
        bytes_per_rail: bytes,
        renewals: renewals + 1,
        not_proven: NOT_PROVEN.iter().map(|s| s.to_string()).collect(),
    });
    Renewal::Renewed(Box::new(renewed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(ttl: u64) -> FabricProfileSpec {
        let mut p = railguard_api::profiles_from_yaml(include_str!(
            "../../../api/fixtures/profiles/dgx-h100-ndr.yaml"
        ))
        .unwrap()
        .remove(0)
        .spec;
        p.certification.ttl_seconds = ttl;
        p
    }

    fn certified(p: &FabricProfileSpec, issued: Timestamp) -> Certificate {
        let mut c = Certificate::new(
            "dgx-h100-ndr",
            "sig",
            Verdict::Certified,
            issued,
            issued + SignedDuration::from_secs(p.certification.ttl_seconds as i64),
        );
        c.rails = p
            .rails
            .iter()
            .map(|r| railguard_api::RailResult::new(&r.hca, r.port, RailVerdict::Healthy))
            .collect();
        c
    }

    fn tally(p: &FabricProfileSpec, end: Timestamp, gib: impl Fn(usize) -> u64) -> TrafficTally {
        TrafficTally {
            start: Some(end - SignedDuration::from_secs(60)),
            end: Some(end),
            bytes_per_rail: p
                .rails
                .iter()
                .enumerate()
                .map(|(i, r)| (r.id(), gib(i) << 30))
                .collect(),
            grey: vec![],
        }
    }

    #[test]
    fn a_busy_healthy_node_keeps_its_certificate_through_ten_ttls() {
        let p = profile(600);
        let policy = RenewalPolicy::default();
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let mut cert = certified(&p, t0);
        // A passive check every 60 s for ten TTLs, 40 GiB a minute on every rail.
        for minute in 1..=100 {
            let now = t0 + SignedDuration::from_secs(60 * minute);
            match renew_by_traffic(&cert, &p, &tally(&p, now, |_| 40), &policy, now) {
                Renewal::NotDue => {}
                Renewal::Renewed(c) => cert = *c,
                Renewal::Refused(why) => panic!("minute {minute}: {why}"),
            }
            assert!(!cert.is_expired(now), "minute {minute}");
        }
        let r = cert.renewal.as_ref().unwrap();
        assert_eq!(r.renewed_by, RenewedBy::Traffic);
        assert!(r.renewals >= 19, "{}", r.renewals);
        assert_eq!(cert.issued_at, t0, "issuedAt stays the invasive pass");
        assert_eq!(r.bytes_per_rail.len(), p.rails.len());
        assert_eq!(r.not_proven.len(), NOT_PROVEN.len());
    }

    #[test]
    fn grey_asymmetric_or_thin_traffic_does_not_renew() {
        let p = profile(600);
        let policy = RenewalPolicy::default();
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let cert = certified(&p, t0);
        let now = t0 + SignedDuration::from_secs(400);
        let refused =
            |t: &TrafficTally, c: &Certificate| match renew_by_traffic(c, &p, t, &policy, now) {
                Renewal::Refused(why) => why,
                other => panic!("{other:?}"),
            };
        let mut grey = tally(&p, now, |_| 40);
        grey.grey = vec!["mlx5_4:1".into()];
        assert!(refused(&grey, &cert).contains("grey rails: mlx5_4:1"));
        let lopsided = tally(&p, now, |i| if i == 2 { 10 } else { 40 });
        assert!(refused(&lopsided, &cert).contains("not symmetric"));
        let thin = tally(&p, now, |i| u64::from(i != 5) * 40);
        assert!(refused(&thin, &cert).contains("carried 0 bytes"));
        let mut degraded = cert.clone();
        degraded.verdict = Verdict::Degraded;
        assert!(refused(&tally(&p, now, |_| 40), &degraded).contains("only a certified node"));
        let mut used_up = cert.clone();
        if let Renewal::Renewed(c) =
            renew_by_traffic(&cert, &p, &tally(&p, now, |_| 40), &policy, now)
        {
            used_up = *c;
        }
        used_up.renewal.as_mut().unwrap().renewals = policy.max_renewals;
        used_up.expires_at = cert.expires_at;
        assert!(refused(&tally(&p, now, |_| 40), &used_up).contains("an invasive run is due"));
        // More than half the validity left: not due.
        let early = t0 + SignedDuration::from_secs(100);
        assert_eq!(
            renew_by_traffic(&cert, &p, &tally(&p, early, |_| 40), &policy, early),
            Renewal::NotDue
        );
    }
}
