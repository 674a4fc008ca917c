//! Whether one node may run a pod held to a profile and signature: [`check_node`] at a
//! given time, and [`precheck`], the same verdict computed ahead of the clock for the cache.

use jiff::Timestamp;
use railguard_api::certificate::human_duration;
use railguard_api::fleet::OutlierAction;
use railguard_api::{
    keys, Certificate, FabricProfile, FabricState, NodeFabric, RailResult, RailVerdict,
};

use crate::decision::prioritize::points_for_headroom;
use crate::decision::rejection::{first_reason, num};
use crate::decision::{RejectReason, Rejection};

/// Where a node stands for a profile and signature before the clock is read: every check
/// of [`check_node`] that does not depend on the current time.
enum Standing<'c> {
    Rejected(Rejection),
    /// Certified for this profile and signature; still valid until its expiry.
    Current(&'c Certificate),
    /// The cache already saw this certificate expire.
    Expired(&'c Certificate),
}

fn standing<'n>(node: &'n NodeFabric, profile: &FabricProfile, signature: &str) -> Standing<'n> {
    let name = profile.name();
    let reject = Standing::Rejected;
    match &node.state {
        FabricState::Absent => reject(Rejection::new(
            RejectReason::NoCertificate,
            format!("railguard: node has no fabric certificate; profile {name} requires one (is railguard-prober running on it?)"),
        )),
        FabricState::Unreadable { reason } => reject(Rejection::new(
            RejectReason::Unreadable,
            format!("railguard: node fabric metadata is unreadable: {reason}"),
        )),
        FabricState::Pending { .. } => reject(Rejection::new(
            RejectReason::Pending,
            "railguard: fabric certification is pending on this node",
        )),
        FabricState::Failed(c) => reject(match check_identity(c, name, signature) {
            Err(r) => r,
            Ok(()) => Rejection::new(
                RejectReason::Failed,
                format!(
                    "railguard: fabric certification failed{}",
                    first_reason(&c.reasons)
                ),
            ),
        }),
        FabricState::Degraded(c) => reject(match check_identity(c, name, signature) {
            Err(r) => r,
            // Name the rail that is degraded when the certificate shows it.
            Ok(()) => match check_rails(c, profile) {
                Err(r) => Rejection::new(RejectReason::Degraded, r.message),
                Ok(()) => Rejection::new(
                    RejectReason::Degraded,
                    format!("railguard: fabric degraded{}", first_reason(&c.reasons)),
                ),
            },
        }),
        FabricState::Expired { certificate, .. } => {
            match check_identity(certificate, name, signature)
                .and_then(|()| check_simulated(certificate, profile))
            {
                Err(r) => reject(r),
                Ok(()) => Standing::Expired(certificate),
            }
        }
        FabricState::Certified(c) => {
            match check_identity(c, name, signature).and_then(|()| check_simulated(c, profile)) {
                Err(r) => reject(r),
                Ok(()) => Standing::Current(c),
            }
        }
    }
}

/// A simulated certificate proves nothing about hardware: it counts only for a profile that
/// says its nodes are simulated (`certification.acceptSimulated`).
fn check_simulated(cert: &Certificate, profile: &FabricProfile) -> Result<(), Rejection> {
    if !cert.simulated || profile.spec.certification.accept_simulated {
        return Ok(());
    }
    Err(Rejection::new(
        RejectReason::Simulated,
        format!(
            "railguard: the node's certificate was made by a simulated engine (simulated: true); \
             profile {} does not set certification.acceptSimulated, so it certifies nothing",
            profile.name()
        ),
    ))
}

/// Whether `node` may run a pod held to `profile` and `signature` at `now`.
pub fn check_node(
    node: &NodeFabric,
    profile: &FabricProfile,
    signature: &str,
    now: Timestamp,
) -> Result<(), Rejection> {
    match standing(node, profile, signature) {
        Standing::Rejected(r) => Err(r),
        Standing::Expired(cert) => Err(expired(cert.expires_at, now)),
        Standing::Current(cert) => {
            // The cache interpreted the node when it last changed; time has moved on since.
            if cert.is_expired(now) {
                return Err(expired(cert.expires_at, now));
            }
            check_rails(cert, profile)?;
            check_busbw(cert, profile)?;
            check_nccl_pairs(cert, profile)?;
            check_fleet(node, profile)
        }
    }
}

/// A node's verdict for one (profile, signature), computed when the node or the profile
/// changes: everything [`check_node`] decides except the comparison with the clock, plus the
/// headroom points [`prioritize`](crate::decision::prioritize()) gives it.
/// [`Precheck::check`] at any `now` equals [`check_node`] at that `now`.
#[derive(Clone, Debug, PartialEq)]
pub enum Precheck {
    /// Rejected whatever the time.
    Rejected(Rejection),
    /// Certified for the pod, but the certificate had expired at this instant when cached.
    Expired(Timestamp),
    /// A certificate for the pod's profile and signature: `until_expiry` holds (`Ok` carries
    /// the headroom points) before `expires_at`; from then on the node is expired.
    Valid {
        expires_at: Timestamp,
        until_expiry: Result<i64, Rejection>,
    },
}

