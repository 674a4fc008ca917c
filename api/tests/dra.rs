//! Rails to DRA devices and verdicts to DeviceTaintRules, over slices shaped as dranet and
//! NVIDIA's GPU DRA driver publish them (fixtures/dra/SOURCE.md).
#![allow(clippy::unwrap_used)] // test fixtures: a bad one fails loudly

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use railguard_api::dra::{
    self, plan_rules, rail_devices, rail_taint_reasons, rule_name, rule_object, wanted_rules,
    DeviceKind, DraSpec, DraTaintEffect, ExistingRule, ResourceSlice, TaintReason,
};
use railguard_api::{
    Certificate, FabricState, GpuAffinity, NodeFabric, PathType, RailFault, RailResult,
    RailVerdict, Verdict,
};

const NODE: &str = "gpu-node-a";

fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/fixtures/dra/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn slices() -> Vec<ResourceSlice> {
    #[derive(serde::Deserialize)]
    struct List {
        items: Vec<ResourceSlice>,
    }
    fixture::<List>("slices-gpu-node-a.json").items
}

#[derive(serde::Deserialize)]
struct Layout {
    gpus: Vec<String>,
    nics: Vec<String>,
    vf: String,
    roots: Vec<String>,
}

fn now() -> Timestamp {
    "2026-12-05T12:00:00Z".parse().unwrap()
}

/// The node's certificate as the prober writes it: NVML's bus ids (8-digit domain, upper
/// case), sysfs PCI addresses of the HCAs, rail 0's VF.
fn certificate(verdict: Verdict) -> Certificate {
    let l: Layout = fixture("layout-gpu-node-a.json");
    let issued = now() - jiff::SignedDuration::from_hours(1);
    let rails = (0..8)
        .map(|i| RailResult {
            hca: format!("mlx5_{i}"),
            port: 1,
            pci_address: Some(l.nics[i].clone()),
            sriov_vfs: if i == 0 { vec![l.vf.clone()] } else { vec![] },
            link_layer: None,
            state: "ACTIVE".into(),
            rate_gbps: Some(400.0),
            write_bw_host_gbps: Some(390.0),
            write_bw_gpu_gbps: Some(380.0),
            latency_us: None,
            gid_index: None,
            counter_deltas: BTreeMap::new(),
            verdict: RailVerdict::Healthy,
            reasons: vec![],
            faults: vec![],
            wire: vec![],
            gpu_memory: None,
            passive_hold: None,
        })
        .collect();
    let gpus = (0..8)
        .map(|i| GpuAffinity {
            gpu: i as u32,
            pci_bus_id: Some(format!("0000{}", l.gpus[i].to_uppercase())),
            preferred_hca: format!("mlx5_{i}"),
            port: Some(1),
            path: PathType::Pix,
            numa: Some(u32::from(i >= 4)),
        })
        .collect();
    Certificate {
        version: 1,
        generation: 3,
        issued_at: issued,
        expires_at: issued + jiff::SignedDuration::from_hours(24),
        profile: "h100-ndr".into(),
        signature: "v1-abc".into(),
        node: Some(NODE.into()),
        verdict,
        usable_rails: Some(8),
        reasons: vec![],
        rails,
        gpus,
        nccl: None,
        findings: vec![],
        software: BTreeMap::new(),
        passive_checked_at: None,
        history: vec![],
        simulated: false,
        renewal: None,
        extra: BTreeMap::new(),
    }
}

fn fabric(state: FabricState) -> NodeFabric {
    NodeFabric {
        name: NODE.into(),
        profile: Some("h100-ndr".into()),
        signature: None,
        state,
        labels: BTreeMap::new(),
        allocatable: BTreeMap::new(),
        fleet_outlier: None,
    }
}

fn fail_rail(cert: &mut Certificate, i: usize, fault: RailFault) {
    cert.rails[i].verdict = RailVerdict::Failed;
    cert.rails[i].faults = vec![fault];
    cert.verdict = Verdict::Degraded;
    cert.usable_rails = Some(7);
}

#[test]
fn every_rail_maps_to_its_nic_its_vfs_and_its_gpu_under_one_pcie_root() {
    let l: Layout = fixture("layout-gpu-node-a.json");
    let all = slices();
    let refs: Vec<&ResourceSlice> = all.iter().collect();
    let cert = certificate(Verdict::Certified);
    let devices = rail_devices(NODE, &cert, &refs, &DraSpec::default());
    assert_eq!(devices.len(), 8);
    for (i, rd) in devices.iter().enumerate() {
        assert_eq!(rd.rail, format!("mlx5_{i}:1"));
        let pf = format!("pci-{}", l.nics[i].replace([':', '.'], "-"));
        let mut want_nics = vec![pf];
        if i == 0 {
            want_nics.push(format!("pci-{}", l.vf.replace([':', '.'], "-")));
        }
        let got: Vec<&str> = rd.nics.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(
            got, want_nics,
            "rail {i}: only the current pool generation, only dra.net"
        );
        assert!(rd
            .nics
            .iter()
            .all(|d| d.driver == "dra.net" && d.pool == NODE && d.kind == DeviceKind::Nic));
        assert_eq!(rd.gpus.len(), 1, "rail {i}");
        assert_eq!(rd.gpus[0].device, format!("gpu-{i}"));
        assert_eq!(rd.gpus[0].driver, "gpu.nvidia.com");
        // GPU and NIC of a rail share the root complex the claims align on.
        assert_eq!(rd.gpus[0].pcie_root.as_deref(), Some(l.roots[i].as_str()));
        assert_eq!(rd.nics[0].pcie_root.as_deref(), Some(l.roots[i].as_str()));
    }
}

