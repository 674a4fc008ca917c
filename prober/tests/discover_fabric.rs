//! The fabric checks on simulated nodes: every built-in model is clean, and each fault the
//! simulator models (no Subnet Manager, RoCE v1-only GIDs, GIDs on a foreign netdev, a low
//! netdev MTU, physical-layer errors) is reported with its evidence.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;

use railguard_api::finding::{fatal_findings, DEFAULT_FATAL_FINDINGS};
use railguard_prober::discover::{discover, Discovery, Finding, FindingKind, Severity};
use railguard_sim::{write_sysfs, Fault, NodeModel, PciNodeModel, PortModel, RoceGids};

const FABRIC_KINDS: [FindingKind; 4] = [
    FindingKind::SubnetManager,
    FindingKind::RoceGid,
    FindingKind::Mtu,
    FindingKind::PhysicalLayer,
];

fn discover_model(model: &NodeModel) -> (tempfile::TempDir, Discovery) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_sysfs(model, dir.path()).unwrap_or_else(|e| panic!("{}: {e}", model.name));
    let d = discover(dir.path(), false).unwrap_or_else(|e| panic!("{}: {e}", model.name));
    (dir, d)
}

fn with_fault(name: &str, fault: Fault) -> NodeModel {
    let mut m = NodeModel::builtin(name).expect("built-in model");
    m.apply(&fault).expect("fault applies");
    m
}

fn fabric_findings(d: &Discovery) -> Vec<&Finding> {
    d.findings
        .iter()
        .filter(|f| FABRIC_KINDS.contains(&f.kind))
        .collect()
}

fn only(d: &Discovery, kind: FindingKind) -> &Finding {
    let found: Vec<&Finding> = d.findings.iter().filter(|f| f.kind == kind).collect();
    assert_eq!(found.len(), 1, "{:#?}", d.findings);
    found[0]
}

fn port_mut<'a>(m: &'a mut NodeModel, hca: &str, port: u32) -> &'a mut PortModel {
    fn walk<'a>(n: &'a mut PciNodeModel, hca: &str, port: u32) -> Option<&'a mut PortModel> {
        match n {
            PciNodeModel::Switch(s) => s.children.iter_mut().find_map(|c| walk(c, hca, port)),
            PciNodeModel::Hca(h) if h.name == hca => h.ports.iter_mut().find(|p| p.port == port),
            PciNodeModel::Nic(nic) => nic
                .functions
                .iter_mut()
                .filter(|h| h.name == hca)
                .find_map(|h| h.ports.iter_mut().find(|p| p.port == port)),
            _ => None,
        }
    }
    m.sockets
        .iter_mut()
        .flat_map(|s| s.host_bridges.iter_mut())
        .flat_map(|hb| hb.children.iter_mut())
        .find_map(|c| walk(c, hca, port))
        .expect("port in the model")
}

#[test]
fn built_in_models_have_no_fabric_findings() {
    for (name, _) in railguard_sim::BUILTIN_MODELS {
        let (_dir, d) = discover_model(&NodeModel::builtin(name).expect("model"));
        // Not even an unknown: the simulator writes every file the checks read.
        assert_eq!(fabric_findings(&d), Vec::<&Finding>::new(), "{name}");
        assert!(
            !d.findings
                .iter()
                .any(|f| f.kind == FindingKind::SysfsUnreadable),
            "{name}: {:#?}",
            d.findings
        );
        // The checks did read: IB rails know their SM, RoCE rails their v2 GIDs and MTU.
        for r in &d.rails {
            let h = d.hcas.iter().find(|h| h.name == r.hca).expect("hca");
            let p = h.ports.iter().find(|p| p.port == r.port).expect("port");
            assert_eq!(p.fabric.physical_counters.len(), 6, "{name} {}", r.hca);
            match r.link_layer {
                Some(railguard_api::LinkLayer::Ib) => {
                    if r.state == railguard_prober::discover::PortState::Active {
                        assert_eq!(p.fabric.sm_lid.value(), Some(&1), "{name} {}", r.hca);
                    }
                }
                _ => {
                    let gids = p.fabric.gids.as_ref().expect("gid table");
                    assert_eq!(gids.len(), 4, "{name} {}", r.hca);
                }
            }
        }
    }
}

