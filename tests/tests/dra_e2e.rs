//! End-to-end: rail health as DRA device taints (#32) on the real 1.37 kube-apiserver,
//! kube-scheduler and kube-controller-manager, whatever `RAILGUARD_KUBE_VERSION` says (DRA
//! with device taints exists from 1.37 on; 1.20 has no `resource.k8s.io`).
//!
//! Simulated DGX H100 nodes (the `dgx-h100` model's sysfs tree, read by the prober's real
//! discovery) carry certificates whose rails name their HCA's PCI function and whose GPUs
//! name their bus id and preferred HCA; their devices are published as ResourceSlices the
//! way dranet (`dra.net`) and NVIDIA's GPU driver (`gpu.nvidia.com`) publish them
//! (`railguard_tests::dra`), with `resource.kubernetes.io/pcieRoot` from the tree by the
//! upstream rule. DeviceTaintRules follow the certificates ([`wait_rules`]); the
//! scheduler allocates the chart's aligned-rail claims (`railguard-<profile>-<n>-rails`:
//! GPU i and NIC i under one PCIe root). No kubelet runs: a pod's placement is its
//! `spec.nodeName` and its claims' `status.allocation`.
//!
//! - a failed rail keeps 8-rail claims off its node; a 4-rail claim still lands there, on
//!   healthy pairs only (the NIC of a link-down rail, the NIC and GPU of a GPUDirect
//!   fault are never allocated); recertified, the rule goes and a waiting 8-rail claim
//!   fits there;
//! - `NoExecute`: the device taint eviction controller of kube-controller-manager evicts
//!   the pods whose claims hold the device, and only those;
//! - a plain `nvidia.com/gpu` request, served by the GPU class's `extendedResourceName`,
//!   gets an untainted GPU or waits.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Client;
use railguard_api::dra::{
    self as api_dra, plan_rules, rail_devices, rail_taint_reasons, rule_object, wanted_rules,
    DraSpec, DraTaintEffect, ExistingRule, WantedRule,
};
use railguard_api::{Certificate, FabricProfile, NodeFabric, RailFault, RailVerdict, Verdict};
use railguard_tests::dra::{
    self, claim_pod, claim_template, delete_pod_now, device_classes, layout_from_sysfs,
    publish_slices, wait_allocated, Allocated, NodeLayout, SysfsTree,
};
use railguard_tests::{
    eventually, failed_scheduling_messages, fixture_profile, ApiServerOptions, ControlPlane,
    KubeVersion, NotYet,
};

const NS: &str = "dra";
const PROFILE: &str = "h100-ndr";
/// The extended resource the GPU class serves in the extended-resource scenario.
const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Scheduling on a loaded 2-core machine: generous.
const BIND: Duration = Duration::from_secs(90);

/// One simulated DGX H100: its sysfs tree and what discovery found in it.
struct Hardware {
    _dir: tempfile::TempDir,
    tree: SysfsTree,
    profile: FabricProfile,
    discovery: railguard_prober::discover::Discovery,
}

impl Hardware {
    fn dgx_h100() -> Result<Hardware> {
        let dir = tempfile::Builder::new()
            .prefix("railguard-dra-")
            .tempdir()?;
        let model = railguard_sim::ModelSource::Builtin("dgx-h100".into()).load()?;
        railguard_sim::write_sysfs(&model, dir.path())?;
        let discovery = railguard_prober::discover::discover(dir.path(), false)?;
        Ok(Hardware {
            tree: SysfsTree::under(dir.path()),
            _dir: dir,
            profile: fixture_profile("dgx-h100-ndr.yaml")?,
            discovery,
        })
    }

    /// A certificate of this hardware as the prober writes it (rails' PCI functions, GPUs'
    /// bus ids and preferred HCAs from discovery), `faults` failing rails (`mlx5_3:1`).
    fn certificate(&self, node: &str, faults: &[(&str, RailFault)]) -> Certificate {
        let mut cert = railguard_sim::certificates::certificate(
            &self.profile,
            Verdict::Certified,
            Timestamp::now() - jiff::SignedDuration::from_mins(5),
            390.0,
            46.0,
        );
        cert.node = Some(node.to_string());
        for rail in &mut cert.rails {
            let hca = self.discovery.hcas.iter().find(|h| h.name == rail.hca);
            rail.pci_address = hca.and_then(|h| h.pci_bus_id.clone());
            rail.sriov_vfs = hca.map(|h| h.sriov_vfs.clone()).unwrap_or_default();
        }
        cert.gpus = railguard_prober::certify::run::gpu_affinity(&self.discovery);
        for (rail, fault) in faults {
            let r = cert
                .rails
                .iter_mut()
                .find(|r| r.id() == *rail)
                .unwrap_or_else(|| panic!("no rail {rail}"));
            r.verdict = RailVerdict::Failed;
            r.faults = vec![*fault];
            r.reasons = vec![format!("{} (test)", fault.as_str())];
        }
        if !faults.is_empty() {
            cert.verdict = Verdict::Degraded;
            cert.usable_rails = Some((cert.rails.len() - faults.len()) as u32);
            cert.reasons = vec![format!("{} rail(s) failed", faults.len())];
        }
        cert
    }

