//! The extender's decisions, pure over plain data: which profile a pod is held to, which
//! nodes pass, and how the passing nodes rank.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use jiff::Timestamp;
use railguard_api::certificate::human_duration;
use railguard_api::{
    keys, Certificate, FabricProfile, FabricState, NodeFabric, RailResult, RailVerdict,
};

use crate::pod::PodFacts;
use crate::wire::MAX_EXTENDER_PRIORITY;

/// Settings that shape decisions.
#[derive(Clone, Debug, PartialEq)]
pub struct ExtenderConfig {
    /// Resources that make a pod a GPU pod.
    pub gpu_resources: Vec<String>,
    /// Pod label keys that group the pods of one job, tried in order.
    pub job_label_keys: Vec<String>,
    /// Node topology label keys, most specific first, for profiles that name none.
    pub topology_keys: Vec<String>,
    /// Report every rejected node in `FailedNodes`, none in `FailedAndUnresolvableNodes`:
    /// kube-scheduler 1.20 and older read only `FailedNodes`, so otherwise the reasons for
    /// nodes that can never fit (a degraded rail, another profile) never reach the pod's
    /// FailedScheduling event. The cost: preemption may evict pods on such nodes for nothing.
    pub report_unresolvable_as_failed: bool,
}

impl Default for ExtenderConfig {
    fn default() -> Self {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        ExtenderConfig {
            gpu_resources: own(keys::DEFAULT_GPU_RESOURCES),
            job_label_keys: own(keys::DEFAULT_JOB_LABEL_KEYS),
            topology_keys: own(keys::DEFAULT_TOPOLOGY_KEYS),
            report_unresolvable_as_failed: false,
        }
    }
}

/// What a pod is held to.
#[derive(Clone, Debug)]
pub enum PodTarget<'a> {
    /// Not a training pod: every node passes, scores are 0.
    PassThrough,
    /// Checked against a profile and rail-layout signature.
    Profile {
        profile: &'a FabricProfile,
        signature: String,
        /// `allow-uncertified` honored for this pod's namespace: every node passes.
        exempt: bool,
    },
    /// A training pod that cannot be checked (its profile does not exist, or no default
    /// profile); every node fails with this message until that changes.
    Unplaceable(String),
}

/// Chooses what `pod` is held to. `namespace_labels` are the labels of the pod's
/// namespace when known (exemptions are honored only when the profile allows them).
pub fn target_for<'a>(
    pod: &PodFacts,
    profiles: &'a [FabricProfile],
    namespace_labels: Option<&BTreeMap<String, String>>,
    config: &ExtenderConfig,
) -> PodTarget<'a> {
    let profile = match &pod.profile {
        Some(name) => match profiles.iter().find(|p| p.name() == name) {
            Some(p) => p,
            None => {
                return PodTarget::Unplaceable(format!(
                    "railguard: pod asks for FabricProfile {name}, which does not exist"
                ))
            }
        },
        None => {
            if !(pod.requests_any(&config.gpu_resources) && requests_rdma(pod, profiles)) {
                return PodTarget::PassThrough;
            }
            let defaults: Vec<&FabricProfile> =
                profiles.iter().filter(|p| p.spec.default).collect();
            match defaults.as_slice() {
                [p] => *p,
                [] => {
                    return PodTarget::Unplaceable(
                        "railguard: pod requests GPUs and RDMA without a railguard.io/profile annotation and no FabricProfile is marked default".into(),
                    )
                }
                many => {
                    let names: Vec<&str> = many.iter().map(|p| p.name()).collect();
                    return PodTarget::Unplaceable(format!(
                        "railguard: pod has no railguard.io/profile annotation and several FabricProfiles are marked default ({}); set one",
                        names.join(", ")
                    ));
                }
            }
        }
    };
    let signature = pod
        .signature
        .clone()
        .unwrap_or_else(|| profile.spec.signature());
    let exempt = pod.allow_uncertified
        && namespace_labels
            .is_some_and(|labels| profile.spec.exemptions.allows(&pod.namespace, labels));
    PodTarget::Profile {
        profile,
        signature,
        exempt,
    }
}

