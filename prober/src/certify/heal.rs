//! Passive healing (pure): a rail that a passive check failed is restored after
//! `certification.passiveHealWindows` (N) consecutive clean passive checks, not at the next
//! invasive run.
//!
//! The rule, per rail:
//! - Only passive faults hold a rail: `link-down`, `link-rate`, `errors` ([`is_passive_fault`]).
//!   A rail failed by anything else in a passive check (a finding on its device: `pcie`,
//!   `gpudirect`, `failed`), or failed before the passive failure (by an invasive test:
//!   `rdma`, `latency`, `gpudirect`, `pcie`, `wire`, `failed`), is failed as before passive
//!   healing existed: until an invasive run.
//! - The first passive failure holds the rail ([`PassiveHold`]): it is failed, and the hold
//!   remembers what it was before (`before`).
//! - Each clean check counts (`cleanWindows`). When the count reaches the windows required,
//!   N × 2^flaps capped at 8N ([`required_windows`]), the rail shows `before` again
//!   ([`RailChange::Healed`]). It stays held for as many clean checks again (probation), then
//!   the hold goes ([`RailChange::Released`]).
//! - Flap damping: a passive failure while held (failed or on probation) after at least one
//!   clean check fails the rail again, restarts the count and doubles the requirement
//!   (`flaps` + 1: N, 2N, 4N, 8N). Failing checks in a row are one failure (a link down for
//!   an hour is not sixty flaps): the count stays at 0, the requirement as it was.
//! - An invasive run judges every rail afresh: its certificate has no hold, so it clears the
//!   hold and the count of every rail (a rail it passes is restored there and then).
//! - N = 0: no hold; a passive pass keeps the earlier verdict (the old behaviour).
//!
//! Per node ([`NodePassiveHold`], in the certificate): the first passive rail failure that
//! holds a rail records the node's verdict and reasons before it. While a held rail is failed
//! the node is `degraded` (`failed` with no usable rail, or when it was failed before);
//! when every held rail has healed and nothing else failed, the node's verdict and reasons
//! return to those recorded. A node-level failure of a passive check, or a rail failure
//! passive healing does not heal, ends the node's hold: the node keeps its verdict until an
//! invasive run, as before.

use railguard_api::certificate::{NodeBefore, NodePassiveHold, PassiveHold, RailBefore};
use railguard_api::{Certificate, RailFault, RailResult, RailVerdict, Verdict};

use railguard_api::node::NodeEvent;

/// Each flap doubles the clean windows a held rail needs, at most this many times (N, 2N, 4N,
/// 8N).
pub const MAX_DOUBLINGS: u32 = 3;

/// The reason of the Event a passive heal records on the Node.
pub const HEALED_EVENT_REASON: &str = "RailHealedPassively";

/// The faults a passive check finds by itself, which passive healing heals: port down or
/// flapping, link layer or rate wrong, error counters growing.
pub fn is_passive_fault(f: RailFault) -> bool {
    matches!(
        f,
        RailFault::LinkDown | RailFault::LinkRate | RailFault::Errors
    )
}

/// Clean passive checks a held rail needs before it heals: `heal_windows` doubled once per
/// flap, at most [`MAX_DOUBLINGS`] times.
pub fn required_windows(heal_windows: u32, flaps: u32) -> u32 {
    heal_windows.saturating_mul(1u32 << flaps.min(MAX_DOUBLINGS))
}

/// What one passive check did to one rail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RailChange {
    /// Nothing held it before or after: a clean rail shows what it showed.
    Kept,
    /// Its first passive failure: failed and held.
    Held,
    /// A passive failure during its hold after at least one clean check: failed again, the
    /// count restarts, the requirement doubles.
    Flapped,
    /// Held and failed, failed again in this check: the same failure, still held.
    Failing,
    /// Clean, held and still failed: one more clean check.
    Counting,
    /// Clean for the checks required: shows what it was before the passive failure.
    Healed,
    /// Healed earlier and clean again: still held, a failure now is a flap.
    Probation,
    /// Clean as long again after its heal: the hold goes.
    Released,
    /// Failed by a passive fault but failed before it too (nothing to restore): failed, not
    /// held.
    Failed,
    /// Failed by something passive healing does not heal, or found failed by it: failed as
    /// before (until an invasive run), not held; the node's hold ends.
    NotHealable,
}

