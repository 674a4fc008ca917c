//! The certification policy: pure functions from evidence, profile and history to a verdict
//! with reasons. Every reason names the rail (or NCCL run), the measured value and the
//! expected one.
//!
//! Failed: a hard rule is broken (missing or down rail, wrong link layer or rate, error
//! counters growing, a measurement below the profile's threshold, `#wrong > 0`, socket
//! fallback, missing GPUDirect where expected, NCCL errors, wrong HCAs, a layout that is not
//! the profile's, the RDMA resource not advertised). Degraded: every hard rule holds but a
//! figure dropped beyond the profile's tolerance below the node's own history median.
//! Certified: neither.
//!
//! A passive check's failure of a rail heals after `certification.passiveHealWindows` clean
//! checks (the rule and its flap damping: [`super::heal`]).

use std::collections::{BTreeMap, BTreeSet};

use railguard_api::certificate::{GpuMemoryResult, HistoryEntry, NodePassiveHold};
use railguard_api::{
    FabricProfileSpec, NcclResult, RailFault, RailResult, RailSpec, RailVerdict, Transport, Verdict,
};

use super::evidence::{
    watched_counters, Evidence, NcclRunEvidence, PortReading, RailBench, RUN_GDR_OFF, RUN_MAIN,
    RUN_NVLINK,
};
use super::heal::{node_step, rail_step, PreviousNode};
use super::history::{history_medians, software_changes, HistoryMedians};
use crate::nccl::round2;

/// A control run with GPUDirect disabled must reach at most this share of the main plateau.
pub const GDR_CONTROL_MAX_RATIO: f64 = 0.95;

/// The outcome of judging evidence.
#[derive(Clone, Debug, PartialEq)]
pub struct Assessment {
    pub verdict: Verdict,
    /// Node-level reasons, rail reasons included (prefixed with the rail).
    pub reasons: Vec<String>,
    pub rails: Vec<RailResult>,
    pub nccl: Option<NcclResult>,
    /// At least one figure regressed against the node's history.
    pub regressed: bool,
    /// Rails that passed the hard rules ([`railguard_api::Certificate::usable_rails`]).
    pub usable_rails: u32,
    /// The findings the certificate records (the fatal ones are also in `reasons`).
    pub findings: Vec<railguard_api::Finding>,
    /// After a passive check: the node's passive hold to record (its verdict before a
    /// passive rail failure); `None` after an invasive run, which clears it.
    pub passive_hold: Option<NodePassiveHold>,
    /// After a passive check: `verdict` and `reasons` are the node's from before a passive
    /// failure, restored because every held rail healed (the certificate takes the reasons
    /// even when empty).
    pub restored: bool,
}

#[derive(Default)]
struct Findings {
    /// Hard failures of the node as a whole (a failed node).
    failures: Vec<String>,
    /// Hard failures of single rails (prefixed with the rail): the node stays usable on its
    /// other rails (`degraded`) unless no rail passes.
    rail_failures: Vec<String>,
    /// The NCCL loopback's bandwidth below the threshold: a node failure, except on a node
    /// with failed rails, whose loopback crossed them and so says nothing about the others.
    nccl_bandwidth: Vec<String>,
    /// Profile rails the NCCL loopback did not use (NCCL skips ports that are not ACTIVE).
    nccl_unused: BTreeSet<String>,
    /// Fatal findings about one rail's own devices (its HCA, its GPU's link), by rail: they
    /// fail that rail, not the node.
    rail_findings: BTreeMap<String, Vec<(RailFault, String)>>,
    regressions: Vec<String>,
    /// Drops the whole fleet shares (fleet drift): said, not held against the node.
    fleet_wide: Vec<String>,
}

/// Where a regression goes: the node's blame, or, when its profile's whole fleet drifted on
/// that measurement (`status.fleet.drift`), a note that does not degrade the node.
fn regressed_or_fleet_wide(
    drifting: &BTreeSet<String>,
    measurement: &railguard_api::fleet::Measurement,
    regression: String,
    node_regressions: &mut Vec<String>,
    fleet_wide: &mut Vec<String>,
) {
    if drifting.contains(&measurement.to_string()) {
        fleet_wide.push(format!(
            "{regression}; the profile's whole fleet dropped on {measurement} (fleet drift), so it is not held against this node"
        ));
    } else {
        node_regressions.push(regression);
    }
}