#[test]
fn drivers_the_profile_does_not_name_are_left_alone() {
    let all = slices();
    let refs: Vec<&ResourceSlice> = all.iter().collect();
    let cert = certificate(Verdict::Certified);
    let spec = DraSpec {
        nic_driver: "other.example.com".into(),
        gpu_driver: String::new(),
        ..DraSpec::default()
    };
    let devices = rail_devices(NODE, &cert, &refs, &spec);
    assert!(devices.iter().all(|d| d.gpus.is_empty()));
    // The third driver's slice holds rail 2's NIC (by PCI address) and nothing else.
    let with: Vec<&str> = devices
        .iter()
        .filter(|d| !d.nics.is_empty())
        .map(|d| d.rail.as_str())
        .collect();
    assert_eq!(with, vec!["mlx5_2:1"]);
}

#[test]
fn an_old_certificate_without_pci_addresses_matches_nics_by_rdma_device() {
    let all = slices();
    let refs: Vec<&ResourceSlice> = all.iter().collect();
    let mut cert = certificate(Verdict::Certified);
    for r in &mut cert.rails {
        r.pci_address = None;
        r.sriov_vfs.clear();
    }
    let devices = rail_devices(NODE, &cert, &refs, &DraSpec::default());
    assert_eq!(devices[3].nics.len(), 1);
    assert_eq!(devices[3].nics[0].device, "pci-0000-5b-00-0");
}

fn rules_for(
    state: FabricState,
    spec: &DraSpec,
    outliers: &BTreeSet<String>,
) -> Vec<dra::WantedRule> {
    let all = slices();
    let refs: Vec<&ResourceSlice> = all.iter().collect();
    let f = fabric(state);
    let cert = f.state.certificate().unwrap().clone();
    let devices = rail_devices(NODE, &cert, &refs, spec);
    let reasons = rail_taint_reasons(&f, spec, outliers, now());
    wanted_rules(NODE, &devices, &reasons, spec.taint_effect)
}

#[test]
fn a_failed_link_taints_the_rails_nics_and_a_gpudirect_fault_its_gpu_too() {
    let spec = DraSpec::default();
    let healthy = rules_for(
        FabricState::Certified(Box::new(certificate(Verdict::Certified))),
        &spec,
        &BTreeSet::new(),
    );
    assert!(healthy.is_empty());

    let mut cert = certificate(Verdict::Degraded);
    fail_rail(&mut cert, 0, RailFault::LinkDown);
    let rules = rules_for(
        FabricState::Degraded(Box::new(cert)),
        &spec,
        &BTreeSet::new(),
    );
    let devices: Vec<&str> = rules.iter().map(|r| r.device.device.as_str()).collect();
    assert_eq!(devices.len(), 2, "{devices:?}");
    assert!(devices.contains(&"pci-0000-17-00-0") && devices.contains(&"pci-0000-17-00-2"));
    assert!(rules
        .iter()
        .all(|r| r.value == "link-down" && r.effect == DraTaintEffect::NoSchedule));

    let mut cert = certificate(Verdict::Degraded);
    fail_rail(&mut cert, 5, RailFault::Gpudirect);
    let rules = rules_for(
        FabricState::Degraded(Box::new(cert)),
        &spec,
        &BTreeSet::new(),
    );
    let devices: BTreeSet<&str> = rules.iter().map(|r| r.device.device.as_str()).collect();
    assert_eq!(devices, BTreeSet::from(["pci-0000-aa-00-0", "gpu-5"]));
    assert!(rules
        .iter()
        .all(|r| r.value == "gpudirect" && r.rail == "mlx5_5:1"));
}

