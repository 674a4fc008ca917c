//! Synthetic sysfs trees for every shipped node model and fault, read by the real discovery
//! code, with the expected affinity map, rails, signature and findings.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use railguard_api::{FabricProfile, LinkLayer, PathType};
use railguard_prober::discover::{
    discover, profile_for, Discovery, FindingKind, NicRole, PortState, ProfileDefaults, Severity,
};
use railguard_sim::{bump_counters, write_sysfs, Fault, NodeModel};

fn model_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(format!("{name}.yaml"))
}

fn load(name: &str) -> NodeModel {
    NodeModel::load(&model_path(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn discover_model(name: &str) -> (tempfile::TempDir, Discovery) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_sysfs(&load(name), dir.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let d = discover(dir.path(), false).unwrap_or_else(|e| panic!("{name}: {e}"));
    (dir, d)
}

fn api_profile(file: &str) -> FabricProfile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../api/fixtures/profiles")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("profile fixture");
    railguard_api::profiles_from_yaml(&text)
        .expect("valid profile")
        .remove(0)
}

fn preferred(d: &Discovery) -> Vec<(String, Option<u32>, PathType)> {
    d.affinity
        .gpus
        .iter()
        .map(|g| {
            let p = g.preferred.as_ref().expect("every GPU has a NIC");
            (p.hca.clone(), p.port, p.path)
        })
        .collect()
}

fn names(d: &Discovery) -> Vec<String> {
    preferred(d).into_iter().map(|(h, _, _)| h).collect()
}

fn kinds_at_least(d: &Discovery, s: Severity) -> Vec<(FindingKind, String)> {
    let mut v: Vec<_> = d
        .findings_at_least(s)
        .map(|f| (f.kind, f.subject.clone()))
        .collect();
    v.sort();
    v
}

const H100_RAILS: [&str; 8] = [
    "mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11",
];

fn h100_rails() -> Vec<String> {
    H100_RAILS.iter().map(|s| s.to_string()).collect()
}

#[test]
fn dgx_h100_matches_the_h100_ndr_profile() {
    let (_dir, d) = discover_model("dgx-h100");
    assert_eq!(d.gpus.len(), 8);
    // InfiniBand: NCCL never reads a GID index there, so none is chosen.
    assert!(d.rails.iter().all(|r| r.gid_index.is_none()));
    let pref = preferred(&d);
    for (i, (hca, port, path)) in pref.iter().enumerate() {
        assert_eq!(hca, H100_RAILS[i], "GPU{i}");
        assert_eq!(*port, Some(1));
        assert_eq!(*path, PathType::Pxb, "GPU{i}");
    }
    let numa: Vec<Option<u32>> = d.affinity.gpus.iter().map(|g| g.numa).collect();
    assert_eq!(numa, [0, 0, 0, 0, 1, 1, 1, 1].map(Some));
    // Alternates: the other compute rails of the same socket, NODE away; never storage NICs.
    let alts: Vec<&str> = d.affinity.gpus[0]
        .alternates
        .iter()
        .map(|a| a.hca.as_str())
        .collect();
    assert_eq!(alts, ["mlx5_3", "mlx5_4", "mlx5_5"]);
    assert!(d.affinity.gpus[0]
        .alternates
        .iter()
        .all(|a| a.path == PathType::Node));
    let storage: Vec<&str> = d
        .nics
        .iter()
        .filter(|n| n.role == NicRole::Storage)
        .map(|n| n.hca.as_str())
        .collect();
    assert_eq!(storage, ["mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8"]);
    let profile = api_profile("dgx-h100-ndr.yaml");
    assert_eq!(d.signature(), profile.spec.signature());
    assert!(
        kinds_at_least(&d, Severity::Warning).is_empty(),
        "{:#?}",
        d.findings
    );
    // Readiness positives are still reported, with evidence.
    let reg = d
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::GpuMemoryRegistration)
        .expect("registration finding");
    assert!(reg.message.contains("nvidia_peermem"));
    assert!(reg
        .evidence
        .iter()
        .any(|e| e.contains("sys/module/nvidia_peermem present")));
    assert!(d
        .findings
        .iter()
        .any(|f| f.kind == FindingKind::GpuIndexOrder));
    // Ports carry their netdev, GID and counters.
    let rail0 = &d
        .hcas
        .iter()
        .find(|h| h.name == "mlx5_0")
        .expect("mlx5_0")
        .ports[0];
    assert_eq!(rail0.netdev.as_deref(), Some("ibp24s0"));
    assert!(rail0
        .gid0
        .as_deref()
        .is_some_and(|g| g.starts_with("fe80:")));
    assert_eq!(rail0.counters.get("symbol_error"), Some(&0));
    assert!(rail0.hw_counters.contains_key("out_of_sequence"));
}

#[test]
fn emit_profile_for_h100_reproduces_the_example_rails() {
    let (_dir, d) = discover_model("dgx-h100");
    let emitted = profile_for(&d, "h100-ndr", &ProfileDefaults::default());
    emitted.validate().expect("emitted profile is valid");
    let example = api_profile("dgx-h100-ndr.yaml");
    assert_eq!(emitted.spec.rails, example.spec.rails);
    assert_eq!(emitted.spec.signature(), example.spec.signature());
    // The loopback is bounded by one 400 Gb/s rail: 50 GB/s, 90% of it.
    assert_eq!(emitted.spec.thresholds.busbw_plateau_gbps, 45.0);
    assert_eq!(emitted.spec.thresholds.write_bw_host_gbps, 360.0);
}

#[test]
fn dgx_a100_ties_are_broken_into_distinct_rails() {
    let (_dir, d) = discover_model("dgx-a100");
    assert_eq!(
        names(&d),
        ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
    );
    assert!(preferred(&d).iter().all(|(_, _, p)| *p == PathType::Pxb));
    // GPU0's switch partner NIC is its PXB alternate.
    let alts: Vec<_> = d.affinity.gpus[0]
        .alternates
        .iter()
        .map(|a| (a.hca.as_str(), a.path))
        .collect();
    assert_eq!(alts, [("mlx5_1", PathType::Pxb)]);
    let profile = api_profile("dgx-a100-hdr.yaml");
    assert_eq!(d.signature(), profile.spec.signature());
    assert!(d.rails.iter().all(|r| r.rate_gbps == Some(200.0)));
    let emitted = profile_for(&d, "a100-hdr", &ProfileDefaults::default());
    assert_eq!(emitted.spec.rails, profile.spec.rails);
    assert!(
        kinds_at_least(&d, Severity::Warning).is_empty(),
        "{:#?}",
        d.findings
    );
}

#[test]
fn roce_cloud_pix_pairs_with_netdevs_and_dma_buf() {
    let (_dir, d) = discover_model("roce-cloud");
    let pref = preferred(&d);
    for (i, (hca, _, path)) in pref.iter().enumerate() {
        assert_eq!(hca, &format!("mlx5_{i}"));
        assert_eq!(*path, PathType::Pix);
    }
    assert!(d
        .rails
        .iter()
        .all(|r| r.link_layer == Some(LinkLayer::Roce)));
    // mlx5's table (v1, v2 link-local; v1, v2 IPv4): NCCL's choice is the IPv4 v2 entry.
    let gids: Vec<Option<u32>> = d.rails.iter().map(|r| r.gid_index).collect();
    assert_eq!(gids, vec![Some(3); 8]);
    let profile = api_profile("roce-cloud.yaml");
    assert_eq!(d.signature(), profile.spec.signature());
    let emitted = profile_for(&d, "roce-cloud", &ProfileDefaults::default());
    assert_eq!(
        emitted.spec.rails, profile.spec.rails,
        "netdevs gpuNrdma0 included"
    );
    let reg = d
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::GpuMemoryRegistration)
        .expect("registration finding");
    assert_eq!(reg.severity, Severity::Info);
    assert!(reg.message.contains("DMA-BUF"), "{}", reg.message);
    assert!(
        kinds_at_least(&d, Severity::Warning).is_empty(),
        "{:#?}",
        d.findings
    );
}