/// Passive checks of one rail: presence, state, link layer, rate, counter growth.
pub fn check_rail_passive(
    rail: &RailSpec,
    before: Option<&PortReading>,
    after: Option<&PortReading>,
    allowed_growth: &BTreeMap<String, u64>,
    watched: &BTreeSet<String>,
) -> (Vec<(RailFault, String)>, BTreeMap<String, u64>) {
    let id = rail.id();
    let mut out = Vec::new();
    let Some(now) = after else {
        out.push((
            RailFault::LinkDown,
            format!(
                "rail {id}: port not found (expected {} {} Gb/s)",
                rail.link_layer, rail.rate_gbps
            ),
        ));
        return (out, BTreeMap::new());
    };
    if now.state != "ACTIVE" {
        out.push((
            RailFault::LinkDown,
            format!(
                "rail {id}: port state {}, expected ACTIVE",
                if now.state.is_empty() {
                    "unknown"
                } else {
                    &now.state
                }
            ),
        ));
    }
    if let Some(phys) = &now.phys_state {
        if !phys.contains("LinkUp") {
            out.push((
                RailFault::LinkDown,
                format!(
                    "rail {id}: physical state {:?}, expected LinkUp",
                    phys.trim()
                ),
            ));
        }
    }
    match now.link_layer {
        Some(ll) if ll == rail.link_layer => {}
        Some(ll) => out.push((
            RailFault::LinkRate,
            format!("rail {id}: link layer {ll}, expected {}", rail.link_layer),
        )),
        None => out.push((
            RailFault::LinkRate,
            format!(
                "rail {id}: link layer unknown, expected {}",
                rail.link_layer
            ),
        )),
    }
    match now.rate_gbps {
        Some(r) if r + 0.5 >= f64::from(rail.rate_gbps) => {}
        Some(r) => out.push((
            RailFault::LinkRate,
            format!(
                "rail {id}: link rate {} Gb/s, expected {} Gb/s",
                fmt_num(r),
                rail.rate_gbps
            ),
        )),
        None => out.push((
            RailFault::LinkRate,
            format!(
                "rail {id}: link rate unknown, expected {} Gb/s",
                rail.rate_gbps
            ),
        )),
    }
    let mut deltas = BTreeMap::new();
    if let Some(start) = before {
        for name in watched {
            let (Some(&a), Some(&b)) = (start.counters.get(name), now.counters.get(name)) else {
                continue;
            };
            // A counter below its earlier value was reset (or wrapped): count from zero.
            let delta = if b >= a { b - a } else { b };
            if delta == 0 {
                continue;
            }
            deltas.insert(name.clone(), delta);
            let allowed = allowed_growth.get(name).copied().unwrap_or(0);
            if delta > allowed {
                out.push((RailFault::Errors, format!(
                    "rail {id}: error counter {name} grew by {delta} during the check window (allowed {allowed})"
                )));
            }
        }
    }
    (out, deltas)
}

fn reading<'a>(list: &'a [PortReading], rail: &RailSpec) -> Option<&'a PortReading> {
    list.iter()
        .find(|r| r.hca == rail.hca && r.port == rail.port)
}

/// Judges a full (invasive) certification run.
pub fn assess(
    profile: &FabricProfileSpec,
    evidence: &Evidence,
    history: &[HistoryEntry],
) -> Assessment {
    assess_in_fleet(profile, evidence, history, &BTreeSet::new())
}

