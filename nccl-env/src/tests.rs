//! The answering rules, over synthetic container sysfs trees.

use std::path::Path;

use crate::answer::{answer, Answers, Level};
use crate::node_file::{NodeFile, OnUnhealthy, RailHealth, Verdict};
use crate::shell::{answers_for_process, CONFIG_ENV, SYSFS_ROOT_ENV};
use crate::view::fixture::SysfsTree;
use crate::view::ContainerView;

/// Four rails on four PFs, one GPU each; the certificate runs until Christmas 2026.
const NODE: &str = r#"{
  "version": 1,
  "node": "gpu-a1",
  "profile": "h100-ib",
  "certificate": {"generation": 7, "verdict": "certified", "expiresAt": "2026-12-24T10:00:00Z"},
  "rails": [
    {"hca": "mlx5_0", "port": 1, "pciAddress": "0000:0c:00.0", "netdev": "ibp12s0", "gidIndex": 3, "health": "healthy"},
    {"hca": "mlx5_1", "port": 1, "pciAddress": "0000:2a:00.0", "netdev": "ibp42s0", "gidIndex": 3, "health": "healthy"},
    {"hca": "mlx5_2", "port": 1, "pciAddress": "0000:4d:00.0", "netdev": "ibp77s0", "gidIndex": 3, "health": "healthy"},
    {"hca": "mlx5_3", "port": 1, "pciAddress": "0000:9a:00.0", "netdev": "ibp154s0", "gidIndex": 3, "health": "healthy"}
  ],
  "gpus": [
    {"index": 0, "uuid": "GPU-aaaa0000", "pciBusId": "0000:19:00.0", "rail": "mlx5_0:1"},
    {"index": 1, "uuid": "GPU-bbbb1111", "pciBusId": "0000:3b:00.0", "rail": "mlx5_1:1"},
    {"index": 2, "uuid": "GPU-cccc2222", "pciBusId": "0000:5d:00.0", "rail": "mlx5_2:1"},
    {"index": 3, "uuid": "GPU-dddd3333", "pciBusId": "0000:9b:00.0", "rail": "mlx5_3:1"}
  ],
  "nccl": {"socketIfname": "=eth0", "trafficClass": 106, "serviceLevel": 3,
           "env": {"NCCL_IB_QPS_PER_CONNECTION": "2"}},
  "fleet": {"consistentRailCount": 4}
}"#;

const PFS: [(&str, &str, &str); 4] = [
    ("mlx5_0", "0000:0c:00.0", "ibp12s0"),
    ("mlx5_1", "0000:2a:00.0", "ibp42s0"),
    ("mlx5_2", "0000:4d:00.0", "ibp77s0"),
    ("mlx5_3", "0000:9a:00.0", "ibp154s0"),
];

fn node() -> NodeFile {
    NodeFile::parse(NODE).unwrap()
}

fn now() -> jiff::Timestamp {
    "2026-12-01T00:00:00Z".parse().unwrap()
}

/// A container sysfs built by `build`, read back as the plugin reads it.
fn view(build: impl FnOnce(&SysfsTree)) -> ContainerView {
    let tmp = tempfile::tempdir().unwrap();
    build(&SysfsTree::new(tmp.path()));
    ContainerView::read(tmp.path()).unwrap()
}

/// The host's four PFs, all given to the container (shared-device mode).
fn all_pfs(t: &SysfsTree) {
    for (name, pci, netdev) in PFS {
        t.pci_function(pci, &[netdev]).rdma_device(name, pci, &[1]);
    }
}

fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
}

fn run(node: &NodeFile, view: &ContainerView, vars: &[(&str, &str)]) -> Answers {
    answer(node, view, &env_of(vars), now())
}

fn warnings(a: &Answers) -> Vec<&str> {
    a.messages
        .iter()
        .filter(|m| m.level == Level::Warn)
        .map(|m| m.text.as_str())
        .collect()
}

fn infos(a: &Answers) -> Vec<&str> {
    a.messages
        .iter()
        .filter(|m| m.level == Level::Info)
        .map(|m| m.text.as_str())
        .collect()
}