#[test]
fn fault_hca_on_the_far_socket() {
    let (_dir, d) = discover_model("h100-hca-far-socket");
    let pref = preferred(&d);
    // GPU5 lost its PXB rail; the closest compute NICs are NODE, all taken once, so it
    // shares the first of them. mlx5_9 is still a compute rail (IB at NDR), serving none.
    assert_eq!(pref[5], ("mlx5_6".to_string(), Some(1), PathType::Node));
    let rail9 = d
        .rails
        .iter()
        .find(|r| r.hca == "mlx5_9")
        .expect("mlx5_9 stays a rail");
    assert!(rail9.gpus.is_empty());
    assert_eq!(
        d.hcas
            .iter()
            .find(|h| h.name == "mlx5_9")
            .and_then(|h| h.numa),
        Some(0)
    );
    let k = kinds_at_least(&d, Severity::Warning);
    assert!(k.contains(&(FindingKind::FarNic, "GPU5".into())), "{k:?}");
    assert!(
        k.contains(&(FindingKind::SharedRail, "mlx5_6:1".into())),
        "{k:?}"
    );
    assert_ne!(
        d.signature(),
        api_profile("dgx-h100-ndr.yaml").spec.signature()
    );
}

#[test]
fn fault_port_down() {
    let (_dir, d) = discover_model("h100-port-down");
    assert_eq!(names(&d), h100_rails(), "closest rail stays preferred");
    let rail = d.rails.iter().find(|r| r.hca == "mlx5_5").expect("rail");
    assert_eq!(rail.state, PortState::Down);
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::PortDown)
        .expect("port-down finding");
    assert_eq!(
        (f.severity, f.subject.as_str()),
        (Severity::Critical, "mlx5_5:1")
    );
    assert_eq!(
        f.evidence,
        ["sys/class/infiniband/mlx5_5/ports/1/state = DOWN"]
    );
    // The layout (what the profile describes) is unchanged; the fault is a finding.
    assert_eq!(
        d.signature(),
        api_profile("dgx-h100-ndr.yaml").spec.signature()
    );
}