/// [`assess`], with the measurements on which the profile's fleet drifted (keys of
/// `status.fleet.drift`, e.g. `writeBwHost/mlx5_0:1`): a drop below the node's own history
/// that the whole fleet shares (a driver or firmware roll-out) does not degrade the node.
pub fn assess_in_fleet(
    profile: &FabricProfileSpec,
    evidence: &Evidence,
    history: &[HistoryEntry],
    drifting: &BTreeSet<String>,
) -> Assessment {
    use railguard_api::fleet::{Measurement, MeasurementKind};
    let t = &profile.thresholds;
    let watched = watched_counters(t);
    let medians = history_medians(history, profile.certification.history_depth as usize);
    let tolerance = t.regression_tolerance_percent;
    let mut node = Findings::default();
    common_checks(profile, evidence, &mut node);

    let mut rails = Vec::new();
    for spec in &profile.rails {
        let id = spec.id();
        let before = reading(&evidence.before, spec);
        let after = reading(&evidence.after, spec);
        let (mut failures, deltas) =
            check_rail_passive(spec, before, after, &t.counter_growth, &watched);
        failures.extend(node.rail_findings.remove(&id).unwrap_or_default());
        let mut regressions = Vec::new();
        let bench = evidence
            .benches
            .iter()
            .find(|b| b.hca == spec.hca && b.port == spec.port);
        match bench {
            None => failures.push((
                RailFault::Rdma,
                format!("rail {id}: no RDMA write measurement"),
            )),
            Some(RailBench { error: Some(e), .. }) => failures.push((
                RailFault::Rdma,
                format!("rail {id}: RDMA write test failed: {e}"),
            )),
            Some(b) => {
                match b.write_bw_host_gbps {
                    Some(bw) if bw >= t.write_bw_host_gbps => {
                        if let Some(m) = medians.rail_write_bw_gbps.get(&id) {
                            if let Some(r) = regression(
                                &format!("rail {id}: RDMA write bandwidth (host memory)"),
                                bw,
                                *m,
                                tolerance,
                                "Gb/s",
                            ) {
                                regressed_or_fleet_wide(
                                    drifting,
                                    &Measurement::rail(MeasurementKind::WriteBwHost, &id),
                                    r,
                                    &mut regressions,
                                    &mut node.fleet_wide,
                                );
                            }
                        }
                    }
                    Some(bw) => failures.push((RailFault::Rdma, format!(
                        "rail {id}: RDMA write bandwidth (host memory) {} Gb/s, expected at least {} Gb/s",
                        fmt_num(bw),
                        fmt_num(t.write_bw_host_gbps)
                    ))),
                    None => failures.push((RailFault::Rdma, format!(
                        "rail {id}: RDMA write bandwidth (host memory) not measured, expected at least {} Gb/s",
                        fmt_num(t.write_bw_host_gbps)
                    ))),
                }
                match (t.write_bw_gpu_gbps, b.write_bw_gpu_gbps) {
                    (Some(min), Some(bw)) if bw < min => failures.push((RailFault::Gpudirect, format!(
                        "rail {id}: RDMA write bandwidth (GPU memory) {} Gb/s, expected at least {} Gb/s",
                        fmt_num(bw),
                        fmt_num(min)
                    ))),
                    // The profile asks for GPUDirect RDMA: not measurable is not certified.
                    (Some(min), None) => failures.push((RailFault::Gpudirect, format!(
                        "rail {id}: RDMA write bandwidth (GPU memory) not measured ({}), the profile requires at least {} Gb/s",
                        b.gpu_unavailable.as_deref().unwrap_or("no GPU serves this rail"),
                        fmt_num(min)
                    ))),
                    _ => {}
                }
                if let (Some(max), Some(lat)) = (t.max_latency_us, b.latency_us) {
                    if lat > max {
                        failures.push((
                            RailFault::Latency,
                            format!(
                                "rail {id}: RDMA write latency {} us, expected at most {} us",
                                fmt_num(lat),
                                fmt_num(max)
                            ),
                        ));
                    }
                }
            }
        }
        let verdict = if !failures.is_empty() {
            RailVerdict::Failed
        } else if !regressions.is_empty() {
            RailVerdict::Degraded
        } else {
            RailVerdict::Healthy
        };
        let faults = rail_faults(&failures);
        let failures: Vec<String> = failures.into_iter().map(|(_, r)| r).collect();
        node.rail_failures.extend(failures.iter().cloned());
        node.regressions.extend(regressions.iter().cloned());
        let mut reasons = failures;
        reasons.extend(regressions);
        rails.push(RailResult {
            hca: spec.hca.clone(),
            port: spec.port,
            pci_address: after.and_then(|r| r.pci_address.clone()),
            sriov_vfs: after.map(|r| r.sriov_vfs.clone()).unwrap_or_default(),
            link_layer: after.and_then(|r| r.link_layer),
            state: after.map(|r| r.state.clone()).unwrap_or_default(),
            rate_gbps: after.and_then(|r| r.rate_gbps),
            write_bw_host_gbps: bench.and_then(|b| b.write_bw_host_gbps).map(round2),
            write_bw_gpu_gbps: bench.and_then(|b| b.write_bw_gpu_gbps).map(round2),
            latency_us: bench.and_then(|b| b.latency_us).map(round2),
            gid_index: bench.and_then(|b| b.gid_index),
            counter_deltas: deltas,
            verdict,
            reasons,
            faults,
            wire: Vec::new(),
            gpu_memory: bench.and_then(gpu_memory_result),
            passive_hold: None,
        });
    }

    let nccl = nccl_checks(profile, &evidence.nccl, &medians, drifting, &mut node);
    let mut assessment = finish(node, rails, nccl, history, &evidence.software);
    assessment.findings = evidence.findings.clone();
    assessment
}