#[test]
fn shared_pfs_answer_every_rail_and_the_profile_settings() {
    let a = run(&node(), &view(all_pfs), &[]);
    assert_eq!(
        a.get("NCCL_IB_HCA"),
        Some("=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1")
    );
    assert_eq!(a.get("NCCL_IB_GID_INDEX"), Some("3"));
    assert_eq!(a.get("NCCL_SOCKET_IFNAME"), Some("=eth0"));
    assert_eq!(a.get("NCCL_IB_TC"), Some("106"));
    assert_eq!(a.get("NCCL_IB_SL"), Some("3"));
    assert_eq!(a.get("NCCL_IB_QPS_PER_CONNECTION"), Some("2"));
    assert_eq!(a.values.len(), 6);
    assert_eq!(a.init_error, None);
    assert!(warnings(&a).is_empty(), "{:?}", a.messages);
    assert_eq!(
        infos(&a).last().copied(),
        Some(
            "railguard: gpu-a1: certificate generation 7 (certified, expires 2026-12-24T10:00:00Z): \
             answering NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1 \
             NCCL_IB_QPS_PER_CONNECTION=2 NCCL_IB_SL=3 NCCL_IB_TC=106 NCCL_SOCKET_IFNAME==eth0"
        )
    );
}

#[test]
fn every_other_variable_passes_through() {
    let a = run(&node(), &view(all_pfs), &[("NCCL_DEBUG", "INFO")]);
    for name in ["NCCL_DEBUG", "NCCL_COMM_ID", "NCCL_NET_GDR_LEVEL", "HOME"] {
        assert_eq!(a.get(name), None, "{name}");
    }
}

#[test]
fn sriov_vfs_are_answered_by_the_names_the_container_sees() {
    // The pod got two VFs; the kernel named them mlx5_12 and mlx5_13 and the pod's netns
    // holds their netdevs as net1, net2.
    let v = view(|t| {
        t.virtual_function("0000:2a:00.3", "0000:2a:00.0", &["net2"])
            .rdma_device("mlx5_13", "0000:2a:00.3", &[1])
            .virtual_function("0000:0c:00.2", "0000:0c:00.0", &["net1"])
            .rdma_device("mlx5_12", "0000:0c:00.2", &[1]);
    });
    let a = run(&node(), &v, &[]);
    assert_eq!(a.get("NCCL_IB_HCA"), Some("=mlx5_12:1,mlx5_13:1"));
    assert_eq!(
        a.rails.iter().map(|r| r.rail.as_str()).collect::<Vec<_>>(),
        ["mlx5_0:1", "mlx5_1:1"]
    );
    assert!(infos(&a).contains(
        &"rails not answered: mlx5_2:1 (not visible in this container), mlx5_3:1 (not visible in this container)"
    ));
}

#[test]
fn a_vf_is_named_with_its_own_port() {
    let mut n = node();
    n.rails[0].port = 2;
    n.gpus[0].rail = Some("mlx5_0:2".into());
    let v = view(|t| {
        t.virtual_function("0000:0c:00.2", "0000:0c:00.0", &[])
            .rdma_device("mlx5_12", "0000:0c:00.2", &[1]);
    });
    assert_eq!(run(&n, &v, &[]).get("NCCL_IB_HCA"), Some("=mlx5_12:1"));
}

#[test]
fn a_pf_without_the_rails_port_is_not_answered() {
    let mut n = node();
    n.rails[1].port = 2;
    n.gpus[1].rail = Some("mlx5_1:2".into());
    let a = run(&n, &view(all_pfs), &[]);
    assert_eq!(a.get("NCCL_IB_HCA"), Some("=mlx5_0:1,mlx5_2:1,mlx5_3:1"));
    assert!(infos(&a)
        .contains(&"rails not answered: mlx5_1:2 (mlx5_1 has no port 2 in this container)"));
}

#[test]
fn a_subset_of_the_hcas_gives_that_subset() {
    let v = view(|t| {
        for (name, pci, netdev) in [PFS[3], PFS[1]] {
            t.pci_function(pci, &[netdev]).rdma_device(name, pci, &[1]);
        }
    });
    assert_eq!(
        run(&node(), &v, &[]).get("NCCL_IB_HCA"),
        Some("=mlx5_1:1,mlx5_3:1")
    );
}

#[test]
fn netdev_maps_a_device_whose_pci_function_is_no_rails() {
    // mlx5_0's PCI function is one the node file does not list (no physfn link either):
    // its netdev ibp42s0 is rail mlx5_1's.
    let v = view(|t| {
        t.pci_function("0000:e1:00.1", &["ibp42s0"])
            .rdma_device("mlx5_0", "0000:e1:00.1", &[1]);
    });
    assert_eq!(run(&node(), &v, &[]).get("NCCL_IB_HCA"), Some("=mlx5_0:1"));
}

