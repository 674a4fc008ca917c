//! What the fleet controller keeps on a Node besides its outlier mark, so that schedulers
//! other than railguard's extender see railguard's verdicts: an expired certification's
//! `railguard.io/fabric` label flipped to `pending` (every selector on `certified`, the
//! webhook's injected affinity included, stops matching) and, for profiles with
//! `certification.taints`, the NoSchedule taint `railguard.io/fabric-unhealthy` that the
//! default scheduler, Kueue, KAI, Volcano and Karpenter all honour.
//!
//! Pure: [`node_upkeep`] decides from the decoded Node, [`upkeep_patch`] turns the decision
//! into one merge patch (label and taints together, guarded by the resourceVersion it was
//! decided on) or nothing when the Node already carries it.

use crate::keys::{self, taint_reason};
use crate::node::NodeEvent;
use crate::{FabricState, NodeFabric, Verdict};
use k8s_openapi::api::core::v1::Taint;
use serde_json::{json, Value};

/// The taint's effect: new pods stay away, running jobs are left alone (a job that lands
/// on a node whose certification lapses mid-run is the job's to judge, not ours to evict).
pub const TAINT_EFFECT: &str = "NoSchedule";

/// What the controller wants for the railguard taint of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintWanted {
    /// Tainted, the value saying why ([`taint_reason`]).
    Set(&'static str),
    /// Not tainted: a passing certificate, or a profile without `certification.taints`.
    Clear,
    /// Left as it is: a certification is running (`pending`) or the node's metadata is
    /// unreadable; the next verdict decides.
    Keep,
}

/// The decision for one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeUpkeep {
    /// Flip `railguard.io/fabric` from `certified` to `pending`: the certificate expired.
    pub expire_label: bool,
    pub taint: TaintWanted,
}

/// The node's profile settings the decision needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpkeepPolicy {
    /// `certification.taints`.
    pub taints: bool,
    /// `fleet.outliers: Filter`: outliers are out of scheduling, so tainted too.
    pub filter_outliers: bool,
    /// The cluster keeps unhealthy rails off with DRA device taints: a `degraded` node with
    /// usable rails keeps serving on them, so the node itself is not tainted.
    pub device_taints: bool,
}

/// Decides one node of a profile at `now`. `outlier`: the fleet analysis marks it an
/// outlier now.
pub fn node_upkeep(
    fabric: &NodeFabric,
    policy: UpkeepPolicy,
    outlier: bool,
    now: jiff::Timestamp,
) -> NodeUpkeep {
    let expire_label = matches!(fabric.state, FabricState::Expired { .. })
        && fabric.labels.get(keys::LABEL_FABRIC).map(String::as_str)
            == Some(keys::fabric::CERTIFIED);
    let taint = if !policy.taints {
        TaintWanted::Clear
    } else {
        match &fabric.state {
            FabricState::Failed(_) => TaintWanted::Set(taint_reason::FAILED),
            FabricState::Degraded(c)
                if policy.device_taints && c.usable_rails.is_none_or(|u| u > 0) =>
            {
                TaintWanted::Clear
            }
            FabricState::Degraded(_) => TaintWanted::Set(taint_reason::DEGRADED),
            FabricState::Expired { .. } => TaintWanted::Set(taint_reason::EXPIRED),
            // Pending after the expiry flip: still expired until a run passes.
            FabricState::Pending {
                previous: Some(previous),
            } if previous.verdict == Verdict::Certified && previous.is_expired(now) => {
                TaintWanted::Set(taint_reason::EXPIRED)
            }
            FabricState::Certified(_) if outlier && policy.filter_outliers => {
                TaintWanted::Set(taint_reason::OUTLIER)
            }
            FabricState::Certified(_) | FabricState::Absent => TaintWanted::Clear,
            FabricState::Pending { .. } | FabricState::Unreadable { .. } => TaintWanted::Keep,
        }
    };
    NodeUpkeep {
        expire_label,
        taint,
    }
}

/// The railguard taint among `taints`.
pub fn railguard_taint(taints: &[Taint]) -> Option<&Taint> {
    taints
        .iter()
        .find(|t| t.key == keys::TAINT_FABRIC_UNHEALTHY)
}