#[test]
fn an_ib_rail_without_subnet_manager_is_critical_and_fatal() {
    let (_dir, d) = discover_model(&with_fault(
        "dgx-h100",
        Fault::NoSubnetManager {
            hca: "mlx5_4".into(),
            port: 1,
        },
    ));
    let f = only(&d, FindingKind::SubnetManager);
    assert_eq!(
        (f.severity, f.subject.as_str()),
        (Severity::Critical, "mlx5_4:1")
    );
    assert_eq!(
        f.evidence,
        [
            "sys/class/infiniband/mlx5_4/ports/1/sm_lid = 0x0",
            "sys/class/infiniband/mlx5_4/ports/1/state = ACTIVE",
            "sys/class/infiniband/mlx5_4/ports/1/sm_sl = 0",
        ]
    );
    let fatal = fatal_findings(&d.findings, DEFAULT_FATAL_FINDINGS);
    assert_eq!(
        fatal.iter().map(|f| f.kind).collect::<Vec<_>>(),
        [FindingKind::SubnetManager]
    );
}

#[test]
fn a_roce_rail_with_only_v1_gids_is_critical() {
    let (_dir, d) = discover_model(&with_fault(
        "roce-cloud",
        Fault::RoceGids {
            hca: "mlx5_3".into(),
            port: 1,
            gids: RoceGids::V1Only,
        },
    ));
    let f = only(&d, FindingKind::RoceGid);
    assert_eq!(
        (f.severity, f.subject.as_str()),
        (Severity::Critical, "mlx5_3:1")
    );
    assert!(f.message.contains("no RoCE v2 GID"), "{}", f.message);
    assert_eq!(f.evidence.len(), 2, "{:?}", f.evidence);
    assert!(
        f.evidence[0].starts_with("sys/class/infiniband/mlx5_3/ports/1/gids/0 = fe80:")
            && f.evidence[0].ends_with("(type IB/RoCE v1, ndev gpu3rdma0)"),
        "{:?}",
        f.evidence
    );
    // No GIDs at all is the same finding.
    let (_dir, d) = discover_model(&with_fault(
        "roce-cloud",
        Fault::RoceGids {
            hca: "mlx5_3".into(),
            port: 1,
            gids: RoceGids::None,
        },
    ));
    assert_eq!(only(&d, FindingKind::RoceGid).severity, Severity::Critical);
}

#[test]
fn a_roce_rail_whose_gids_are_on_another_netdev_is_critical() {
    let (_dir, d) = discover_model(&with_fault(
        "roce-cloud",
        Fault::GidNetdev {
            hca: "mlx5_2".into(),
            port: 1,
            netdev: "eth9".into(),
        },
    ));
    let f = only(&d, FindingKind::RoceGid);
    assert_eq!(
        (f.severity, f.subject.as_str()),
        (Severity::Critical, "mlx5_2:1")
    );
    assert!(
        f.message.contains("on eth9") && f.message.contains("gpu2rdma0"),
        "{}",
        f.message
    );
    assert!(
        f.evidence
            .iter()
            .any(|e| e.contains("gids/1 = ") && e.ends_with("(type RoCE v2, ndev eth9)")),
        "{:?}",
        f.evidence
    );
}

#[test]
fn a_roce_rail_on_a_vlan_of_its_netdev_is_healthy_and_says_so() {
    let mut m = NodeModel::builtin("roce-cloud").expect("model");
    port_mut(&mut m, "mlx5_0", 1).vlan = Some(100);
    let (dir, d) = discover_model(&m);
    assert!(
        dir.path()
            .join("sys/class/net/gpu0rdma0.100/lower_gpu0rdma0")
            .exists(),
        "the VLAN sits on the rail's netdev"
    );
    let f = only(&d, FindingKind::RoceGid);
    assert_eq!(
        (f.severity, f.subject.as_str()),
        (Severity::Info, "mlx5_0:1")
    );
    assert!(f.message.contains("gpu0rdma0.100"), "{}", f.message);
    assert!(d.findings_at_least(Severity::Warning).next().is_none());
}