/// RDMA resources: any profile's RDMA resource name, or the `rdma/` resource domain.
fn requests_rdma(pod: &PodFacts, profiles: &[FabricProfile]) -> bool {
    pod.extended_resources.iter().any(|r| {
        r.starts_with("rdma/")
            || profiles
                .iter()
                .filter_map(|p| p.spec.rdma.as_ref())
                .any(|rdma| &rdma.resource_name == r)
    })
}

/// Why a node was rejected; also the `reason` label of the rejection metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RejectReason {
    NoCertificate,
    Unreadable,
    Pending,
    Failed,
    Degraded,
    Expired,
    OtherProfile,
    OtherSignature,
    RailMissing,
    RailUnhealthy,
    RailBelowThreshold,
    BusbwBelowThreshold,
    NotCached,
    Unplaceable,
}

impl RejectReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::NoCertificate => "no_certificate",
            RejectReason::Unreadable => "unreadable",
            RejectReason::Pending => "pending",
            RejectReason::Failed => "failed",
            RejectReason::Degraded => "degraded",
            RejectReason::Expired => "expired",
            RejectReason::OtherProfile => "other_profile",
            RejectReason::OtherSignature => "other_signature",
            RejectReason::RailMissing => "rail_missing",
            RejectReason::RailUnhealthy => "rail_unhealthy",
            RejectReason::RailBelowThreshold => "rail_below_threshold",
            RejectReason::BusbwBelowThreshold => "busbw_below_threshold",
            RejectReason::NotCached => "not_cached",
            RejectReason::Unplaceable => "unplaceable",
        }
    }

    /// Whether the node may become eligible without anyone repairing it: a pending
    /// certification finishes, an expired certificate is renewed, the cache catches up, a
    /// missing profile is created. Everything else needs a repair and a new certificate,
    /// so preemption on that node would evict pods for nothing.
    pub fn resolvable(self) -> bool {
        matches!(
            self,
            RejectReason::Pending
                | RejectReason::Expired
                | RejectReason::NotCached
                | RejectReason::Unplaceable
        )
    }
}

/// A rejected node: the reason and the one-line message the scheduler shows the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: RejectReason,
    /// Shared: a cached rejection is handed to every filter call without copying the text.
    pub message: Arc<str>,
}

impl Rejection {
    fn new(reason: RejectReason, message: impl AsRef<str>) -> Self {
        Rejection {
            reason,
            message: Arc::from(one_line(message.as_ref())),
        }
    }
}

/// Messages end up in one-line scheduling events; text from certificates may hold newlines.
fn one_line(s: &str) -> String {
    if s.contains(['\n', '\r']) {
        s.split(['\n', '\r'])
            .filter(|p| !p.trim().is_empty())
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        s.to_string()
    }
}

/// Bandwidths as operators write them: `196`, `196.4`.
fn num(v: f64) -> String {
    if (v - v.round()).abs() < 0.05 {
        format!("{:.0}", v.round())
    } else {
        format!("{v:.1}")
    }
}

fn first_reason(reasons: &[String]) -> String {
    match reasons {
        [] => String::new(),
        [one] => format!(": {one}"),
        [first, rest @ ..] => format!(": {first} (+{} more)", rest.len()),
    }
}

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
            match check_identity(certificate, name, signature) {
                Err(r) => reject(r),
                Ok(()) => Standing::Expired(certificate),
            }
        }
        FabricState::Certified(c) => match check_identity(c, name, signature) {
            Err(r) => reject(r),
            Ok(()) => Standing::Current(c),
        },
    }
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
            check_busbw(cert, profile)
        }
    }
}

/// A node's verdict for one (profile, signature), computed when the node or the profile
/// changes: everything [`check_node`] decides except the comparison with the clock, plus the
/// headroom points [`prioritize`] gives it. [`Precheck::check`] at any `now` equals
/// [`check_node`] at that `now`.
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

/// A candidate node: its name and, when known, its fabric state.
#[derive(Clone, Copy, Debug)]
pub struct NodeSlot<'a> {
    pub name: &'a str,
    /// `None` when the node is not in the extender's cache (cache mode only).
    pub fabric: Option<&'a NodeFabric>,
    /// The node's [`Precheck`] for the target's profile and signature, when the cache has
    /// one; decisions then skip re-checking the certificate.
    pub precheck: Option<&'a Precheck>,
}