/// The merge patch that gives the Node (at `resource_version`, carrying `taints`) what
/// `upkeep` wants, or `None` when it already does. Other taints stay in their order; the
/// resourceVersion makes the API server refuse the patch (409) if the Node changed since it
/// was read, since a merge patch replaces the whole taint list.
pub fn upkeep_patch(
    upkeep: NodeUpkeep,
    taints: &[Taint],
    resource_version: Option<&str>,
) -> Option<Value> {
    let ours = railguard_taint(taints);
    let wanted_taints: Option<Vec<Taint>> = match upkeep.taint {
        TaintWanted::Keep => None,
        TaintWanted::Clear if ours.is_none() => None,
        TaintWanted::Set(reason)
            if ours.is_some_and(|t| {
                t.value.as_deref() == Some(reason) && t.effect == TAINT_EFFECT
            }) =>
        {
            None
        }
        TaintWanted::Clear => Some(others(taints)),
        TaintWanted::Set(reason) => {
            let mut t = others(taints);
            t.push(Taint {
                key: keys::TAINT_FABRIC_UNHEALTHY.to_string(),
                value: Some(reason.to_string()),
                effect: TAINT_EFFECT.to_string(),
                time_added: None,
            });
            Some(t)
        }
    };
    if wanted_taints.is_none() && !upkeep.expire_label {
        return None;
    }
    let mut metadata = json!({ "resourceVersion": resource_version });
    if upkeep.expire_label {
        metadata["labels"] = json!({ keys::LABEL_FABRIC: keys::fabric::PENDING });
    }
    let mut patch = json!({ "metadata": metadata });
    if let Some(t) = wanted_taints {
        patch["spec"] = json!({ "taints": if t.is_empty() { Value::Null } else { json!(t) } });
    }
    Some(patch)
}

fn others(taints: &[Taint]) -> Vec<Taint> {
    taints
        .iter()
        .filter(|t| t.key != keys::TAINT_FABRIC_UNHEALTHY)
        .cloned()
        .collect()
}

/// The Events a write of `upkeep` deserves on a node that carried `before` (its railguard
/// taint's value): the expiry, a taint set or changed, a taint lifted.
pub fn upkeep_events(upkeep: NodeUpkeep, before: Option<&str>, state: &str) -> Vec<NodeEvent> {
    let mut events = Vec::new();
    if upkeep.expire_label {
        events.push(NodeEvent {
            reason: "CertificationExpired",
            kind: "Warning",
            message: format!(
                "the certification expired: {}={} until the prober's next run passes",
                keys::LABEL_FABRIC,
                keys::fabric::PENDING
            ),
        });
    }
    match (upkeep.taint, before) {
        (TaintWanted::Set(reason), b) if b != Some(reason) => events.push(NodeEvent {
            reason: "FabricUnhealthyTainted",
            kind: "Warning",
            message: format!(
                "tainted {}={reason}:{TAINT_EFFECT} ({state}): pods without a toleration are \
                 kept off the node until a passing certificate lands",
                keys::TAINT_FABRIC_UNHEALTHY
            ),
        }),
        (TaintWanted::Clear, Some(_)) => events.push(NodeEvent {
            reason: "FabricUnhealthyCleared",
            kind: "Normal",
            message: format!("taint {} removed ({state})", keys::TAINT_FABRIC_UNHEALTHY),
        }),
        _ => {}
    }
    events
}

/// Where an invasive run of a profile with `certification.taints` stands, for the node's
/// prober: its taint repels every scheduler's pods for the run, not only railguard-aware
/// ones (the `pending` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunTaint {
    /// The run starts: tainted `testing`, unless already tainted for another reason.
    Testing,
    /// The run ended with this verdict: the `testing` taint becomes what the fleet
    /// controller would keep (`failed`, `degraded`) or goes (certified, or the node restored
    /// to its certificate, `pending`). A taint of another reason is the fleet controller's.
    Ended(Verdict),
    /// The run ended on a profile without `certification.taints`, or was abandoned: the
    /// `testing` taint goes, whatever the verdict (nothing else is the prober's to keep).
    Lifted,
}

/// The taint the fleet controller writes, given what its upkeep wants and the Node's taints:
/// a `testing` taint is the prober's, set for an invasive run and lifted by the prober when
/// the run ends, is abandoned, or at the prober's start. The controller never lifts it (on a
/// profile without `certification.taints` it would otherwise clear it mid-run and let every
/// scheduler place pods on GPUs under test); a verdict's taint may replace it.
pub fn fleet_taint_wanted(wanted: TaintWanted, taints: &[Taint]) -> TaintWanted {
    let testing =
        railguard_taint(taints).is_some_and(|t| t.value.as_deref() == Some(taint_reason::TESTING));
    match wanted {
        TaintWanted::Clear if testing => TaintWanted::Keep,
        other => other,
    }
}