#[test]
fn a_low_roce_mtu_is_a_warning() {
    let (_dir, d) = discover_model(&with_fault(
        "roce-cloud",
        Fault::NetdevMtu {
            hca: "mlx5_1".into(),
            port: 1,
            mtu: 1500,
        },
    ));
    let f = only(&d, FindingKind::Mtu);
    assert_eq!(
        (f.severity, f.subject.as_str()),
        (Severity::Warning, "mlx5_1:1")
    );
    assert_eq!(f.evidence, ["sys/class/net/gpu1rdma0/mtu = 1500"]);
    assert!(f.message.contains("RoCE path MTU 1024"), "{}", f.message);
    // Not fatal unless a profile lists `mtu` in certification.fatalFindings.
    assert!(fatal_findings(&d.findings, DEFAULT_FATAL_FINDINGS).is_empty());
    assert!(!fatal_findings(&d.findings, &[FindingKind::Mtu]).is_empty());
}

#[test]
fn physical_layer_errors_are_a_warning() {
    let mut m = with_fault(
        "dgx-h100",
        Fault::CounterValue {
            hca: "mlx5_9".into(),
            port: 1,
            counter: "symbol_error".into(),
            value: 5000,
        },
    );
    m.apply(&Fault::CounterValue {
        hca: "mlx5_9".into(),
        port: 1,
        counter: "link_downed".into(),
        value: 255,
    })
    .expect("fault");
    let (_dir, d) = discover_model(&m);
    let f = only(&d, FindingKind::PhysicalLayer);
    assert_eq!(
        (f.severity, f.subject.as_str()),
        (Severity::Warning, "mlx5_9:1")
    );
    assert_eq!(
        f.evidence,
        [
            "sys/class/infiniband/mlx5_9/ports/1/counters/symbol_error = 5000 (bound 10)",
            "sys/class/infiniband/mlx5_9/ports/1/counters/link_downed = 255 (bound 10, saturated)",
        ]
    );
    // A storage NIC's counters are not a rail's problem.
    let (_dir, d) = discover_model(&with_fault(
        "dgx-h100",
        Fault::CounterValue {
            hca: "mlx5_1".into(),
            port: 1,
            counter: "symbol_error".into(),
            value: 5000,
        },
    ));
    assert_eq!(fabric_findings(&d), Vec::<&Finding>::new());
}

#[test]
fn junk_and_missing_fabric_files_are_unreadable_or_unknown() {
    let (dir, _) = discover_model(&NodeModel::builtin("dgx-h100").expect("model"));
    let ib = dir.path().join("sys/class/infiniband");
    fs::write(ib.join("mlx5_0/ports/1/sm_lid"), "lid?\n").expect("write");
    fs::remove_file(ib.join("mlx5_3/ports/1/sm_lid")).expect("rm");
    fs::write(ib.join("mlx5_4/ports/1/counters/link_downed"), "\u{ff}\n").expect("write");
    let d = discover(dir.path(), false).expect("discovery");
    let junk: Vec<&Finding> = d
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::SysfsUnreadable)
        .collect();
    assert_eq!(
        junk.iter().map(|f| f.subject.as_str()).collect::<Vec<_>>(),
        ["mlx5_0:1", "mlx5_4:1"],
        "{junk:#?}"
    );
    assert_eq!(
        junk[0].evidence,
        ["sys/class/infiniband/mlx5_0/ports/1/sm_lid = \"lid?\""]
    );
    let unknown = only(&d, FindingKind::SubnetManager);
    assert_eq!(
        (unknown.severity, unknown.subject.as_str()),
        (Severity::Info, "node")
    );
    assert_eq!(
        unknown.evidence,
        ["sys/class/infiniband/mlx5_3/ports/1/sm_lid absent"]
    );

    let (dir, _) = discover_model(&NodeModel::builtin("roce-cloud").expect("model"));
    let port = dir.path().join("sys/class/infiniband/mlx5_5/ports/1");
    fs::write(port.join("gid_attrs/types/1"), "RoCE v9\n").expect("write");
    fs::remove_dir_all(
        dir.path()
            .join("sys/class/infiniband/mlx5_6/ports/1/gid_attrs"),
    )
    .expect("rm");
    let d = discover(dir.path(), false).expect("discovery");
    let f = only(&d, FindingKind::SysfsUnreadable);
    assert_eq!(f.subject, "mlx5_5:1");
    assert_eq!(
        f.evidence,
        ["sys/class/infiniband/mlx5_5/ports/1/gid_attrs/types/1 = \"RoCE v9\""]
    );
    // mlx5_5 still has its other v2 GID; mlx5_6's types are unknown, not wrong.
    let gid = only(&d, FindingKind::RoceGid);
    assert_eq!(
        (gid.severity, gid.subject.as_str()),
        (Severity::Info, "node")
    );
}