    fn layout(&self, node: &str) -> Result<NodeLayout> {
        layout_from_sysfs(node, &self.certificate(node, &[]), &self.tree)
    }
}

/// A 1.37 control plane with scheduler and controller manager, the profile's DeviceClasses
/// and 1-, 4- and 8-rail templates in [`NS`].
struct Cluster {
    cp: ControlPlane,
    hw: Hardware,
    layouts: BTreeMap<String, NodeLayout>,
}

impl Cluster {
    async fn start(extended_resource: Option<&str>) -> Result<Cluster> {
        let t0 = Instant::now();
        let mut cp =
            ControlPlane::start_version(KubeVersion::V1_37, &ApiServerOptions::default()).await?;
        cp.start_scheduler("[]").await?;
        cp.start_controller_manager().await?;
        eprintln!(
            "dra_e2e: control plane up in {:.1}s",
            t0.elapsed().as_secs_f64()
        );
        cp.create_namespace(NS, &BTreeMap::new()).await?;
        let client = cp.client();
        for class in device_classes(PROFILE, extended_resource) {
            dra::apply(&client, &class).await?;
        }
        for rails in [1, 4, 8] {
            dra::apply(&client, &claim_template(PROFILE, NS, rails)).await?;
        }
        Ok(Cluster {
            cp,
            hw: Hardware::dgx_h100()?,
            layouts: BTreeMap::new(),
        })
    }

    fn client(&self) -> Client {
        self.cp.client()
    }

    /// A Node (no `nvidia.com/gpu` allocatable: no device plugin), its certificate and its
    /// two ResourceSlices.
    async fn add_node(&mut self, name: &str, faults: &[(&str, RailFault)]) -> Result<()> {
        self.cp.create_node(name, &BTreeMap::new(), &[]).await?;
        self.cp
            .publish_certificate(name, &self.hw.certificate(name, faults))
            .await?;
        let layout = self.hw.layout(name)?;
        publish_slices(&self.client(), &layout).await?;
        self.layouts.insert(name.to_string(), layout);
        Ok(())
    }

    async fn recertify(&self, name: &str, faults: &[(&str, RailFault)]) -> Result<()> {
        self.cp
            .publish_certificate(name, &self.hw.certificate(name, faults))
            .await
    }

    async fn create_pod(&self, pod: Pod) -> Result<()> {
        Api::<Pod>::namespaced(self.client(), NS)
            .create(&PostParams::default(), &pod)
            .await
            .context("creating a pod")?;
        Ok(())
    }
}

/// The DeviceTaintRules railguard's fleet controller keeps for the cluster's Nodes, once
/// the API serves exactly them (by name, among the rules labelled
/// `app.kubernetes.io/managed-by=railguard-fleet`).
///
/// The controller (`railguard-prober fleet --watch`, `prober/cli/src/fleet/`) is being
/// written; until it runs here, this plays its reconcile with the same `api::dra`
/// functions it uses: per Node its certificate's rails mapped to the slices' devices
/// ([`rail_devices`]), the reasons ([`rail_taint_reasons`]), the rules
/// ([`wanted_rules`], [`rule_object`]) and the writes ([`plan_rules`]). With the controller,
/// only the wait remains.
async fn wait_rules(client: &Client, spec: &DraSpec) -> Result<Vec<WantedRule>> {
    let now = Timestamp::now();
    let slices = dra::read_slices(client).await?;
    let slice_refs: Vec<&api_dra::ResourceSlice> = slices.iter().collect();
    let mut wanted = Vec::new();
    for node in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
    {
        let fabric = NodeFabric::from_node(&node, now);
        let Some(cert) = fabric.state.certificate() else {
            continue;
        };
        let devices = rail_devices(&fabric.name, cert, &slice_refs, spec);
        let reasons = rail_taint_reasons(&fabric, spec, &BTreeSet::new(), now);
        wanted.extend(wanted_rules(
            &fabric.name,
            &devices,
            &reasons,
            spec.taint_effect,
        ));
    }
    let managed = ListParams::default().labels(&format!(
        "{}={}",
        api_dra::LABEL_MANAGED_BY,
        api_dra::MANAGED_BY
    ));
    let rules = dra::taint_rules(client);
    let existing: Vec<ExistingRule> = rules
        .list(&managed)
        .await?
        .items
        .iter()
        .filter_map(|r| ExistingRule::from_object(&serde_json::to_value(r).ok()?))
        .collect();
    let plan = plan_rules(&wanted, &existing);
    for rule in &plan.apply {
        dra::apply(client, &rule_object(rule)).await?;
    }
    for name in &plan.delete {
        rules.delete(name, &DeleteParams::default()).await?;
    }
    let want: BTreeSet<String> = wanted.iter().map(|w| w.name.clone()).collect();
    eventually(
        Duration::from_secs(30),
        "the DeviceTaintRules railguard wants",
        || async {
            let have: BTreeSet<String> = rules
                .list(&managed)
                .await?
                .items
                .into_iter()
                .filter_map(|r| r.metadata.name)
                .collect();
            Ok(if have == want {
                Ok(())
            } else {
                Err(NotYet(format!("{have:?}, want {want:?}")))
            })
        },
    )
    .await?;
    Ok(wanted)
}