/// An invasive run whose prober died (SIGKILL, OOM, its pod deleted) leaves its Node
/// marked: tainted `testing`, or `pending` over a certificate that is still valid. A prober
/// holds its profile's slot Lease for the whole run and takes it before marking the Node,
/// so a marked Node that no live slot Lease names (`run_alive` false) is orphaned, and the
/// fleet controller gives it back the state its certificate describes: never longer than
/// the Lease (60 s) plus one recomputation. Returns that merge patch (the label from the
/// certificate, the `testing` taint lifted; the Node at `resource_version`), or `None`.
pub fn orphaned_run_patch(
    fabric: &NodeFabric,
    taints: &[Taint],
    resource_version: Option<&str>,
    run_alive: bool,
    now: jiff::Timestamp,
) -> Option<Value> {
    if run_alive {
        return None;
    }
    let testing =
        railguard_taint(taints).is_some_and(|t| t.value.as_deref() == Some(taint_reason::TESTING));
    // `pending` over a valid certificate is a run's mark; over an expired one it is the
    // expiry flip, which stays.
    let label = match &fabric.state {
        FabricState::Pending {
            previous: Some(cert),
        } if !cert.is_expired(now) && cert.verdict != Verdict::Pending => {
            Some(cert.fabric_label(now))
        }
        _ => None,
    };
    if !testing && label.is_none() {
        return None;
    }
    let mut metadata = json!({ "resourceVersion": resource_version });
    if let Some(l) = label {
        metadata["labels"] = json!({ keys::LABEL_FABRIC: l });
    }
    let mut patch = json!({ "metadata": metadata });
    if testing {
        let t = others(taints);
        patch["spec"] = json!({ "taints": if t.is_empty() { Value::Null } else { json!(t) } });
    }
    Some(patch)
}

/// A Lease as [`holds_live_lease`] reads it: holder identity, renew time, duration (s).
pub type LeaseHold = (Option<String>, Option<jiff::Timestamp>, Option<i32>);

/// Whether `holder` holds a live Lease among `leases` at `now`, allowing `skew` for the
/// clocks of the prober and this controller.
pub fn holds_live_lease(
    holder: &str,
    leases: &[LeaseHold],
    now: jiff::Timestamp,
    skew: jiff::SignedDuration,
) -> bool {
    leases.iter().any(|(h, renewed, secs)| {
        h.as_deref() == Some(holder)
            && renewed.is_some_and(|r| {
                r + jiff::SignedDuration::from_secs(i64::from(secs.unwrap_or(0))) + skew > now
            })
    })
}