/// A rail after a passive check.
#[derive(Clone, Debug, PartialEq)]
pub struct RailStep {
    pub verdict: RailVerdict,
    pub reasons: Vec<String>,
    pub faults: Vec<RailFault>,
    pub hold: Option<PassiveHold>,
    pub change: RailChange,
}

/// One rail's passive check: `prev` is the rail in the last certificate (`None`: a rail it
/// does not list), `reasons` and `faults` what this check found wrong with it (empty: clean).
pub fn rail_step(
    heal_windows: u32,
    prev: Option<&RailResult>,
    reasons: Vec<String>,
    faults: Vec<RailFault>,
) -> RailStep {
    let kept = |hold: Option<PassiveHold>, change: RailChange| RailStep {
        verdict: prev.map_or(RailVerdict::Healthy, |p| p.verdict),
        reasons: prev.map(|p| p.reasons.clone()).unwrap_or_default(),
        faults: prev.map(|p| p.faults.clone()).unwrap_or_default(),
        hold,
        change,
    };
    let failed = !reasons.is_empty();
    let fail = |hold: Option<PassiveHold>, change: RailChange| RailStep {
        verdict: RailVerdict::Failed,
        reasons: reasons.clone(),
        faults: faults.clone(),
        hold,
        change,
    };
    if heal_windows == 0 {
        return if failed {
            fail(None, RailChange::Failed)
        } else {
            kept(None, RailChange::Kept)
        };
    }
    let hold = prev.and_then(|p| p.passive_hold.clone());
    if failed {
        if !faults.iter().copied().all(is_passive_fault) {
            return fail(None, RailChange::NotHealable);
        }
        return match hold {
            // Failed in the check before too: the same failure (a link down for an hour is
            // one failure, not sixty flaps).
            Some(h) if h.clean_windows == 0 => fail(Some(h), RailChange::Failing),
            Some(h) => fail(
                Some(PassiveHold {
                    clean_windows: 0,
                    flaps: h.flaps.saturating_add(1),
                    before: h.before,
                }),
                RailChange::Flapped,
            ),
            None => {
                let before = prev.map_or(
                    RailBefore {
                        verdict: RailVerdict::Healthy,
                        reasons: Vec::new(),
                        faults: Vec::new(),
                    },
                    |p| RailBefore {
                        verdict: p.verdict,
                        reasons: p.reasons.clone(),
                        faults: p.faults.clone(),
                    },
                );
                if before.verdict == RailVerdict::Failed {
                    fail(None, RailChange::Failed)
                } else {
                    fail(
                        Some(PassiveHold {
                            clean_windows: 0,
                            flaps: 0,
                            before,
                        }),
                        RailChange::Held,
                    )
                }
            }
        };
    }
    let (Some(h), Some(p)) = (hold, prev) else {
        return kept(None, RailChange::Kept);
    };
    // Something other than a passive check (or the campaign, whose `wire` blame every write
    // applies again) failed the rail meanwhile: passive healing no longer speaks for it.
    if p.faults
        .iter()
        .any(|f| !is_passive_fault(*f) && *f != RailFault::Wire)
    {
        return kept(None, RailChange::NotHealable);
    }
    let clean = h.clean_windows.saturating_add(1);
    let required = required_windows(heal_windows, h.flaps);
    let held = PassiveHold {
        clean_windows: clean,
        ..h
    };
    if p.verdict == RailVerdict::Failed {
        if clean >= required {
            RailStep {
                verdict: held.before.verdict,
                reasons: held.before.reasons.clone(),
                faults: held.before.faults.clone(),
                hold: Some(held),
                change: RailChange::Healed,
            }
        } else {
            kept(Some(held), RailChange::Counting)
        }
    } else if clean >= required.saturating_mul(2) {
        kept(None, RailChange::Released)
    } else {
        kept(Some(held), RailChange::Probation)
    }
}