fn dra_spec(effect: DraTaintEffect) -> DraSpec {
    DraSpec {
        taint_effect: effect,
        ..DraSpec::default()
    }
}

/// Every GPU/NIC request pair of a rails claim is allocated, on `node`, under one root.
fn assert_aligned(layout: &NodeLayout, alloc: &[Allocated], rails: usize) {
    assert_eq!(alloc.len(), 2 * rails, "{alloc:?}");
    for a in alloc {
        assert_eq!(a.pool, layout.node, "{a:?}");
    }
    for i in 0..rails {
        let get = |req: &str| {
            alloc
                .iter()
                .find(|a| a.request == req)
                .unwrap_or_else(|| panic!("no {req} in {alloc:?}"))
        };
        let (g, n) = (get(&format!("gpu-{i}")), get(&format!("nic-{i}")));
        assert_eq!(g.driver, api_dra::NVIDIA_GPU_DRIVER);
        assert_eq!(n.driver, api_dra::DRANET_DRIVER);
        let root = |a: &Allocated| layout.pcie_root_of(&a.driver, &a.device);
        assert!(root(g).is_some(), "{g:?} has no root");
        assert_eq!(root(g), root(n), "pair {i} not aligned: {g:?} {n:?}");
    }
}

/// Devices the rules select on `node`: (driver, device).
fn tainted_on(rules: &[WantedRule], node: &str) -> BTreeSet<(String, String)> {
    rules
        .iter()
        .filter(|r| r.node == node)
        .map(|r| (r.device.driver.clone(), r.device.device.clone()))
        .collect()
}

/// Waits for a FailedScheduling event of `pod`, then checks it is still unbound.
async fn assert_unschedulable(client: &Client, pod: &str) -> Result<String> {
    let msg = eventually(
        BIND,
        &format!("a FailedScheduling event of {pod}"),
        || async {
            Ok(failed_scheduling_messages(client, NS, pod)
                .await?
                .into_iter()
                .last())
        },
    )
    .await?;
    if let Some(node) = railguard_tests::pod_node(client, NS, pod).await {
        bail!("{pod} was bound to {node} after: {msg}");
    }
    Ok(msg)
}

fn template(rails: u32) -> String {
    api_dra::claim_template_name(PROFILE, rails)
}