#[test]
fn fault_rate_downshift() {
    let (_dir, d) = discover_model("h100-rate-downshift");
    assert_eq!(names(&d), h100_rails());
    let k = kinds_at_least(&d, Severity::Warning);
    assert_eq!(k, [(FindingKind::PortRateLow, "mlx5_4:1".to_string())]);
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::PortRateLow)
        .expect("finding");
    assert!(
        f.message.contains("200 Gb/s") && f.message.contains("400 Gb/s"),
        "{}",
        f.message
    );
    // A rail at another rate is another layout: the node no longer matches h100-ndr.
    assert_ne!(
        d.signature(),
        api_profile("dgx-h100-ndr.yaml").spec.signature()
    );
}

#[test]
fn fault_pcie_x8() {
    let (_dir, d) = discover_model("h100-pcie-x8");
    let addr = d
        .hcas
        .iter()
        .find(|h| h.name == "mlx5_3")
        .and_then(|h| h.pci_bus_id.clone());
    let k = kinds_at_least(&d, Severity::Critical);
    assert_eq!(
        k,
        [(FindingKind::PcieDowngrade, addr.clone().expect("pci"))]
    );
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::PcieDowngrade)
        .expect("finding");
    assert!(
        f.message.contains("x8") && f.message.contains("x16"),
        "{}",
        f.message
    );
    assert!(f
        .evidence
        .iter()
        .any(|e| e.ends_with("current_link_width = x8")));
}