/// What the certificate records of a rail's GPU-memory test: only a measured one (a rail
/// that could not measure says why in its reasons when the profile requires it).
fn gpu_memory_result(bench: &RailBench) -> Option<GpuMemoryResult> {
    let reg = bench.gpu_registration.as_ref()?;
    Some(GpuMemoryResult {
        gpu: reg.gpu,
        registration: reg.path.as_str().to_string(),
        unavailable: reg.failed.iter().map(ToString::to_string).collect(),
        latency_us: bench.latency_gpu_us.map(round2),
        far_gpu: bench.far_gpu.as_ref().map(|f| f.gpu),
        far_write_bw_gbps: bench
            .far_gpu
            .as_ref()
            .and_then(|f| f.write_bw_gbps)
            .map(round2),
    })
}

/// Judges a passive check (counters, link state, exposure) against the last certificate's
/// verdict and rails, without the node's passive hold ([`assess_passive_against`] has it): a
/// passive failure fails the rail at once; a pass keeps the earlier verdict, except that a
/// rail held by a passive failure heals after `certification.passiveHealWindows` clean checks
/// ([`super::heal`]).
pub fn assess_passive(
    profile: &FabricProfileSpec,
    evidence: &Evidence,
    previous_verdict: Option<Verdict>,
    previous_rails: &[RailResult],
) -> Assessment {
    passive_assessment(
        profile,
        evidence,
        PreviousNode {
            verdict: previous_verdict,
            reasons: &[],
            hold: None,
        },
        previous_rails,
    )
}

/// Judges a passive check against the last certificate (`None`: there is none): a passive
/// failure fails the rail at once (the node `degraded` while other rails pass); a pass keeps
/// the earlier verdict (only an invasive run can certify), except that passive healing
/// ([`super::heal`], `certification.passiveHealWindows`) restores a rail held by a passive
/// failure after enough clean checks, and the node to its verdict before once every held
/// rail has healed.
pub fn assess_passive_against(
    profile: &FabricProfileSpec,
    evidence: &Evidence,
    previous: Option<&railguard_api::Certificate>,
) -> Assessment {
    let hold = previous.and_then(railguard_api::Certificate::passive_hold);
    passive_assessment(
        profile,
        evidence,
        PreviousNode {
            verdict: previous.map(|c| c.verdict),
            reasons: previous.map_or(&[], |c| c.reasons.as_slice()),
            hold: hold.as_ref(),
        },
        previous.map_or(&[], |c| c.rails.as_slice()),
    )
}