#[test]
fn pci_address_outranks_netdev() {
    // This device is rail mlx5_0's PF; that it also carries rail mlx5_1's netdev name does
    // not make it mlx5_1's.
    let v = view(|t| {
        t.pci_function("0000:0c:00.0", &["ibp42s0"])
            .rdma_device("mlx5_0", "0000:0c:00.0", &[1]);
    });
    let a = run(&node(), &v, &[]);
    assert_eq!(a.get("NCCL_IB_HCA"), Some("=mlx5_0:1"));
    assert_eq!(a.rails.len(), 1);
}

#[test]
fn gpu_visibility_by_index_keeps_the_rails_serving_those_gpus() {
    let a = run(
        &node(),
        &view(all_pfs),
        &[("NVIDIA_VISIBLE_DEVICES", "2,1")],
    );
    assert_eq!(a.get("NCCL_IB_HCA"), Some("=mlx5_1:1,mlx5_2:1"));
    assert!(infos(&a).contains(
        &"rails not answered: mlx5_0:1 (serves no GPU this process sees), mlx5_3:1 (serves no GPU this process sees)"
    ));
    // CUDA index 1 of the exposed GPUs {1, 2} in bus order is host GPU 2.
    let a = run(
        &node(),
        &view(all_pfs),
        &[
            ("NVIDIA_VISIBLE_DEVICES", "2,1"),
            ("CUDA_VISIBLE_DEVICES", "1"),
        ],
    );
    assert_eq!(a.get("NCCL_IB_HCA"), Some("=mlx5_2:1"));
}

#[test]
fn gpu_visibility_by_uuid() {
    let a = run(
        &node(),
        &view(all_pfs),
        &[("NVIDIA_VISIBLE_DEVICES", "GPU-dddd3333,GPU-aaaa0000")],
    );
    assert_eq!(a.get("NCCL_IB_HCA"), Some("=mlx5_0:1,mlx5_3:1"));
    let a = run(
        &node(),
        &view(all_pfs),
        &[("CUDA_VISIBLE_DEVICES", "GPU-cccc")],
    );
    assert_eq!(a.get("NCCL_IB_HCA"), Some("=mlx5_2:1"));
}

#[test]
fn no_gpu_list_in_the_node_file_means_no_gpu_filter() {
    let mut n = node();
    n.gpus.clear();
    let a = run(&n, &view(all_pfs), &[("CUDA_VISIBLE_DEVICES", "0")]);
    assert_eq!(
        a.get("NCCL_IB_HCA"),
        Some("=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1")
    );
}

#[test]
fn the_containers_own_value_wins_without_enforce() {
    let a = run(
        &node(),
        &view(all_pfs),
        &[("NCCL_SOCKET_IFNAME", "=bond0"), ("NCCL_IB_HCA", "mlx5")],
    );
    assert_eq!(a.get("NCCL_SOCKET_IFNAME"), None);
    assert_eq!(a.get("NCCL_IB_HCA"), None);
    assert_eq!(a.get("NCCL_IB_TC"), Some("106"));
    assert!(infos(&a).contains(
        &"NCCL_SOCKET_IFNAME: the container's \"=bond0\" is kept over the node file's \"=eth0\" (enforce is off)"
    ));
    // An empty value is no setting.
    let a = run(&node(), &view(all_pfs), &[("NCCL_SOCKET_IFNAME", "")]);
    assert_eq!(a.get("NCCL_SOCKET_IFNAME"), Some("=eth0"));
}

#[test]
fn enforce_replaces_the_containers_value_and_logs_it() {
    let mut n = node();
    n.nccl.enforce = true;
    let a = run(
        &n,
        &view(all_pfs),
        &[
            ("NCCL_SOCKET_IFNAME", "=bond0"),
            ("NCCL_IB_HCA", "=mlx5_0:1"),
        ],
    );
    assert_eq!(a.get("NCCL_SOCKET_IFNAME"), Some("=eth0"));
    assert_eq!(
        a.get("NCCL_IB_HCA"),
        Some("=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1")
    );
    assert!(infos(&a).contains(
        &"NCCL_SOCKET_IFNAME: the container's \"=bond0\" is replaced by \"=eth0\" (enforce)"
    ));
    assert!(infos(&a).contains(
        &"NCCL_IB_HCA: the container's \"=mlx5_0:1\" is replaced by \"=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1\" (enforce)"
    ));
}