#[test]
fn expiry_pending_and_outliers_follow_the_profile() {
    let mut cert = certificate(Verdict::Certified);
    cert.expires_at = now() - jiff::SignedDuration::from_mins(5);
    let expired = FabricState::Expired {
        certificate: Box::new(cert.clone()),
        expired_for_secs: 300,
    };
    let spec = DraSpec::default();
    let rules = rules_for(expired.clone(), &spec, &BTreeSet::new());
    assert_eq!(rules.len(), 8 + 1 + 8, "every NIC, the VF and every GPU");
    assert!(rules.iter().all(|r| r.value == "expired"));
    let off = DraSpec {
        taint_expired: false,
        ..DraSpec::default()
    };
    assert!(rules_for(expired, &off, &BTreeSet::new()).is_empty());

    // Pending (a run in progress) over a valid certificate: tainted only past the grace.
    let pending = || FabricState::Pending {
        previous: Some(Box::new(certificate(Verdict::Certified))),
    };
    assert!(rules_for(pending(), &spec, &BTreeSet::new()).is_empty());
    let grace = DraSpec {
        pending_grace_seconds: Some(600),
        ..DraSpec::default()
    };
    let rules = rules_for(pending(), &grace, &BTreeSet::new());
    assert!(!rules.is_empty() && rules.iter().all(|r| r.value == "pending"));

    // Outliers: only with taintOutliers, only the rail named.
    let outliers = BTreeSet::from(["mlx5_3:1".to_string()]);
    let certified = || FabricState::Certified(Box::new(certificate(Verdict::Certified)));
    assert!(rules_for(certified(), &spec, &outliers).is_empty());
    let on = DraSpec {
        taint_outliers: true,
        taint_effect: DraTaintEffect::None,
        ..DraSpec::default()
    };
    let rules = rules_for(certified(), &on, &outliers);
    assert_eq!(rules.len(), 1);
    assert_eq!(
        (rules[0].value.as_str(), rules[0].effect),
        ("outlier", DraTaintEffect::None)
    );
}

#[test]
fn rules_are_named_deterministically_applied_in_place_and_deleted_when_unwanted() {
    let spec = DraSpec::default();
    let mut cert = certificate(Verdict::Degraded);
    fail_rail(&mut cert, 2, RailFault::Rdma);
    let rules = rules_for(
        FabricState::Degraded(Box::new(cert.clone())),
        &spec,
        &BTreeSet::new(),
    );
    assert_eq!(rules.len(), 1);
    let r = &rules[0];
    assert_eq!(r.name, rule_name(NODE, &r.device));
    assert!(r.name.starts_with("railguard-gpu-node-a-pci-0000-49-00-0-"));
    assert!(r.name.len() <= 253);
    let obj = rule_object(r);
    assert_eq!(obj["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(obj["spec"]["deviceSelector"]["driver"], "dra.net");
    assert_eq!(obj["spec"]["deviceSelector"]["pool"], NODE);
    assert_eq!(obj["spec"]["taint"]["key"], dra::TAINT_KEY);
    assert_eq!(obj["spec"]["taint"]["value"], "rdma");
    assert_eq!(obj["metadata"]["labels"][dra::LABEL_NODE], NODE);
    assert_eq!(obj["metadata"]["labels"][dra::LABEL_RAIL], "mlx5_2.1");

    // Fail → taint.
    let plan = plan_rules(&rules, &[]);
    assert_eq!((plan.apply.len(), plan.delete.len()), (1, 0));
    // Unchanged → nothing to write.
    let existing = vec![ExistingRule::from_object(&obj).unwrap()];
    assert_eq!(plan_rules(&rules, &existing), Default::default());
    // The profile changes the effect → updated in place (same name).
    let noexec = DraSpec {
        taint_effect: DraTaintEffect::NoExecute,
        ..DraSpec::default()
    };
    let changed = rules_for(
        FabricState::Degraded(Box::new(cert)),
        &noexec,
        &BTreeSet::new(),
    );
    let plan = plan_rules(&changed, &existing);
    assert_eq!(plan.apply.len(), 1);
    assert_eq!(plan.apply[0].name, r.name);
    assert!(plan.delete.is_empty());
    // Recovered, or the node is gone → deleted.
    let plan = plan_rules(&[], &existing);
    assert_eq!(plan.delete, vec![r.name.clone()]);
}

#[test]
fn long_names_stay_valid_and_distinct() {
    let d = |driver: &str| dra::DeviceRef {
        kind: DeviceKind::Nic,
        driver: driver.into(),
        pool: "p".into(),
        device: "pci-0000-17-00-0".into(),
        pcie_root: None,
    };
    let node = "n".repeat(250);
    let a = rule_name(&node, &d("dra.net"));
    let b = rule_name(&node, &d("sriovnet.example.com"));
    assert!(a.len() <= 253 && b.len() <= 253);
    assert_ne!(a, b);
    assert_eq!(a, rule_name(&node, &d("dra.net")));
    assert!(a
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'));
}

#[test]
fn nvml_bus_ids_normalize_to_the_standard_attribute_form() {
    assert_eq!(
        dra::normalize_pci_address("00000000:1B:00.0"),
        "0000:1b:00.0"
    );
    assert_eq!(dra::normalize_pci_address("0000:1b:00.0"), "0000:1b:00.0");
    assert_eq!(
        dra::normalize_pci_address(" 0000:CA:00.1\n"),
        "0000:ca:00.1"
    );
    assert_eq!(
        TaintReason::Failed(RailFault::LinkDown).value(),
        "link-down"
    );
}