fn passive_assessment(
    profile: &FabricProfileSpec,
    evidence: &Evidence,
    previous: PreviousNode<'_>,
    previous_rails: &[RailResult],
) -> Assessment {
    let t = &profile.thresholds;
    let heal_windows = profile.certification.passive_heal_windows;
    let watched = watched_counters(t);
    let mut node = Findings::default();
    common_checks(profile, evidence, &mut node);
    let mut rails = Vec::new();
    let mut changes = Vec::new();
    for spec in &profile.rails {
        let before = reading(&evidence.before, spec);
        let after = reading(&evidence.after, spec);
        let (mut failures, deltas) =
            check_rail_passive(spec, before, after, &t.counter_growth, &watched);
        failures.extend(node.rail_findings.remove(&spec.id()).unwrap_or_default());
        if let Some(why) = evidence.grey.get(&spec.id()) {
            failures.push((RailFault::Grey, format!("rail {}: {why}", spec.id())));
        }
        let prev = previous_rails
            .iter()
            .find(|r| r.hca == spec.hca && r.port == spec.port);
        let faults = rail_faults(&failures);
        let failures: Vec<String> = failures.into_iter().map(|(_, r)| r).collect();
        node.rail_failures.extend(failures.iter().cloned());
        let step = rail_step(heal_windows, prev, failures, faults);
        changes.push(step.change);
        rails.push(RailResult {
            hca: spec.hca.clone(),
            port: spec.port,
            pci_address: after
                .and_then(|r| r.pci_address.clone())
                .or_else(|| prev.and_then(|p| p.pci_address.clone())),
            sriov_vfs: after.map(|r| r.sriov_vfs.clone()).unwrap_or_default(),
            link_layer: after.and_then(|r| r.link_layer),
            state: after.map(|r| r.state.clone()).unwrap_or_default(),
            rate_gbps: after.and_then(|r| r.rate_gbps),
            write_bw_host_gbps: prev.and_then(|p| p.write_bw_host_gbps),
            write_bw_gpu_gbps: prev.and_then(|p| p.write_bw_gpu_gbps),
            latency_us: prev.and_then(|p| p.latency_us),
            gid_index: prev.and_then(|p| p.gid_index),
            counter_deltas: deltas,
            verdict: step.verdict,
            reasons: step.reasons,
            faults: step.faults,
            wire: prev.map(|p| p.wire.clone()).unwrap_or_default(),
            gpu_memory: prev.and_then(|p| p.gpu_memory.clone()),
            passive_hold: step.hold,
        });
    }
    let usable = rails
        .iter()
        .filter(|r| r.verdict != RailVerdict::Failed)
        .count();
    let step = node_step(
        heal_windows,
        previous,
        &node.failures,
        &node.rail_failures,
        &rails,
        &changes,
    );
    Assessment {
        verdict: step.verdict,
        reasons: step.reasons,
        rails,
        nccl: None,
        regressed: false,
        usable_rails: usable as u32,
        findings: evidence.findings.clone(),
        passive_hold: step.hold,
        restored: step.restored,
    }
}

/// The rail a fatal finding is about, with its fault class, when it names one rail's own
/// device: the rail (`mlx5_4:1`), its HCA's PCI function, or the PCI address of a GPU whose
/// preferred HCA it is. A PCIe link below its capability there is the rail's `pcie` fault; a
/// detoured or unregistrable GPU path its `gpudirect` fault. Anything else stays the node's.
fn finding_rail(
    profile: &FabricProfileSpec,
    evidence: &Evidence,
    f: &railguard_api::Finding,
) -> Option<(String, RailFault)> {
    use railguard_api::FindingKind as K;
    let subject = f.subject.trim();
    let rail = profile
        .rails
        .iter()
        .map(RailSpec::id)
        .find(|id| id == subject)
        .or_else(|| {
            let addr = railguard_api::dra::normalize_pci_address(subject);
            evidence
                .after
                .iter()
                .find(|p| {
                    p.pci_address
                        .as_deref()
                        .is_some_and(|a| railguard_api::dra::normalize_pci_address(a) == addr)
                })
                .map(PortReading::id)
                .or_else(|| evidence.gpu_rails.get(&addr).cloned())
        })
        .filter(|id| profile.rails.iter().any(|r| r.id() == *id))?;
    let fault = match f.kind {
        K::PcieDowngrade => RailFault::Pcie,
        K::AcsRedirect | K::GpuMemoryRegistration | K::FarNic => RailFault::Gpudirect,
        K::PortDown => RailFault::LinkDown,
        K::PortRateLow => RailFault::LinkRate,
        _ => RailFault::Failed,
    };
    Some((rail, fault))
}