/// The merge patch for `run` on a Node carrying `taints`, or `None` when there is nothing to
/// change ([`upkeep_patch`] writes it).
pub fn run_taint_patch(
    run: RunTaint,
    taints: &[Taint],
    resource_version: Option<&str>,
) -> Option<Value> {
    let ours = railguard_taint(taints).and_then(|t| t.value.as_deref());
    let taint = match (run, ours) {
        (RunTaint::Testing, None) => TaintWanted::Set(taint_reason::TESTING),
        (RunTaint::Ended(v), Some(taint_reason::TESTING)) => match v {
            Verdict::Failed => TaintWanted::Set(taint_reason::FAILED),
            Verdict::Degraded => TaintWanted::Set(taint_reason::DEGRADED),
            Verdict::Certified | Verdict::Pending => TaintWanted::Clear,
        },
        (RunTaint::Lifted, Some(taint_reason::TESTING)) => TaintWanted::Clear,
        _ => return None,
    };
    upkeep_patch(
        NodeUpkeep {
            expire_label: false,
            taint,
        },
        taints,
        resource_version,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use k8s_openapi::api::core::v1::Node;

    const ISSUED: &str = "2026-01-01T00:00:00Z";
    const EXPIRES: &str = "2026-01-02T00:00:00Z";

    fn before_expiry() -> jiff::Timestamp {
        "2026-01-01T12:00:00Z".parse().unwrap()
    }
    fn after_expiry() -> jiff::Timestamp {
        "2026-01-02T00:00:01Z".parse().unwrap()
    }

    fn fabric(label: Option<&str>, verdict: Option<&str>, now: jiff::Timestamp) -> NodeFabric {
        let mut labels = serde_json::Map::new();
        if let Some(l) = label {
            labels.insert(keys::LABEL_FABRIC.into(), l.into());
        }
        let mut annotations = serde_json::Map::new();
        if let Some(v) = verdict {
            let cert = json!({
                "version": 1, "generation": 3, "issuedAt": ISSUED, "expiresAt": EXPIRES,
                "profile": "h100", "signature": "abc", "node": "gpu-a", "verdict": v,
                "reasons": [], "rails": [], "gpus": []
            });
            annotations.insert(keys::ANNOTATION_CERTIFICATE.into(), cert.to_string().into());
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "gpu-a", "labels": labels, "annotations": annotations}
        }))
        .unwrap();
        NodeFabric::from_node(&node, now)
    }

    const TAINTS: UpkeepPolicy = UpkeepPolicy {
        taints: true,
        filter_outliers: true,
        device_taints: false,
    };

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            time_added: None,
        }
    }

    #[test]
    fn a_run_whose_prober_died_is_given_back_its_certificates_state() {
        use crate::keys::fabric as label;
        let now = before_expiry();
        let testing = [taint(
            keys::TAINT_FABRIC_UNHEALTHY,
            taint_reason::TESTING,
            TAINT_EFFECT,
        )];
        let marked = fabric(Some(label::PENDING), Some("certified"), now);
        let p = orphaned_run_patch(&marked, &testing, Some("7"), false, now).unwrap();
        assert_eq!(
            p["metadata"]["labels"][keys::LABEL_FABRIC],
            label::CERTIFIED
        );
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert!(p["spec"]["taints"].is_null());
        // A live run is left alone; so are the expiry flip and a node that shows no run.
        assert!(orphaned_run_patch(&marked, &testing, None, true, now).is_none());
        let later = after_expiry();
        let flipped = fabric(Some(label::PENDING), Some("certified"), later);
        assert!(orphaned_run_patch(&flipped, &[], None, false, later).is_none());
        let certified = fabric(Some(label::CERTIFIED), Some("certified"), now);
        assert!(orphaned_run_patch(&certified, &[], None, false, now).is_none());
        // A failed node gets its label back; a testing taint alone is lifted.
        let failed = fabric(Some(label::PENDING), Some("failed"), now);
        let p = orphaned_run_patch(&failed, &[], None, false, now).unwrap();
        assert_eq!(p["metadata"]["labels"][keys::LABEL_FABRIC], label::FAILED);
        assert!(p.get("spec").is_none());
        let p = orphaned_run_patch(&certified, &testing, None, false, now).unwrap();
        assert!(p["metadata"].get("labels").is_none());
        assert!(p["spec"]["taints"].is_null());
        // Liveness: the holder, its renewal and the Lease's duration.
        let leases = [(
            Some("gpu-a".to_string()),
            Some(now - jiff::SignedDuration::from_secs(50)),
            Some(60),
        )];
        let skew = jiff::SignedDuration::from_secs(5);
        assert!(holds_live_lease("gpu-a", &leases, now, skew));
        assert!(!holds_live_lease("gpu-b", &leases, now, skew));
        let late = now + jiff::SignedDuration::from_secs(20);
        assert!(!holds_live_lease("gpu-a", &leases, late, skew));
    }

    #[test]
    fn each_unhealthy_state_gets_its_reason_and_a_passing_certificate_none() {
        let now = before_expiry();
        let cases = [
            (
                Some("failed"),
                Some("failed"),
                TaintWanted::Set(taint_reason::FAILED),
            ),
            (
                Some("degraded"),
                Some("degraded"),
                TaintWanted::Set(taint_reason::DEGRADED),
            ),
            (Some("certified"), Some("certified"), TaintWanted::Clear),
            // A run in progress (the prober's pending mark over a valid certificate): the
            // next verdict decides.
            (Some("pending"), Some("certified"), TaintWanted::Keep),
            (Some("pending"), Some("failed"), TaintWanted::Keep),
            (Some("pending"), None, TaintWanted::Keep),
            (None, None, TaintWanted::Clear),
            // Label and certificate disagree: unreadable, left alone.
            (Some("certified"), Some("failed"), TaintWanted::Keep),
        ];
        for (label, verdict, want) in cases {
            let u = node_upkeep(&fabric(label, verdict, now), TAINTS, false, now);
            assert_eq!(u.taint, want, "{label:?} {verdict:?}");
            assert!(!u.expire_label, "{label:?} {verdict:?}");
        }
    }

    #[test]
    fn an_expired_certification_is_flipped_to_pending_and_stays_tainted_until_renewed() {
        let now = after_expiry();
        let expired = fabric(Some("certified"), Some("certified"), now);
        assert!(matches!(expired.state, FabricState::Expired { .. }));
        let u = node_upkeep(&expired, TAINTS, false, now);
        assert_eq!(
            u,
            NodeUpkeep {
                expire_label: true,
                taint: TaintWanted::Set(taint_reason::EXPIRED)
            }
        );
        // After the flip: pending over the expired certificate, still expired.
        let flipped = fabric(Some("pending"), Some("certified"), now);
        let u = node_upkeep(&flipped, TAINTS, false, now);
        assert!(!u.expire_label);
        assert_eq!(u.taint, TaintWanted::Set(taint_reason::EXPIRED));
        // Without taints the label still flips: expiry is not opt-in.
        let off = UpkeepPolicy {
            taints: false,
            filter_outliers: true,
            device_taints: false,
        };
        let u = node_upkeep(&expired, off, false, now);
        assert!(u.expire_label);
        assert_eq!(u.taint, TaintWanted::Clear);
        // An expired degraded or failed certificate keeps its label (the prober's).
        for v in ["degraded", "failed"] {
            let u = node_upkeep(&fabric(Some(v), Some(v), now), TAINTS, false, now);
            assert!(!u.expire_label, "{v}");
        }
        // No label, an expired certificate: nothing to flip (the guard allows only
        // certified to pending).
        assert!(
            !node_upkeep(&fabric(None, Some("certified"), now), TAINTS, false, now).expire_label
        );
    }

    #[test]
    fn outliers_are_tainted_only_where_the_profile_filters_them() {
        let now = before_expiry();
        let certified = fabric(Some("certified"), Some("certified"), now);
        let u = node_upkeep(&certified, TAINTS, true, now);
        assert_eq!(u.taint, TaintWanted::Set(taint_reason::OUTLIER));
        let score = UpkeepPolicy {
            taints: true,
            filter_outliers: false,
            device_taints: false,
        };
        assert_eq!(
            node_upkeep(&certified, score, true, now).taint,
            TaintWanted::Clear
        );
    }

    #[test]
    fn the_patch_keeps_other_taints_and_is_guarded_by_the_resource_version() {
        let gpu = taint("nvidia.com/gpu", "present", "NoSchedule");
        let set = NodeUpkeep {
            expire_label: false,
            taint: TaintWanted::Set(taint_reason::FAILED),
        };
        let p = upkeep_patch(set, std::slice::from_ref(&gpu), Some("42")).unwrap();
        assert_eq!(
            p,
            json!({
                "metadata": {"resourceVersion": "42"},
                "spec": {"taints": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                    {"key": "railguard.io/fabric-unhealthy", "value": "failed", "effect": "NoSchedule"},
                ]}
            })
        );
        // Already carried: nothing to write.
        let ours = taint(keys::TAINT_FABRIC_UNHEALTHY, "failed", "NoSchedule");
        assert_eq!(
            upkeep_patch(set, &[gpu.clone(), ours.clone()], Some("43")),
            None
        );
        // A new reason replaces the value in place of the old taint.
        let expired = NodeUpkeep {
            expire_label: true,
            taint: TaintWanted::Set(taint_reason::EXPIRED),
        };
        let p = upkeep_patch(expired, &[ours.clone(), gpu.clone()], Some("44")).unwrap();
        assert_eq!(p["metadata"]["labels"][keys::LABEL_FABRIC], "pending");
        let taints = p["spec"]["taints"].as_array().unwrap();
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[1]["value"], "expired");
        // Cleared: the others stay; the last one gone removes the list.
        let clear = NodeUpkeep {
            expire_label: false,
            taint: TaintWanted::Clear,
        };
        let p = upkeep_patch(clear, &[ours.clone(), gpu.clone()], Some("45")).unwrap();
        assert_eq!(p["spec"]["taints"].as_array().unwrap().len(), 1);
        let p = upkeep_patch(clear, std::slice::from_ref(&ours), Some("46")).unwrap();
        assert_eq!(p["spec"]["taints"], Value::Null);
        assert_eq!(upkeep_patch(clear, &[gpu], Some("47")), None);
        // Keep writes nothing, unless the label flips.
        let keep = NodeUpkeep {
            expire_label: false,
            taint: TaintWanted::Keep,
        };
        assert_eq!(
            upkeep_patch(keep, std::slice::from_ref(&ours), Some("48")),
            None
        );
        let p = upkeep_patch(
            NodeUpkeep {
                expire_label: true,
                ..keep
            },
            &[ours],
            Some("49"),
        )
        .unwrap();
        assert!(p.get("spec").is_none(), "{p}");
    }

    #[test]
    fn events_say_what_changed() {
        let set = NodeUpkeep {
            expire_label: true,
            taint: TaintWanted::Set(taint_reason::EXPIRED),
        };
        let ev = upkeep_events(set, None, "expired");
        let reasons: Vec<_> = ev.iter().map(|e| e.reason).collect();
        assert_eq!(reasons, ["CertificationExpired", "FabricUnhealthyTainted"]);
        assert!(ev[1]
            .message
            .contains("railguard.io/fabric-unhealthy=expired:NoSchedule"));
        assert!(upkeep_events(
            NodeUpkeep {
                expire_label: false,
                ..set
            },
            Some("expired"),
            "expired"
        )
        .is_empty());
        let cleared = upkeep_events(
            NodeUpkeep {
                expire_label: false,
                taint: TaintWanted::Clear,
            },
            Some("failed"),
            "certified",
        );
        assert_eq!(cleared[0].reason, "FabricUnhealthyCleared");
        assert_eq!(cleared[0].kind, "Normal");
    }

    #[test]
    fn the_fleet_never_lifts_a_runs_testing_taint_and_the_prober_always_does() {
        let testing = taint(keys::TAINT_FABRIC_UNHEALTHY, "testing", "NoSchedule");
        let failed = taint(keys::TAINT_FABRIC_UNHEALTHY, "failed", "NoSchedule");
        let on = std::slice::from_ref(&testing);
        assert_eq!(
            fleet_taint_wanted(TaintWanted::Clear, on),
            TaintWanted::Keep
        );
        assert_eq!(
            fleet_taint_wanted(TaintWanted::Set(taint_reason::FAILED), on),
            TaintWanted::Set(taint_reason::FAILED)
        );
        assert_eq!(
            fleet_taint_wanted(TaintWanted::Clear, std::slice::from_ref(&failed)),
            TaintWanted::Clear
        );
        assert_eq!(
            fleet_taint_wanted(TaintWanted::Clear, &[]),
            TaintWanted::Clear
        );
        // Lifted: the testing taint goes whatever the run found; another is not the run's.
        let p = run_taint_patch(RunTaint::Lifted, on, Some("7")).unwrap();
        assert_eq!(p["spec"]["taints"], Value::Null, "{p}");
        assert_eq!(
            run_taint_patch(RunTaint::Lifted, std::slice::from_ref(&failed), Some("8")),
            None
        );
        assert_eq!(run_taint_patch(RunTaint::Lifted, &[], Some("9")), None);
    }

    #[test]
    fn an_invasive_run_is_tainted_testing_and_leaves_the_verdicts_taint() {
        let gpu = taint("nvidia.com/gpu", "present", "NoSchedule");
        let testing = taint(keys::TAINT_FABRIC_UNHEALTHY, "testing", "NoSchedule");
        let failed = taint(keys::TAINT_FABRIC_UNHEALTHY, "failed", "NoSchedule");
        let p = run_taint_patch(RunTaint::Testing, std::slice::from_ref(&gpu), Some("1")).unwrap();
        assert_eq!(p["spec"]["taints"][1]["value"], "testing");
        assert_eq!(p["metadata"]["resourceVersion"], "1");
        // Already tainted (failed, expired): it repels already, and stays the fleet's.
        assert_eq!(
            run_taint_patch(RunTaint::Testing, std::slice::from_ref(&failed), Some("2")),
            None
        );
        let ended = |v| {
            run_taint_patch(
                RunTaint::Ended(v),
                &[gpu.clone(), testing.clone()],
                Some("3"),
            )
        };
        assert_eq!(
            ended(Verdict::Certified).unwrap()["spec"]["taints"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            ended(Verdict::Pending).unwrap()["spec"]["taints"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            ended(Verdict::Failed).unwrap()["spec"]["taints"][1]["value"],
            "failed"
        );
        assert_eq!(
            ended(Verdict::Degraded).unwrap()["spec"]["taints"][1]["value"],
            "degraded"
        );
        // Not ours to lift: another reason, or none.
        assert_eq!(
            run_taint_patch(RunTaint::Ended(Verdict::Certified), &[failed], Some("4")),
            None
        );
        assert_eq!(
            run_taint_patch(RunTaint::Ended(Verdict::Certified), &[gpu], Some("5")),
            None
        );
    }
}