/// (a), (b), (c): rail claims on one healthy node, one with a link-down rail (its NIC
/// tainted) and one with a GPUDirect fault (NIC and GPU tainted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rail_claims_stay_off_failed_rails_and_fit_again_after_recertification() -> Result<()> {
    let t0 = Instant::now();
    let mut c = Cluster::start(None).await?;
    let client = c.client();
    let (healthy, link_down, gdr) = ("gpu-a", "gpu-b", "gpu-c");
    let (down_rail, gdr_rail) = ("mlx5_3:1", "mlx5_9:1");
    c.add_node(healthy, &[]).await?;
    c.add_node(link_down, &[(down_rail, RailFault::LinkDown)])
        .await?;
    c.add_node(gdr, &[(gdr_rail, RailFault::Gpudirect)]).await?;
    let spec = dra_spec(DraTaintEffect::NoSchedule);
    let rules = wait_rules(&client, &spec).await?;

    // The rules: the NIC of the link-down rail; the NIC and the GPU of the GPUDirect one.
    let nic = |node: &str, rail: &str| {
        let p = c.layouts[node].pair(rail).unwrap();
        (
            api_dra::DRANET_DRIVER.to_string(),
            NodeLayout::nic_device(&p.nic),
        )
    };
    let gpu = |node: &str, rail: &str| {
        let p = c.layouts[node].pair(rail).unwrap();
        (
            api_dra::NVIDIA_GPU_DRIVER.to_string(),
            NodeLayout::gpu_device(&p.gpu),
        )
    };
    assert_eq!(tainted_on(&rules, healthy), BTreeSet::new());
    assert_eq!(
        tainted_on(&rules, link_down),
        BTreeSet::from([nic(link_down, down_rail)])
    );
    assert_eq!(
        tainted_on(&rules, gdr),
        BTreeSet::from([nic(gdr, gdr_rail), gpu(gdr, gdr_rail)])
    );
    for r in &rules {
        assert_eq!(r.effect, DraTaintEffect::NoSchedule);
        assert_eq!(r.device.pool, r.node);
    }
    eprintln!(
        "dra_e2e: rules {:?}",
        rules.iter().map(|r| &r.name).collect::<Vec<_>>()
    );

    // (a) An 8-rail claim lands on the one fully healthy node; a second one fits nowhere.
    c.create_pod(claim_pod("train-8a", &template(8))).await?;
    let (node, alloc) = wait_allocated(&client, NS, "train-8a", BIND).await?;
    assert_eq!(node, healthy, "{alloc:?}");
    assert_aligned(&c.layouts[healthy], &alloc, 8);
    c.create_pod(claim_pod("train-8b", &template(8))).await?;
    let why = assert_unschedulable(&client, "train-8b").await?;
    eprintln!("dra_e2e: (a) train-8a on {node}; train-8b waits: {why}");
    delete_pod_now(&client, NS, "train-8b").await?;

    // (b) With the healthy node full, 4-rail claims land on the nodes with a failed rail,
    // on healthy pairs: seven per node, so one claim each, and a third waits (were the
    // tainted pair allocatable, the link-down node would take it).
    let mut placed = BTreeMap::new();
    for pod in ["train-4a", "train-4b"] {
        c.create_pod(claim_pod(pod, &template(4))).await?;
        let (node, alloc) = wait_allocated(&client, NS, pod, BIND).await?;
        assert_aligned(&c.layouts[&node], &alloc, 4);
        let used: BTreeSet<(String, String)> = alloc
            .iter()
            .map(|a| (a.driver.clone(), a.device.clone()))
            .collect();
        let tainted = tainted_on(&rules, &node);
        assert!(
            used.is_disjoint(&tainted),
            "{pod} on {node} was allocated tainted devices: {:?}",
            used.intersection(&tainted).collect::<Vec<_>>()
        );
        eprintln!("dra_e2e: (b) {pod} on {node}: {used:?}");
        placed.insert(node, pod);
    }
    assert_eq!(
        placed.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        BTreeSet::from([link_down, gdr]),
        "one 4-rail claim per degraded node"
    );
    c.create_pod(claim_pod("train-4c", &template(4))).await?;
    let why = assert_unschedulable(&client, "train-4c").await?;
    eprintln!("dra_e2e: (b) train-4c waits: {why}");
    delete_pod_now(&client, NS, "train-4c").await?;

    // (c) Empty the link-down node: an 8-rail claim still waits, its rule being there.
    // Recertified healthy, the rule goes, and the waiting claim lands there, on all eight
    // pairs, the formerly tainted NIC among them.
    delete_pod_now(&client, NS, placed[link_down]).await?;
    c.create_pod(claim_pod("train-8c", &template(8))).await?;
    let why = assert_unschedulable(&client, "train-8c").await?;
    eprintln!("dra_e2e: (c) train-8c waits while the rule is there: {why}");
    c.recertify(link_down, &[]).await?;
    let rules = wait_rules(&client, &spec).await?;
    assert_eq!(tainted_on(&rules, link_down), BTreeSet::new());
    assert_eq!(tainted_on(&rules, gdr).len(), 2);
    let (node, alloc) = wait_allocated(&client, NS, "train-8c", BIND).await?;
    assert_eq!(node, link_down);
    assert_aligned(&c.layouts[link_down], &alloc, 8);
    let (_, down_nic) = nic(link_down, down_rail);
    assert!(
        alloc.iter().any(|a| a.device == down_nic),
        "{down_nic} not in {alloc:?}"
    );
    eprintln!(
        "dra_e2e: (c) train-8c on {node} after recertification; {:.1}s in all",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