fn common_checks(profile: &FabricProfileSpec, evidence: &Evidence, node: &mut Findings) {
    for f in railguard_api::finding::fatal_findings(
        &evidence.findings,
        &profile.certification.fatal_findings,
    ) {
        let reason = railguard_api::finding::finding_reason(f);
        match finding_rail(profile, evidence, f) {
            Some((rail, fault)) => {
                let text = format!("rail {rail}: {reason}");
                node.rail_findings
                    .entry(rail)
                    .or_default()
                    .push((fault, text));
            }
            None => node.failures.push(reason),
        }
    }
    let expected = profile.signature();
    if let Some(sig) = &evidence.layout_signature {
        if *sig != expected {
            node.failures.push(format!(
                "rail layout signature {sig} differs from the profile's {expected}"
            ));
        }
    }
    if let (Some(rdma), Some(exposure)) = (&profile.rdma, &evidence.exposure) {
        let advertised = exposure
            .allocatable
            .as_deref()
            .is_some_and(|q| !q.trim().is_empty() && q.trim() != "0");
        let missing: Vec<String> = profile
            .rails
            .iter()
            .filter(|r| reading(&evidence.after, r).is_none())
            .map(RailSpec::id)
            .collect();
        if !advertised && missing.is_empty() {
            node.failures.push(format!(
                "node does not advertise RDMA resource {} in allocatable (found {})",
                rdma.resource_name,
                exposure.allocatable.as_deref().unwrap_or("none")
            ));
        } else if advertised && !missing.is_empty() {
            node.failures.push(format!(
                "node advertises RDMA resource {} ({}) but lacks the profile's rails {}",
                rdma.resource_name,
                exposure.allocatable.as_deref().unwrap_or(""),
                missing.join(", ")
            ));
        }
    }
}