/// An unusable case under Warn answers nothing with one warning; under Fail it also fails init.
fn assert_unhealthy(n: &NodeFile, v: &ContainerView, vars: &[(&str, &str)], why: &str) {
    let mut n = n.clone();
    n.nccl.on_unhealthy = OnUnhealthy::Warn;
    let a = run(&n, v, vars);
    assert!(a.values.is_empty(), "{:?}", a.values);
    assert_eq!(a.init_error, None);
    assert_eq!(
        warnings(&a),
        [format!(
            "railguard: gpu-a1: {why}; NCCL gets the process environment unchanged (onUnhealthy: Warn)"
        )]
    );
    n.nccl.on_unhealthy = OnUnhealthy::Fail;
    let a = run(&n, v, vars);
    assert!(a.values.is_empty(), "{:?}", a.values);
    assert_eq!(a.init_error, Some(format!("railguard: gpu-a1: {why}")));
    assert_eq!(
        warnings(&a),
        [format!(
            "railguard: gpu-a1: {why}; failing NCCL's initialisation (onUnhealthy: Fail)"
        )]
    );
}

#[test]
fn an_expired_certificate_is_unhealthy() {
    let mut n = node();
    n.certificate.expires_at = "2026-11-30T23:59:59Z".parse().unwrap();
    assert_unhealthy(
        &n,
        &view(all_pfs),
        &[],
        "certificate generation 7 expired at 2026-11-30T23:59:59Z",
    );
}

#[test]
fn a_failed_or_pending_certificate_is_unhealthy() {
    let mut n = node();
    n.certificate.verdict = Verdict::Failed;
    assert_unhealthy(
        &n,
        &view(all_pfs),
        &[],
        "certificate generation 7 is failed",
    );
    n.certificate.verdict = Verdict::Pending;
    assert_unhealthy(
        &n,
        &view(all_pfs),
        &[],
        "certificate generation 7 is pending (the node is not certified yet)",
    );
}

#[test]
fn a_degraded_certificate_answers_its_healthy_rails() {
    let mut n = node();
    n.certificate.verdict = Verdict::Degraded;
    n.rails[1].health = RailHealth::Failed;
    n.rails[2].health = RailHealth::Degraded;
    let a = run(&n, &view(all_pfs), &[]);
    assert_eq!(a.get("NCCL_IB_HCA"), Some("=mlx5_0:1,mlx5_3:1"));
    assert!(infos(&a).contains(&"rails not answered: mlx5_1:1 (failed), mlx5_2:1 (degraded)"));
}

#[test]
fn an_empty_intersection_is_unhealthy() {
    // No RDMA device in the container.
    assert_unhealthy(
        &node(),
        &view(|_| {}),
        &[],
        "no rail is healthy, visible in this container and serving a GPU this process sees \
         (container devices: none)",
    );
    // Devices, but not the ones serving the visible GPU.
    let v = view(|t| {
        t.pci_function(PFS[0].1, &[])
            .rdma_device("mlx5_0", PFS[0].1, &[1]);
    });
    assert_unhealthy(
        &node(),
        &v,
        &[("CUDA_VISIBLE_DEVICES", "3")],
        "no rail is healthy, visible in this container and serving a GPU this process sees \
         (container devices: mlx5_0)",
    );
}

#[test]
fn consistent_rails_answers_the_fleets_count() {
    let mut n = node();
    n.nccl.consistent_rails = true;
    n.fleet.as_mut().unwrap().consistent_rail_count = 3;
    let a = run(&n, &view(all_pfs), &[]);
    assert_eq!(a.get("NCCL_IB_HCA"), Some("=mlx5_0:1,mlx5_1:1,mlx5_2:1"));
    assert!(infos(&a)
        .contains(&"consistentRails: answering 3 rails like the rest of the fleet, not mlx5_3:1"));
    // The first three healthy ones, whichever failed.
    n.rails[0].health = RailHealth::Failed;
    assert_eq!(
        run(&n, &view(all_pfs), &[]).get("NCCL_IB_HCA"),
        Some("=mlx5_1:1,mlx5_2:1,mlx5_3:1")
    );
}

#[test]
fn consistent_rails_with_too_few_usable_rails_is_unhealthy() {
    let mut n = node();
    n.nccl.consistent_rails = true;
    n.rails[2].health = RailHealth::Failed;
    assert_unhealthy(
        &n,
        &view(all_pfs),
        &[],
        "consistentRails: every node of the fleet answers 4 rails, this one has 3 usable",
    );
}