/// Computes a node's [`Precheck`] for a profile and signature.
pub fn precheck(node: &NodeFabric, profile: &FabricProfile, signature: &str) -> Precheck {
    match standing(node, profile, signature) {
        Standing::Rejected(r) => Precheck::Rejected(r),
        Standing::Expired(cert) => Precheck::Expired(cert.expires_at),
        Standing::Current(cert) => Precheck::Valid {
            expires_at: cert.expires_at,
            until_expiry: check_rails(cert, profile)
                .and_then(|()| check_busbw(cert, profile))
                .and_then(|()| check_nccl_pairs(cert, profile))
                .and_then(|()| check_fleet(node, profile))
                .map(|()| points_for_headroom(cert, profile)),
        },
    }
}

impl Precheck {
    /// The verdict at `now`: one comparison; a rejected node shares the cached message.
    pub fn check(&self, now: Timestamp) -> Result<(), Rejection> {
        match self {
            Precheck::Rejected(r) => Err(r.clone()),
            Precheck::Expired(at) => Err(expired(*at, now)),
            Precheck::Valid {
                expires_at,
                until_expiry,
            } => {
                if now >= *expires_at {
                    Err(expired(*expires_at, now))
                } else {
                    until_expiry.as_ref().map(|_| ()).map_err(Clone::clone)
                }
            }
        }
    }

    /// Headroom points at `now` (0 for nodes that do not pass).
    pub fn headroom_points(&self, now: Timestamp) -> i64 {
        match self {
            Precheck::Valid {
                expires_at,
                until_expiry: Ok(points),
            } if now < *expires_at => *points,
            _ => 0,
        }
    }
}

fn check_busbw(cert: &Certificate, profile: &FabricProfile) -> Result<(), Rejection> {
    let name = profile.name();
    let want = profile.spec.thresholds.busbw_plateau_gbps;
    match cert.nccl.as_ref().and_then(|n| n.busbw_plateau_gbps) {
        Some(got) if got >= want => Ok(()),
        Some(got) => Err(Rejection::new(
            RejectReason::BusbwBelowThreshold,
            format!(
                "railguard: NCCL busbw plateau {} GB/s, profile {name} needs {}",
                num(got),
                num(want)
            ),
        )),
        None => Err(Rejection::new(
            RejectReason::BusbwBelowThreshold,
            format!(
                "railguard: certificate has no NCCL busbw plateau, profile {name} needs {} GB/s",
                num(want)
            ),
        )),
    }
}

/// For a profile with NCCL pair tests: a scope (the full node, or a rail) whose every pair
/// test in the certificate failed. A failure with one peer may be the peer's; with every
/// peer it is this node's.
fn check_nccl_pairs(cert: &Certificate, profile: &FabricProfile) -> Result<(), Rejection> {
    if profile.spec.certification.nccl_pair.is_none()
        || !cert
            .extra
            .contains_key(railguard_api::certificate::NCCL_PAIRS_KEY)
    {
        return Ok(());
    }
    let pairs = cert.nccl_pairs();
    let mut scopes: Vec<&str> = pairs.iter().map(|p| p.scope()).collect();
    scopes.sort_unstable();
    scopes.dedup();
    for scope in scopes {
        let of_scope: Vec<_> = pairs.iter().filter(|p| p.scope() == scope).collect();
        if of_scope.iter().any(|p| p.ok) {
            continue;
        }
        let evidence: Vec<String> = of_scope
            .iter()
            .map(|p| {
                let what = match (p.busbw_gbps, &p.note) {
                    (_, Some(note)) => note.clone(),
                    (Some(b), None) => format!("{} GB/s", num(b)),
                    (None, None) => "failed".into(),
                };
                format!("{} ({what})", p.peer)
            })
            .collect();
        return Err(Rejection::new(
            RejectReason::BusbwBelowThreshold,
            format!(
                "railguard: NCCL pair test ({scope}) failed with every peer: {}",
                evidence.join(", ")
            ),
        ));
    }
    Ok(())
}

/// A node that passes every threshold but that the fleet controller marked an outlier of its
/// profile's fleet fails when the profile says `spec.fleet.outliers: Filter`; with `Score`
/// it passes and [`prioritize`](crate::decision::prioritize()) ranks it last for jobs. Checked
/// last, so a node that also misses a threshold is rejected for that, the firmer reason.
fn check_fleet(node: &NodeFabric, profile: &FabricProfile) -> Result<(), Rejection> {
    match &node.fleet_outlier {
        Some(mark) if profile.spec.fleet.outliers == OutlierAction::Filter => {
            let message = if mark.message.trim().is_empty() {
                format!(
                    "railguard: fleet outlier: node has condition {}=True and profile {} filters fleet outliers",
                    keys::CONDITION_FLEET_OUTLIER,
                    profile.name()
                )
            } else {
                format!("railguard: fleet outlier: {}", mark.message)
            };
            Err(Rejection::new(RejectReason::FleetOutlier, message))
        }
        _ => Ok(()),
    }
}