fn nccl_checks(
    profile: &FabricProfileSpec,
    runs: &[NcclRunEvidence],
    medians: &HistoryMedians,
    drifting: &BTreeSet<String>,
    node: &mut Findings,
) -> Option<NcclResult> {
    let t = &profile.thresholds;
    let spec = &profile.certification.nccl_tests;
    let Some(main) = runs.iter().find(|r| r.label == RUN_MAIN) else {
        node.failures
            .push("NCCL loopback did not run (no NCCL evidence)".to_string());
        return None;
    };
    let obs = match &main.outcome {
        Ok(o) => o,
        Err(e) => {
            node.failures.push(format!("NCCL loopback failed: {e}"));
            return None;
        }
    };
    let mut result = obs.to_result();
    if let Some(n) = obs.ranks() {
        if n < 2 {
            node.failures.push(format!(
                "NCCL ran {n} rank: one rank moves no byte (busbw 0) and uses no NIC; the loopback needs one rank per GPU (ncclTests.args without -g; for the native runner, CUDA must see every GPU of the node)"
            ));
        }
    }
    if !obs.log.intra_node.is_empty() {
        let via: Vec<&str> = obs.log.intra_node.iter().map(String::as_str).collect();
        node.failures.push(format!(
            "NCCL loopback connected GPUs through {} instead of the NICs: NCCL_P2P_DISABLE/NCCL_SHM_DISABLE did not take effect",
            via.join(", ")
        ));
    } else if obs.log.nccl_lines > 0
        && obs.log.net_channels == 0
        && obs.log.net == Some(Transport::Ib)
    {
        node.failures.push(
            "NCCL log shows no channel through the network: the loopback did not cross a NIC"
                .to_string(),
        );
    }
    if let Some(w) = obs.wrong() {
        if w > 0 {
            node.failures.push(format!(
                "NCCL all_reduce reported #wrong {w}, expected 0 (data corruption)"
            ));
        }
    }
    match obs.log.net {
        Some(Transport::Ib) => {}
        Some(Transport::Socket) => node.failures.push(
            "NCCL fell back to NET/Socket, expected NET/IB: the run did not use RDMA".to_string(),
        ),
        _ => node.failures.push(
            "NCCL log shows no network transport, expected NET/IB: the run did not cross the fabric"
                .to_string(),
        ),
    }
    if spec.expect_gdr && obs.log.net != Some(Transport::Socket) {
        match obs.log.gdr {
            Some(true) => {}
            Some(false) => node.failures.push(
                "GPUDirect RDMA not in use (NCCL network channels lack GDRDMA), profile expects it"
                    .to_string(),
            ),
            None => node
                .failures
                .push("GPUDirect RDMA not shown in the NCCL log, profile expects it".to_string()),
        }
    }
    match obs.busbw_plateau_gbps() {
        Some(p) if p >= t.busbw_plateau_gbps => {
            if let Some(m) = medians.busbw_plateau_gbps {
                if let Some(r) = regression(
                    "NCCL busbw plateau",
                    p,
                    m,
                    t.regression_tolerance_percent,
                    "GB/s",
                ) {
                    regressed_or_fleet_wide(
                        drifting,
                        &railguard_api::fleet::Measurement::node(
                            railguard_api::fleet::MeasurementKind::BusbwPlateau,
                        ),
                        r,
                        &mut node.regressions,
                        &mut node.fleet_wide,
                    );
                }
            }
        }
        Some(p) => node.nccl_bandwidth.push(format!(
            "NCCL loopback busbw plateau {} GB/s, expected at least {} GB/s",
            fmt_num(round2(p)),
            fmt_num(t.busbw_plateau_gbps)
        )),
        None => node
            .failures
            .push("NCCL output has no busbw plateau".to_string()),
    }
    for e in &obs.log.errors {
        node.failures.push(format!("NCCL error: {e}"));
    }
    if !obs.log.hcas.is_empty() {
        let expected: BTreeSet<String> = profile.rails.iter().map(RailSpec::id).collect();
        let used: BTreeSet<String> = obs.log.hcas.iter().map(|h| normalize_hca(h)).collect();
        let extra: Vec<&String> = used.difference(&expected).collect();
        let unused: Vec<&String> = expected.difference(&used).collect();
        if !extra.is_empty() {
            node.failures.push(format!(
                "NCCL used HCAs outside the profile: {}",
                join(&extra)
            ));
        }
        node.nccl_unused.extend(unused.into_iter().cloned());
    }
    if let Some(nvlink) = runs.iter().find(|r| r.label == RUN_NVLINK) {
        match (&nvlink.outcome, t.nvlink_busbw_gbps) {
            (Ok(o), want) => {
                let got = o.busbw_plateau_gbps();
                result.nvlink_busbw_gbps = got.map(round2);
                match (got, want) {
                    (Some(p), Some(w)) if p < w => node.failures.push(format!(
                        "NCCL NVLink run busbw plateau {} GB/s, expected at least {} GB/s",
                        fmt_num(round2(p)),
                        fmt_num(w)
                    )),
                    (None, Some(_)) => node
                        .failures
                        .push("NCCL NVLink run output has no busbw plateau".to_string()),
                    _ => {}
                }
            }
            (Err(e), Some(_)) => node.failures.push(format!("NCCL NVLink run failed: {e}")),
            // Recorded only: no threshold to judge it by.
            (Err(_), None) => {}
        }
    }
    if let Some(off) = runs.iter().find(|r| r.label == RUN_GDR_OFF) {
        match (&off.outcome, obs.busbw_plateau_gbps()) {
            (Ok(o), Some(main_bw)) => {
                if let Some(off_bw) = o.busbw_plateau_gbps() {
                    if off_bw > main_bw * GDR_CONTROL_MAX_RATIO {
                        node.failures.push(format!(
                            "GDR negative control (NCCL_NET_GDR_LEVEL=LOC) reached {} GB/s vs {} GB/s with GDR: GPUDirect RDMA is not what carries the traffic",
                            fmt_num(round2(off_bw)),
                            fmt_num(round2(main_bw))
                        ));
                    }
                }
            }
            (Err(e), _) => node
                .failures
                .push(format!("GDR negative control run failed: {e}")),
            _ => {}
        }
    }
    Some(result)
}