impl<'a> NodeSlot<'a> {
    /// A slot decided from the fabric state alone.
    pub fn new(name: &'a str, fabric: Option<&'a NodeFabric>) -> Self {
        NodeSlot {
            name,
            fabric,
            precheck: None,
        }
    }
}

/// The outcome of a filter call: by default keyed by owned names with owned messages;
/// [`filter_by`] chooses other key and message types (the server borrows names from the
/// request and shares messages with the cache, so rejecting a node allocates nothing).
#[derive(Clone, Debug, PartialEq)]
pub struct FilterVerdicts<K = String, M = String> {
    /// Indices into the input of the nodes that passed, in input order.
    pub passed: Vec<usize>,
    /// Nodes that may become eligible (`FailedNodes`).
    pub failed: BTreeMap<K, M>,
    /// Nodes this pod can never use (`FailedAndUnresolvableNodes`).
    pub unresolvable: BTreeMap<K, M>,
    /// Rejections counted by reason.
    pub reasons: BTreeMap<RejectReason, u64>,
}

impl<K, M> Default for FilterVerdicts<K, M> {
    fn default() -> Self {
        FilterVerdicts {
            passed: Vec::new(),
            failed: BTreeMap::new(),
            unresolvable: BTreeMap::new(),
            reasons: BTreeMap::new(),
        }
    }
}

impl<K: Ord, M> FilterVerdicts<K, M> {
    fn reject(&mut self, key: K, reason: RejectReason, message: M) {
        *self.reasons.entry(reason).or_default() += 1;
        let map = if reason.resolvable() {
            &mut self.failed
        } else {
            &mut self.unresolvable
        };
        map.insert(key, message);
    }
}

/// Filters candidate nodes for a pod held to `target` at time `now`.
pub fn filter(target: &PodTarget<'_>, nodes: &[NodeSlot<'_>], now: Timestamp) -> FilterVerdicts {
    filter_by(
        target,
        nodes,
        now,
        |i| {
            nodes
                .get(i)
                .map_or_else(String::new, |s| s.name.to_string())
        },
        |message| message.to_string(),
    )
}