#[test]
fn fault_acs_redirect_on_a_switch() {
    let (_dir, d) = discover_model("h100-acs");
    let acs: Vec<_> = d
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::AcsRedirect)
        .collect();
    assert!(!acs.is_empty());
    assert!(acs.iter().all(|f| f.severity == Severity::Critical));
    assert!(acs
        .iter()
        .all(|f| f.message.contains("GPU2") && f.message.contains("mlx5_4")));
    assert!(
        acs[0].evidence[0].contains("ACS control = 0x001d"),
        "{:?}",
        acs[0].evidence
    );
    // Other GPU-HCA paths are clean.
    assert!(!acs.iter().any(|f| f.message.contains("GPU0")));
}

#[test]
fn fault_numa_unknown_is_never_local() {
    let (_dir, d) = discover_model("h100-numa-unknown");
    assert_eq!(d.affinity.gpus[6].numa, None);
    // Still PXB to its own rail (same switch tree), but every other host bridge is SYS.
    assert_eq!(preferred(&d)[6].2, PathType::Pxb);
    assert!(d.affinity.gpus[6]
        .alternates
        .iter()
        .all(|a| a.path == PathType::Sys));
    let k = kinds_at_least(&d, Severity::Warning);
    assert_eq!(k, [(FindingKind::NumaUnknown, "GPU6".to_string())]);
}

#[test]
fn iommu_translation_and_no_registration_path() {
    let (_dir, d) = discover_model("h100-iommu-no-peermem");
    let get = |k| d.findings.iter().find(|f| f.kind == k).expect("finding");
    assert_eq!(get(FindingKind::Iommu).severity, Severity::Warning);
    assert!(get(FindingKind::Iommu)
        .evidence
        .iter()
        .any(|e| e.contains("dmar0")));
    assert_eq!(
        get(FindingKind::GpuMemoryRegistration).severity,
        Severity::Critical
    );
}

#[test]
fn counters_grow_per_simulated_run() {
    let mut model = load("dgx-h100");
    model
        .apply(&Fault::CounterGrowth {
            hca: "mlx5_0".into(),
            port: 1,
            counter: "symbol_error".into(),
            per_run: 3,
        })
        .expect("fault applies");
    let dir = tempfile::tempdir().expect("tempdir");
    write_sysfs(&model, dir.path()).expect("write");
    bump_counters(&model, dir.path()).expect("bump");
    bump_counters(&model, dir.path()).expect("bump");
    let c = railguard_prober::discover::read_port_counters(dir.path(), "mlx5_0", 1).expect("read");
    assert_eq!(c.get("symbol_error"), Some(&6));
    let other =
        railguard_prober::discover::read_port_counters(dir.path(), "mlx5_3", 1).expect("read");
    assert_eq!(other.get("symbol_error"), Some(&0));
}

#[test]
fn model_mistakes_are_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad_fault = dir.path().join("bad.yaml");
    std::fs::write(
        &bad_fault,
        format!(
            "base: {}\nname: bad\nfaults:\n  - {{ kind: port-down, hca: mlx5_42, port: 1 }}\n",
            model_path("dgx-h100").display()
        ),
    )
    .expect("write");
    let e = NodeModel::load(&bad_fault).expect_err("unknown HCA");
    assert!(e.to_string().contains("mlx5_42"), "{e}");
    let junk = dir.path().join("junk.yaml");
    std::fs::write(&junk, "name: [unclosed\n").expect("write");
    let e = NodeModel::load(&junk).expect_err("junk yaml");
    assert!(e.to_string().contains("junk.yaml"), "{e}");
    let missing = NodeModel::load(&dir.path().join("nope.yaml")).expect_err("missing");
    assert!(missing.to_string().contains("nope.yaml"));
    let dup = "name: dup\nsockets:\n  - numa: 0\n    host_bridges:\n      - bus: 0x10\n        children:\n          - { kind: gpu, index: 0 }\n          - { kind: gpu, index: 0 }\n";
    let e = NodeModel::from_yaml(dup).expect_err("duplicate GPU index");
    assert!(e.to_string().contains("GPU index 0"), "{e}");
}