/// `mlx5_0` (NCCL may print no port) becomes `mlx5_0:1`.
fn normalize_hca(h: &str) -> String {
    if h.contains(':') {
        h.to_string()
    } else {
        format!("{h}:1")
    }
}

fn join(v: &[&String]) -> String {
    v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

/// A reason when `measured` is more than `tolerance_percent` below the history `median`.
pub fn regression(
    what: &str,
    measured: f64,
    median: f64,
    tolerance_percent: f64,
    unit: &str,
) -> Option<String> {
    if median <= 0.0 {
        return None;
    }
    let drop = (median - measured) / median * 100.0;
    if drop > tolerance_percent {
        Some(format!(
            "{what} {} {unit} is {:.1}% below this node's history median {} {unit} (tolerance {}%)",
            fmt_num(round2(measured)),
            drop,
            fmt_num(round2(median)),
            fmt_num(tolerance_percent)
        ))
    } else {
        None
    }
}

fn finish(
    node: Findings,
    rails: Vec<RailResult>,
    nccl: Option<NcclResult>,
    history: &[HistoryEntry],
    software: &BTreeMap<String, String>,
) -> Assessment {
    let failed: BTreeSet<String> = rails
        .iter()
        .filter(|r| r.verdict == RailVerdict::Failed)
        .map(RailResult::id)
        .collect();
    let usable = rails.len() - failed.len();
    // Some rails failed, others passed: the node serves on the passing ones (`degraded`),
    // and a loopback that crossed the failed rails is not held against it.
    let partial = !failed.is_empty() && usable > 0;
    let mut failures = node.failures;
    let mut explained = Vec::new();
    let unused_failed = node.nccl_unused.iter().all(|r| failed.contains(r));
    if !node.nccl_unused.is_empty() {
        let unused: Vec<&String> = node.nccl_unused.iter().collect();
        let text = format!("NCCL did not use the profile's rails {}", join(&unused));
        if partial && unused_failed {
            explained.push(format!("{text} (they failed)"));
        } else {
            failures.push(text);
        }
    }
    for b in node.nccl_bandwidth {
        if partial {
            explained.push(format!(
                "{b} (the loopback crossed the failed rails {})",
                failed.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        } else {
            failures.push(b);
        }
    }
    let verdict = if !failures.is_empty() || (!failed.is_empty() && usable == 0) {
        Verdict::Failed
    } else if partial || !node.regressions.is_empty() {
        Verdict::Degraded
    } else {
        Verdict::Certified
    };
    let regressed = !node.regressions.is_empty();
    let mut reasons = failures;
    if partial {
        reasons.push(format!(
            "{usable} of {} rails usable: failed {}",
            rails.len(),
            failed.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    reasons.extend(node.rail_failures);
    reasons.extend(node.regressions);
    reasons.extend(explained);
    reasons.extend(node.fleet_wide);
    if verdict != Verdict::Certified {
        if let Some(changes) = software_changes(history, software) {
            reasons.push(format!("changed since the last pass: {changes}"));
        }
    }
    Assessment {
        verdict,
        reasons,
        rails,
        nccl,
        regressed,
        usable_rails: usable as u32,
        findings: Vec::new(),
        passive_hold: None,
        restored: false,
    }
}

/// The classes of a rail's failures, in order, each once.
fn rail_faults(failures: &[(RailFault, String)]) -> Vec<RailFault> {
    let mut out = Vec::new();
    for (f, _) in failures {
        if !out.contains(f) {
            out.push(*f);
        }
    }
    out
}

/// Numbers in reasons: integers without decimals, others with up to two.
pub fn fmt_num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}