/// [`filter`], naming rejected node `i` (its index in `nodes`) `key(i)` and keeping its
/// message as `message(..)`.
pub fn filter_by<K: Ord, M>(
    target: &PodTarget<'_>,
    nodes: &[NodeSlot<'_>],
    now: Timestamp,
    key: impl Fn(usize) -> K,
    message: impl Fn(Arc<str>) -> M,
) -> FilterVerdicts<K, M> {
    let mut out = FilterVerdicts::default();
    match target {
        PodTarget::PassThrough | PodTarget::Profile { exempt: true, .. } => {
            out.passed = (0..nodes.len()).collect()
        }
        PodTarget::Unplaceable(text) => {
            let r = Rejection::new(RejectReason::Unplaceable, text);
            for i in 0..nodes.len() {
                out.reject(key(i), r.reason, message(r.message.clone()));
            }
        }
        PodTarget::Profile {
            profile,
            signature,
            exempt: false,
        } => {
            out.passed.reserve(nodes.len());
            for (i, slot) in nodes.iter().enumerate() {
                let verdict = match (slot.precheck, slot.fabric) {
                    (Some(pre), _) => pre.check(now),
                    (None, Some(node)) => check_node(node, profile, signature, now),
                    (None, None) => Err(Rejection::new(
                        RejectReason::NotCached,
                        "railguard: node is not in the extender's cache yet",
                    )),
                };
                match verdict {
                    Ok(()) => out.passed.push(i),
                    Err(r) => out.reject(key(i), r.reason, message(r.message)),
                }
            }
        }
    }
    out
}

/// Score share of bandwidth headroom and of gang locality (each up to half of 10).
const HEADROOM_POINTS: i64 = MAX_EXTENDER_PRIORITY / 2;
const LOCALITY_POINTS: i64 = MAX_EXTENDER_PRIORITY - HEADROOM_POINTS;
/// Headroom that earns all headroom points: 10% above every threshold.
const FULL_HEADROOM: f64 = 0.10;

/// Bandwidth headroom of a certified node over the profile's thresholds: the smallest
/// ratio measured/threshold minus one, over every rail and the NCCL plateau.
pub fn headroom(cert: &Certificate, profile: &FabricProfile) -> Option<f64> {
    let t = &profile.spec.thresholds;
    let mut worst: Option<f64> = None;
    let mut take = |got: Option<f64>, want: f64| {
        if want > 0.0 {
            let ratio = got.unwrap_or(0.0) / want - 1.0;
            worst = Some(worst.map_or(ratio, |w: f64| w.min(ratio)));
        }
    };
    for spec in &profile.spec.rails {
        let rail = cert.rail(&spec.hca, spec.port);
        take(
            rail.and_then(|r| r.write_bw_host_gbps),
            t.write_bw_host_gbps,
        );
        if let Some(want) = t.write_bw_gpu_gbps {
            take(rail.and_then(|r| r.write_bw_gpu_gbps), want);
        }
    }
    take(
        cert.nccl.as_ref().and_then(|n| n.busbw_plateau_gbps),
        t.busbw_plateau_gbps,
    );
    worst
}

/// Ranks candidate nodes 0..=10: bandwidth headroom over the profile (up to 5) plus
/// locality to the nodes already running the job's pods (`peers`; up to 5 for sharing the
/// most specific topology label value). Only nodes that pass the filter earn headroom points.
pub fn prioritize(
    target: &PodTarget<'_>,
    nodes: &[NodeSlot<'_>],
    peers: &[&NodeFabric],
    now: Timestamp,
    config: &ExtenderConfig,
) -> Vec<(String, i64)> {
    let PodTarget::Profile {
        profile, signature, ..
    } = target
    else {
        return nodes.iter().map(|s| (s.name.to_string(), 0)).collect();
    };
    let keys: &[String] = if profile.spec.topology_keys.is_empty() {
        &config.topology_keys
    } else {
        &profile.spec.topology_keys
    };
    let occupied = Occupied::new(keys, peers);
    nodes
        .iter()
        .map(|slot| {
            let score = slot.fabric.map_or(0, |node| {
                let headroom = match slot.precheck {
                    Some(pre) => pre.headroom_points(now),
                    None => headroom_points(node, profile, signature, now),
                };
                headroom + occupied.locality_points(node)
            });
            (slot.name.to_string(), score.clamp(0, MAX_EXTENDER_PRIORITY))
        })
        .collect()
}

fn headroom_points(
    node: &NodeFabric,
    profile: &FabricProfile,
    signature: &str,
    now: Timestamp,
) -> i64 {
    if check_node(node, profile, signature, now).is_err() {
        return 0;
    }
    let Some(cert) = node.state.certificate() else {
        return 0;
    };
    points_for_headroom(cert, profile)
}

/// Headroom points of a certificate that passes the profile.
fn points_for_headroom(cert: &Certificate, profile: &FabricProfile) -> i64 {
    let h = headroom(cert, profile).unwrap_or(0.0).max(0.0);
    // Truncation is intended: a point per full 2% of headroom.
    let points = (h / FULL_HEADROOM * HEADROOM_POINTS as f64).floor() as i64;
    points.clamp(0, HEADROOM_POINTS)
}

/// The topology values a job's pods occupy, per key, most specific key first; only keys
/// with at least one value are kept, so a job with no placed pods costs nothing per node.
struct Occupied<'a> {
    /// `(rank, key, values)`: rank is the key's position from the least specific (1) up.
    keys: Vec<(
        i64,
        &'a str,
        HashSet<&'a str, hashbrown::DefaultHashBuilder>,
    )>,
    count: i64,
}

impl<'a> Occupied<'a> {
    fn new(keys: &'a [String], peers: &[&'a NodeFabric]) -> Self {
        let count = keys.len() as i64;
        let keys = keys
            .iter()
            .enumerate()
            .filter_map(|(i, key)| {
                let values: HashSet<&str, _> = peers
                    .iter()
                    .filter_map(|p| p.labels.get(key).map(String::as_str))
                    .collect();
                (!values.is_empty()).then_some((count - i as i64, key.as_str(), values))
            })
            .collect();
        Occupied { keys, count }
    }

    fn locality_points(&self, node: &NodeFabric) -> i64 {
        for (rank, key, values) in &self.keys {
            if let Some(v) = node.labels.get(*key) {
                if values.contains(v.as_str()) {
                    // Most specific key earns all points, the least specific still one or more.
                    return (LOCALITY_POINTS * rank + self.count - 1) / self.count;
                }
            }
        }
        0
    }
}