/// The node as the last certificate left it.
#[derive(Clone, Copy, Debug, Default)]
pub struct PreviousNode<'a> {
    pub verdict: Option<Verdict>,
    pub reasons: &'a [String],
    pub hold: Option<&'a NodePassiveHold>,
}

/// The node after a passive check.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeStep {
    pub verdict: Verdict,
    pub reasons: Vec<String>,
    pub hold: Option<NodePassiveHold>,
    /// The verdict and reasons are the ones from before a passive failure, restored.
    pub restored: bool,
}

/// The node's verdict after a passive check: `node_failures` are the check's node-level
/// failures, `rail_failures` its rail failures (reasons), `rails` the rails after
/// [`rail_step`] with their `changes`, in the same order.
pub fn node_step(
    heal_windows: u32,
    previous: PreviousNode<'_>,
    node_failures: &[String],
    rail_failures: &[String],
    rails: &[RailResult],
    changes: &[RailChange],
) -> NodeStep {
    let usable = rails
        .iter()
        .filter(|r| r.verdict != RailVerdict::Failed)
        .count();
    // A rail that fails passively fails only itself while others pass (`degraded`); a node
    // failure, or every rail failing, fails the node; a pass keeps the earlier verdict.
    let legacy = || {
        let verdict = if !node_failures.is_empty() || usable == 0 {
            Verdict::Failed
        } else if rail_failures.is_empty() {
            previous.verdict.unwrap_or(Verdict::Pending)
        } else if previous.verdict == Some(Verdict::Failed) {
            Verdict::Failed
        } else {
            Verdict::Degraded
        };
        let mut reasons = node_failures.to_vec();
        reasons.extend(rail_failures.iter().cloned());
        NodeStep {
            verdict,
            reasons,
            hold: None,
            restored: false,
        }
    };
    let not_healable = !node_failures.is_empty() || changes.contains(&RailChange::NotHealable);
    if heal_windows == 0 || not_healable {
        return legacy();
    }
    let started = changes.iter().any(|c| {
        matches!(
            c,
            RailChange::Held | RailChange::Flapped | RailChange::Failing
        )
    });
    let hold = match previous.hold {
        Some(h) => h.clone(),
        None if started => NodePassiveHold {
            before: NodeBefore {
                verdict: previous.verdict.unwrap_or(Verdict::Pending),
                reasons: previous.reasons.to_vec(),
            },
        },
        None => return legacy(),
    };
    // Failed rails that passive healing holds, or that failed in this check.
    let failing: Vec<&RailResult> = rails
        .iter()
        .zip(changes)
        .filter(|(r, c)| {
            r.verdict == RailVerdict::Failed
                && (r.passive_hold.is_some() || **c == RailChange::Failed)
        })
        .map(|(r, _)| r)
        .collect();
    let held_failed = failing.iter().any(|r| r.passive_hold.is_some());
    if usable > 0 && !held_failed {
        return NodeStep {
            verdict: hold.before.verdict,
            reasons: hold.before.reasons,
            hold: None,
            restored: true,
        };
    }
    let verdict = if usable == 0 || hold.before.verdict == Verdict::Failed {
        Verdict::Failed
    } else {
        Verdict::Degraded
    };
    NodeStep {
        verdict,
        reasons: failing
            .iter()
            .flat_map(|r| r.reasons.iter().cloned())
            .collect(),
        hold: Some(hold),
        restored: false,
    }
}