#[test]
fn consistent_rails_counts_only_the_rails_serving_this_process() {
    // Two GPUs seen, so two rails on every node with this pod shape.
    let mut n = node();
    n.nccl.consistent_rails = true;
    let a = run(&n, &view(all_pfs), &[("NVIDIA_VISIBLE_DEVICES", "0,3")]);
    assert_eq!(a.get("NCCL_IB_HCA"), Some("=mlx5_0:1,mlx5_3:1"));
    n.rails[3].health = RailHealth::Failed;
    assert_unhealthy(
        &n,
        &view(all_pfs),
        &[("NVIDIA_VISIBLE_DEVICES", "0,3")],
        "consistentRails: every node of the fleet answers 2 rails, this one has 1 usable",
    );
}

#[test]
fn gid_index_only_when_every_answered_rail_agrees() {
    let mut n = node();
    n.rails[3].gid_index = Some(5);
    let a = run(&n, &view(all_pfs), &[]);
    assert_eq!(a.get("NCCL_IB_GID_INDEX"), None);
    assert_eq!(
        warnings(&a),
        ["the answered rails have different GID indices (3, 5): NCCL_IB_GID_INDEX is left to NCCL"]
    );
    // Only the rails answered count: without GPU 3's rail they agree again.
    let a = run(&n, &view(all_pfs), &[("CUDA_VISIBLE_DEVICES", "0,1")]);
    assert_eq!(a.get("NCCL_IB_GID_INDEX"), Some("3"));
    // A rail without a proven index leaves NCCL's automatic choice, quietly.
    n.rails[3].gid_index = None;
    let a = run(&n, &view(all_pfs), &[]);
    assert_eq!(a.get("NCCL_IB_GID_INDEX"), None);
    assert!(warnings(&a).is_empty());
}

/// The shell: a process environment pointing at files.
fn process(dir: &Path, node_file: Option<&str>, vars: &[(&str, &str)]) -> Answers {
    let path = dir.join("nccl.json");
    if let Some(text) = node_file {
        std::fs::write(&path, text).unwrap();
    }
    all_pfs(&SysfsTree::new(&dir.join("root")));
    let mut all: Vec<(&str, String)> = vec![
        (CONFIG_ENV, path.display().to_string()),
        (SYSFS_ROOT_ENV, dir.join("root").display().to_string()),
    ];
    all.extend(vars.iter().map(|(k, v)| (*k, v.to_string())));
    answers_for_process(
        &|k| all.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()),
        now(),
    )
}

#[test]
fn the_shell_reads_the_node_file_and_the_sysfs_root_it_is_pointed_at() {
    let tmp = tempfile::tempdir().unwrap();
    let a = process(tmp.path(), Some(NODE), &[]);
    assert_eq!(
        a.get("NCCL_IB_HCA"),
        Some("=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1")
    );
}

#[test]
fn a_missing_node_file_passes_through_with_one_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let a = process(tmp.path(), None, &[]);
    assert!(a.values.is_empty());
    assert_eq!(a.init_error, None);
    assert_eq!(
        warnings(&a),
        [format!(
            "railguard: cannot read node file {}: No such file or directory (os error 2); \
             NCCL gets the process environment unchanged",
            tmp.path().join("nccl.json").display()
        )]
    );
    assert_eq!(a.messages.len(), 1);
}

#[test]
fn a_garbage_node_file_passes_through_even_when_it_would_fail() {
    let tmp = tempfile::tempdir().unwrap();
    // Fail is the node file's own word; a file that cannot be read cannot say it.
    let a = process(
        tmp.path(),
        Some("{\"version\":1,\"nccl\":{\"onUnhealthy\":\"Fail\"}}"),
        &[],
    );
    assert!(a.values.is_empty());
    assert_eq!(a.init_error, None);
    let w = warnings(&a);
    assert_eq!(w.len(), 1);
    assert!(
        w[0].starts_with(&format!(
            "railguard: node file {}: not a valid version 1 node file: ",
            tmp.path().join("nccl.json").display()
        )),
        "{}",
        w[0]
    );
}

#[test]
fn a_node_file_that_is_no_regular_file_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("nccl.json")).unwrap();
    let a = process(tmp.path(), None, &[]);
    assert_eq!(
        warnings(&a),
        [format!(
            "railguard: node file {} is not a regular file; NCCL gets the process environment unchanged",
            tmp.path().join("nccl.json").display()
        )]
    );
}