fn expired(expires_at: Timestamp, now: Timestamp) -> Rejection {
    let ago = now.as_second() - expires_at.as_second();
    Rejection::new(
        RejectReason::Expired,
        format!("railguard: certificate expired {} ago", human_duration(ago)),
    )
}

fn check_identity(cert: &Certificate, profile: &str, signature: &str) -> Result<(), Rejection> {
    if cert.profile != profile {
        return Err(Rejection::new(
            RejectReason::OtherProfile,
            format!(
                "railguard: node is certified for profile {}, pod needs {profile}",
                cert.profile
            ),
        ));
    }
    if cert.signature != signature {
        return Err(Rejection::new(
            RejectReason::OtherSignature,
            format!(
                "railguard: node rail layout {} differs from the pod's {signature} (profile {profile})",
                cert.signature
            ),
        ));
    }
    Ok(())
}

/// Every rail of the profile must be in the certificate, healthy, and meet the thresholds.
fn check_rails(cert: &Certificate, profile: &FabricProfile) -> Result<(), Rejection> {
    let name = profile.name();
    let t = &profile.spec.thresholds;
    for (i, spec) in profile.spec.rails.iter().enumerate() {
        let Some(rail) = rail_at(cert, i, &spec.hca, spec.port) else {
            let id = spec.id();
            return Err(Rejection::new(
                RejectReason::RailMissing,
                format!(
                    "railguard: rail {id} of profile {name} is missing from the node's certificate"
                ),
            ));
        };
        // Formatting the id only on the error paths keeps the 5,000-node filter fast.
        let id = || spec.id();
        if rail.verdict != RailVerdict::Healthy {
            let id = id();
            let verdict = match rail.verdict {
                RailVerdict::Degraded => "degraded",
                _ => "failed",
            };
            // A bandwidth shortfall is the most actionable form; fall back to the prober's reason.
            if let Some(got) = rail
                .write_bw_host_gbps
                .filter(|g| *g < t.write_bw_host_gbps)
            {
                return Err(Rejection::new(
                    RejectReason::RailUnhealthy,
                    format!(
                        "railguard: rail {id} measured {} Gb/s, profile {name} needs {}",
                        num(got),
                        num(t.write_bw_host_gbps)
                    ),
                ));
            }
            return Err(Rejection::new(
                RejectReason::RailUnhealthy,
                format!(
                    "railguard: rail {id} is {verdict}{}",
                    first_reason(&rail.reasons)
                ),
            ));
        }
        match rail.write_bw_host_gbps {
            Some(got) if got >= t.write_bw_host_gbps => {}
            Some(got) => {
                let id = id();
                return Err(Rejection::new(
                    RejectReason::RailBelowThreshold,
                    format!(
                        "railguard: rail {id} measured {} Gb/s, profile {name} needs {}",
                        num(got),
                        num(t.write_bw_host_gbps)
                    ),
                ));
            }
            None => {
                let id = id();
                return Err(Rejection::new(
                    RejectReason::RailBelowThreshold,
                    format!("railguard: rail {id} has no bandwidth measurement in the certificate, profile {name} needs {} Gb/s", num(t.write_bw_host_gbps)),
                ));
            }
        }
        if let Some(want) = t.write_bw_gpu_gbps {
            match rail.write_bw_gpu_gbps {
                Some(got) if got >= want => {}
                got => {
                    let id = id();
                    let measured = got.map_or("no".to_string(), num);
                    return Err(Rejection::new(
                        RejectReason::RailBelowThreshold,
                        format!(
                            "railguard: rail {id} measured {measured} Gb/s from GPU memory, profile {name} needs {}",
                            num(want)
                        ),
                    ));
                }
            }
        }
        if let (Some(max), Some(got)) = (t.max_latency_us, rail.latency_us) {
            if got > max {
                let id = id();
                return Err(Rejection::new(
                    RejectReason::RailBelowThreshold,
                    format!(
                        "railguard: rail {id} latency {} us, profile {name} allows {}",
                        num(got),
                        num(max)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The certificate's result for rail `hca:port`; the prober writes rails in profile order,
/// so position `i` is tried before searching.
fn rail_at<'c>(cert: &'c Certificate, i: usize, hca: &str, port: u32) -> Option<&'c RailResult> {
    match cert.rails.get(i) {
        Some(r) if r.port == port && r.hca == hca => Some(r),
        _ => cert.rail(hca, port),
    }
}