/// The rails of `cert` that a passive check healed since `previous`: failed there, not
/// failed now, and still held (an invasive run leaves no hold).
pub fn healed_rails<'a>(cert: &'a Certificate, previous: &Certificate) -> Vec<&'a RailResult> {
    cert.rails
        .iter()
        .filter(|r| r.passive_hold.is_some() && r.verdict != RailVerdict::Failed)
        .filter(|r| {
            previous
                .rail(&r.hca, r.port)
                .is_some_and(|p| p.verdict == RailVerdict::Failed)
        })
        .collect()
}

/// The Event of a passive heal ([`HEALED_EVENT_REASON`]), when `cert` healed rails that
/// `previous` had failed.
pub fn heal_event(cert: &Certificate, previous: Option<&Certificate>) -> Option<NodeEvent> {
    let previous = previous?;
    let healed = healed_rails(cert, previous);
    if healed.is_empty() {
        return None;
    }
    let rails: Vec<String> = healed
        .iter()
        .map(|r| {
            let (clean, flaps) = r
                .passive_hold
                .as_ref()
                .map_or((0, 0), |h| (h.clean_windows, h.flaps));
            format!(
                "{} after {clean} consecutive clean passive checks ({flaps} further passive failures)",
                r.id()
            )
        })
        .collect();
    let node = if previous.verdict == cert.verdict {
        format!("node still {}", cert.verdict)
    } else {
        format!("node {} again (was {})", cert.verdict, previous.verdict)
    };
    Some(NodeEvent {
        reason: HEALED_EVENT_REASON,
        kind: "Normal",
        message: format!("rail {} healed passively; {node}", rails.join(", rail ")),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn rail(verdict: RailVerdict, faults: &[RailFault]) -> RailResult {
        let mut r: RailResult = serde_json::from_value(serde_json::json!({
            "hca": "mlx5_0", "port": 1, "state": "ACTIVE", "verdict": "healthy"
        }))
        .unwrap();
        r.verdict = verdict;
        r.faults = faults.to_vec();
        r.reasons = faults
            .iter()
            .map(|f| format!("rail mlx5_0:1: {}", f.as_str()))
            .collect();
        r
    }

    /// Applies a step to the rail, as a certificate does.
    fn apply(r: &RailResult, s: &RailStep) -> RailResult {
        RailResult {
            verdict: s.verdict,
            reasons: s.reasons.clone(),
            faults: s.faults.clone(),
            passive_hold: s.hold.clone(),
            ..r.clone()
        }
    }

    fn tick(n: u32, r: &RailResult) -> (RailResult, RailChange) {
        let s = rail_step(
            n,
            Some(r),
            vec!["rail mlx5_0:1: error counter symbol_error grew".into()],
            vec![RailFault::Errors],
        );
        (apply(r, &s), s.change)
    }

    fn clean(n: u32, r: &RailResult) -> (RailResult, RailChange) {
        let s = rail_step(n, Some(r), vec![], vec![]);
        (apply(r, &s), s.change)
    }

    #[test]
    fn windows_double_per_flap_up_to_eight_times() {
        assert_eq!(
            (0..6).map(|f| required_windows(5, f)).collect::<Vec<_>>(),
            vec![5, 10, 20, 40, 40, 40]
        );
        assert_eq!(required_windows(0, 2), 0);
        assert_eq!(required_windows(u32::MAX, 3), u32::MAX);
    }

    #[test]
    fn a_tick_holds_the_rail_and_n_clean_windows_restore_it() {
        let healthy = rail(RailVerdict::Healthy, &[]);
        let (mut r, change) = tick(3, &healthy);
        assert_eq!(change, RailChange::Held);
        assert_eq!(r.verdict, RailVerdict::Failed);
        assert_eq!(r.faults, vec![RailFault::Errors]);
        let hold = r.passive_hold.clone().unwrap();
        assert_eq!((hold.clean_windows, hold.flaps), (0, 0));
        assert_eq!(hold.before.verdict, RailVerdict::Healthy);
        for i in 1..3 {
            let (next, change) = clean(3, &r);
            r = next;
            assert_eq!(change, RailChange::Counting);
            assert_eq!(r.verdict, RailVerdict::Failed, "clean window {i}");
            assert_eq!(r.passive_hold.as_ref().unwrap().clean_windows, i);
        }
        let (healed, change) = clean(3, &r);
        assert_eq!(change, RailChange::Healed);
        assert_eq!(healed.verdict, RailVerdict::Healthy);
        assert!(healed.reasons.is_empty() && healed.faults.is_empty());
        // Still held (probation) for as many clean windows again, then released.
        let mut r = healed;
        for _ in 0..2 {
            let (next, change) = clean(3, &r);
            assert_eq!(change, RailChange::Probation);
            r = next;
        }
        let (released, change) = clean(3, &r);
        assert_eq!(change, RailChange::Released);
        assert_eq!(released.passive_hold, None);
        assert_eq!(released.verdict, RailVerdict::Healthy);
        assert_eq!(clean(3, &released).1, RailChange::Kept);
    }

    #[test]
    fn failing_checks_in_a_row_are_one_failure() {
        let (mut r, _) = tick(2, &rail(RailVerdict::Healthy, &[]));
        for _ in 0..10 {
            let (next, change) = tick(2, &r);
            assert_eq!(change, RailChange::Failing);
            r = next;
        }
        let hold = r.passive_hold.clone().unwrap();
        assert_eq!((hold.clean_windows, hold.flaps), (0, 0));
        let (r, _) = clean(2, &r);
        assert_eq!(clean(2, &r).1, RailChange::Healed);
    }

    #[test]
    fn a_tick_during_the_hold_restarts_the_count_and_doubles_the_requirement() {
        let n = 2;
        let (r, _) = tick(n, &rail(RailVerdict::Degraded, &[]));
        let (r, _) = clean(n, &r);
        // A tick before the heal: flap 1, count 0, 2N required.
        let (mut r, change) = tick(n, &r);
        assert_eq!(change, RailChange::Flapped);
        let hold = r.passive_hold.clone().unwrap();
        assert_eq!((hold.clean_windows, hold.flaps), (0, 1));
        assert_eq!(hold.before.verdict, RailVerdict::Degraded, "before is kept");
        for _ in 0..3 {
            r = clean(n, &r).0;
            assert_eq!(r.verdict, RailVerdict::Failed);
        }
        let (healed, change) = clean(n, &r);
        assert_eq!(change, RailChange::Healed);
        assert_eq!(healed.verdict, RailVerdict::Degraded, "restored to before");
        // A tick on probation is a flap too: 4N, then 8N, then 8N.
        let (r, change) = tick(n, &healed);
        assert_eq!(change, RailChange::Flapped);
        assert_eq!(r.passive_hold.as_ref().unwrap().flaps, 2);
        let mut r = r;
        for flaps in 3..6 {
            r = clean(n, &r).0;
            r = tick(n, &r).0;
            assert_eq!(r.passive_hold.as_ref().unwrap().flaps, flaps);
        }
        let mut windows = 0;
        while r.verdict == RailVerdict::Failed {
            r = clean(n, &r).0;
            windows += 1;
        }
        assert_eq!(windows, 8 * n);
    }

    #[test]
    fn an_invasive_failure_is_never_healed_passively() {
        // Failed by an invasive test, then a passive tick: nothing to restore, no hold.
        let rdma = rail(RailVerdict::Failed, &[RailFault::Rdma]);
        let (r, change) = tick(1, &rdma);
        assert_eq!(change, RailChange::Failed);
        assert_eq!(r.passive_hold, None);
        for _ in 0..10 {
            let (next, change) = clean(1, &r);
            assert_eq!(change, RailChange::Kept);
            assert_eq!(next.verdict, RailVerdict::Failed);
        }
        // Failed in a passive check by a finding on its device (pcie): not held either, and
        // a held rail that gets such a fault loses its hold.
        let (held, _) = tick(1, &rail(RailVerdict::Healthy, &[]));
        let s = rail_step(
            1,
            Some(&held),
            vec!["rail mlx5_0:1: pcie-downgrade".into()],
            vec![RailFault::Pcie, RailFault::Errors],
        );
        assert_eq!(s.change, RailChange::NotHealable);
        assert_eq!((s.verdict, s.hold), (RailVerdict::Failed, None));
        // Someone else's non-passive fault on a held rail (not the campaign's wire): the hold
        // goes, the rail stays failed.
        let mut other = held.clone();
        other.faults.push(RailFault::Gpudirect);
        let (r, change) = clean(1, &other);
        assert_eq!(change, RailChange::NotHealable);
        assert_eq!((r.verdict, r.passive_hold), (RailVerdict::Failed, None));
        let mut wire = held.clone();
        wire.faults.push(RailFault::Wire);
        assert_eq!(clean(1, &wire).1, RailChange::Healed);
    }

    #[test]
    fn zero_windows_keep_the_old_behaviour() {
        let (r, change) = tick(0, &rail(RailVerdict::Healthy, &[]));
        assert_eq!(change, RailChange::Failed);
        assert_eq!(
            (r.verdict, r.passive_hold.clone()),
            (RailVerdict::Failed, None)
        );
        for _ in 0..100 {
            assert_eq!(clean(0, &r).0.verdict, RailVerdict::Failed);
        }
        // A hold left from a profile with healing is dropped, the rail shown as it is.
        let (held, _) = tick(5, &rail(RailVerdict::Healthy, &[]));
        let (r, change) = clean(0, &held);
        assert_eq!(change, RailChange::Kept);
        assert_eq!((r.verdict, r.passive_hold), (RailVerdict::Failed, None));
    }

    #[test]
    fn the_node_returns_to_its_verdict_before_when_every_held_rail_healed() {
        let prev_reasons = vec!["rail mlx5_1:1: RDMA write bandwidth regressed".to_string()];
        let healthy = rail(RailVerdict::Healthy, &[]);
        let (failed, change) = tick(1, &healthy);
        let step = node_step(
            1,
            PreviousNode {
                verdict: Some(Verdict::Degraded),
                reasons: &prev_reasons,
                hold: None,
            },
            &[],
            &failed.reasons,
            &[failed.clone(), healthy.clone()],
            &[change, RailChange::Kept],
        );
        assert_eq!(step.verdict, Verdict::Degraded);
        assert_eq!(step.reasons, failed.reasons);
        let hold = step.hold.clone().unwrap();
        assert_eq!(hold.before.verdict, Verdict::Degraded);
        assert_eq!(hold.before.reasons, prev_reasons);
        // Every rail failed: failed, still held.
        let all = node_step(
            1,
            PreviousNode {
                verdict: Some(Verdict::Degraded),
                reasons: &[],
                hold: Some(&hold),
            },
            &[],
            &[],
            &[failed.clone(), failed.clone()],
            &[RailChange::Counting, RailChange::Counting],
        );
        assert_eq!((all.verdict, all.hold.is_some()), (Verdict::Failed, true));
        // Healed: the verdict and reasons from before.
        let (healed, change) = clean(1, &failed);
        let back = node_step(
            1,
            PreviousNode {
                verdict: Some(Verdict::Degraded),
                reasons: &failed.reasons,
                hold: Some(&hold),
            },
            &[],
            &[],
            &[healed, healthy.clone()],
            &[change, RailChange::Kept],
        );
        assert_eq!(back.verdict, Verdict::Degraded);
        assert_eq!(back.reasons, prev_reasons);
        assert!(back.restored);
        assert_eq!(back.hold, None);
        // A node-level failure ends the hold: no restoring later.
        let node = node_step(
            1,
            PreviousNode {
                verdict: Some(Verdict::Degraded),
                reasons: &[],
                hold: Some(&hold),
            },
            &["layout differs".to_string()],
            &[],
            &[failed.clone(), healthy],
            &[RailChange::Counting, RailChange::Kept],
        );
        assert_eq!((node.verdict, node.hold), (Verdict::Failed, None));
    }
}
