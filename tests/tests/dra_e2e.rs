//! End-to-end: rail health as DRA device taints (#32) on the real 1.37 kube-apiserver,
//! kube-scheduler and kube-controller-manager, whatever `RAILGUARD_KUBE_VERSION` says (DRA
//! with device taints exists from 1.37 on; 1.20 has no `resource.k8s.io`).
//!
//! Simulated DGX H100 nodes (the `dgx-h100` model's sysfs tree, read by the prober's real
//! discovery) carry certificates whose rails name their HCA's PCI function and whose GPUs
//! name their bus id and preferred HCA; their devices are published as ResourceSlices the
//! way dranet (`dra.net`) and NVIDIA's GPU driver (`gpu.nvidia.com`) publish them
//! (`railguard_tests::dra`), with `resource.kubernetes.io/pcieRoot` from the tree by the
//! upstream rule. The real fleet controller (`railguard-prober fleet --watch`) keeps the
//! DeviceTaintRules ([`wait_rules`] checks them against `api::dra`); the scheduler
//! allocates the chart's aligned-rail claims (`railguard-<profile>-<n>-rails`: GPU i and
//! NIC i under one PCIe root). No kubelet runs: a pod's placement is its `spec.nodeName`
//! and its claims' `status.allocation`.
//!
//! - a failed rail keeps 8-rail claims off its node; a 4-rail claim still lands there, on
//!   healthy pairs only (the NIC of a link-down rail, the NIC and GPU of a GPUDirect
//!   fault are never allocated); recertified, the rule goes and a waiting 8-rail claim
//!   fits there;
//! - `NoExecute` (the profile's `dra.taintEffect`): kube-controller-manager's device taint
//!   eviction controller marks the pods whose claims hold a tainted device
//!   (`DisruptionTarget`) and deletes them, and only those; a bound pod with the default
//!   grace period stays `Terminating` (no kubelet confirms its end), one with grace 0 is
//!   gone;
//! - a plain `nvidia.com/gpu` request, served by the GPU class's `extendedResourceName`
//!   (the Node has no such allocatable: no device plugin), gets an untainted GPU or waits,
//!   and gets the formerly tainted one once the node is recertified;
//! - day one: with the chart's default values (`dra.deviceTaints` off) the fleet controller,
//!   run as the chart runs it, writes no DeviceTaintRule and no taint over failed and
//!   expired certificates, and claims are allocated as if railguard were not there.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::Client;
use railguard_api::dra::{
    self as api_dra, plan_rules, rail_devices, rail_taint_reasons, wanted_rules, DraSpec,
    DraTaintEffect, ExistingRule, WantedRule,
};
use railguard_api::{Certificate, FabricProfile, NodeFabric, RailFault, RailVerdict, Verdict};
use railguard_tests::daemon::{wait_ready, Daemon, ANY_LOOPBACK_PORT};
use railguard_tests::dra::{
    self, chart_objects, chart_values, claim_pod, delete_pod_now, extended_resource_pod,
    layout_from_sysfs, publish_slices, wait_allocated, Allocated, NodeLayout, SysfsTree,
};
use railguard_tests::sim_prober::prober_bin_dir;
use railguard_tests::{
    eventually, failed_scheduling_messages, fixture_profile, labels, ApiServerOptions,
    ControlPlane, KubeVersion, NotYet,
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

/// A 1.37 control plane with scheduler and controller manager, the FabricProfile CRD and
/// the profile (its `dra.taintEffect` as given), the chart's DeviceClasses and claim
/// templates (8, 4, 2 and 1 rails) in [`NS`], and the fleet controller.
struct Cluster {
    cp: ControlPlane,
    hw: Hardware,
    layouts: BTreeMap<String, NodeLayout>,
    /// The profile's `dra`, as the fleet controller reads it.
    spec: DraSpec,
    fleet: Daemon,
}

/// A Kubernetes 1.37 control plane with kube-scheduler and kube-controller-manager, the
/// FabricProfile CRD applied, and the DGX H100 hardware model.
async fn scheduling_cluster() -> Result<(ControlPlane, Client, Hardware)> {
    let mut cp =
        ControlPlane::start_version(KubeVersion::V1_37, &ApiServerOptions::default()).await?;
    cp.start_scheduler("[]").await?;
    cp.start_controller_manager().await?;
    cp.apply_fabricprofile_crd().await?;
    let client = cp.client();
    Ok((cp, client, Hardware::dgx_h100()?))
}

impl Cluster {
    async fn start(extended_resource: Option<&str>, effect: DraTaintEffect) -> Result<Cluster> {
        let t0 = Instant::now();
        let (cp, client, hw) = scheduling_cluster().await?;
        let mut profile = hw.profile.clone();
        profile.spec.dra.taint_effect = effect;
        let spec = profile.spec.dra.clone();
        Api::<FabricProfile>::all(client.clone())
            .create(&PostParams::default(), &profile)
            .await?;
        cp.create_namespace(NS, &BTreeMap::new()).await?;
        // The chart's DeviceClasses and claim templates, as the real Helm renders them.
        let shipped = chart_objects(&chart_values(&[NS], extended_resource))?;
        for rails in [1, 4, 8] {
            let name = template(rails);
            if !shipped
                .iter()
                .any(|o| o["metadata"]["name"] == name.as_str())
            {
                bail!("the chart renders no ResourceClaimTemplate {name}");
            }
        }
        for obj in &shipped {
            dra::apply(&client, obj).await?;
        }
        let fleet = start_fleet(&cp).await?;
        eprintln!(
            "dra_e2e: control plane, scheduler, controller manager and fleet controller up in {:.1}s",
            t0.elapsed().as_secs_f64()
        );
        Ok(Cluster {
            cp,
            hw,
            layouts: BTreeMap::new(),
            spec,
            fleet,
        })
    }

    fn client(&self) -> Client {
        self.cp.client()
    }

    /// A Node (no `nvidia.com/gpu` allocatable: no device plugin), its certificate and its
    /// two ResourceSlices.
    async fn add_node(&mut self, name: &str, faults: &[(&str, RailFault)]) -> Result<()> {
        self.cp
            .create_node(
                name,
                &labels(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]),
                &[],
            )
            .await?;
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

    /// The rules railguard wants now, once the fleet controller keeps exactly them.
    async fn wait_rules(&mut self) -> Result<Vec<WantedRule>> {
        let logs = self.cp.log_dir().to_path_buf();
        self.fleet.assert_running(&logs);
        wait_rules(&self.client(), &self.spec).await
    }
}

/// The real fleet controller, one replica, reconciling every 3 s.
async fn start_fleet(cp: &ControlPlane) -> Result<Daemon> {
    let bin = prober_bin_dir()?;
    let logs = cp.log_dir();
    let mut cmd = Command::new(bin.join("railguard-prober"));
    cmd.arg("fleet")
        .env("RAILGUARD_FLEET_WATCH", "true")
        // Opt-in (the chart's dra.deviceTaints): these runs are about the rules.
        .env("RAILGUARD_DRA_TAINTS", "true")
        .env("RAILGUARD_KUBECONFIG", cp.kubeconfig_path())
        .env("RAILGUARD_FLEET_INTERVAL_SECS", "3")
        .env("RAILGUARD_FLEET_SETTLE_SECS", "1")
        .env("RAILGUARD_METRICS_LISTEN", ANY_LOOPBACK_PORT)
        .env("POD_NAMESPACE", "default")
        .env("POD_NAME", "railguard-fleet-0")
        .env("RAILGUARD_LOG", "info");
    let mut fleet = Daemon::spawn("railguard-fleet", &mut cmd, logs);
    let url = format!("http://{}", fleet.listen_addr("--metrics-listen").await);
    wait_ready(
        &format!("{url}/readyz"),
        "fleet controller",
        &mut fleet,
        logs,
    )
    .await;
    let log = std::fs::read_to_string(&fleet.log)?;
    if !log.contains("DRA device taints on") {
        bail!("the fleet controller does not say DRA is on:\n{log}");
    }
    Ok(fleet)
}

/// The DeviceTaintRules railguard wants for the cluster's Nodes now, computed with the
/// `api::dra` functions over the Nodes' certificates and the ResourceSlices (per Node its
/// rails mapped to devices by [`rail_devices`], the reasons by [`rail_taint_reasons`], the
/// rules by [`wanted_rules`]), once the API serves exactly them among the rules labelled
/// `app.kubernetes.io/managed-by=railguard-fleet`: same names, devices, taint and effect.
///
/// The fleet controller (`railguard-prober fleet --watch`, `prober/cli/src/fleet/dra.rs`)
/// writes them; this only computes what it must have written and waits for it.
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
    eventually(
        Duration::from_secs(60),
        "the fleet controller's DeviceTaintRules",
        || async {
            let existing: Vec<ExistingRule> = rules
                .list(&managed)
                .await?
                .items
                .iter()
                .filter_map(|r| ExistingRule::from_object(&serde_json::to_value(r).ok()?))
                .collect();
            let plan = plan_rules(&wanted, &existing);
            Ok(if plan.apply.is_empty() && plan.delete.is_empty() {
                Ok(())
            } else {
                Err(NotYet(format!(
                    "missing or different: {:?}; not wanted: {:?}",
                    plan.apply.iter().map(|w| &w.name).collect::<Vec<_>>(),
                    plan.delete
                )))
            })
        },
    )
    .await?;
    Ok(wanted)
}

/// A rails claim is allocated `rails` GPUs and `rails` NICs on `node`, aligned: per-pair
/// templates (`gpu-i`/`nic-i`) pair by pair under one root, the whole-node template (`gpus`,
/// `nics`: every GPU and rail NIC) with each GPU's root also a NIC's, one each.
fn assert_aligned(layout: &NodeLayout, alloc: &[Allocated], rails: usize) {
    assert_eq!(alloc.len(), 2 * rails, "{alloc:?}");
    for a in alloc {
        assert_eq!(a.pool, layout.node, "{a:?}");
    }
    let root = |a: &Allocated| layout.pcie_root_of(&a.driver, &a.device);
    let mut gpu_roots = Vec::new();
    let mut nic_roots = Vec::new();
    for a in alloc {
        let r = root(a).unwrap_or_else(|| panic!("{a:?} has no root"));
        if a.driver == api_dra::NVIDIA_GPU_DRIVER {
            gpu_roots.push(r);
        } else {
            assert_eq!(a.driver, api_dra::DRANET_DRIVER, "{a:?}");
            nic_roots.push(r);
        }
    }
    gpu_roots.sort();
    nic_roots.sort();
    assert_eq!(gpu_roots, nic_roots, "GPUs and NICs not aligned: {alloc:?}");
    for i in 0..rails {
        let (g, n) = (
            alloc.iter().find(|a| a.request == format!("gpu-{i}")),
            alloc.iter().find(|a| a.request == format!("nic-{i}")),
        );
        if let (Some(g), Some(n)) = (g, n) {
            assert_eq!(root(g), root(n), "pair {i} not aligned: {g:?} {n:?}");
        }
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
    let mut c = Cluster::start(None, DraTaintEffect::NoSchedule).await?;
    let client = c.client();
    let (healthy, link_down, gdr) = ("gpu-a", "gpu-b", "gpu-c");
    let (down_rail, gdr_rail) = ("mlx5_3:1", "mlx5_9:1");
    c.add_node(healthy, &[]).await?;
    c.add_node(link_down, &[(down_rail, RailFault::LinkDown)])
        .await?;
    c.add_node(gdr, &[(gdr_rail, RailFault::Gpudirect)]).await?;
    let rules = c.wait_rules().await?;

    // The rules: the NIC of the link-down rail; the NIC and the GPU of the GPUDirect one.
    let layouts = c.layouts.clone();
    let nic = |node: &str, rail: &str| {
        let p = layouts[node].pair(rail).unwrap();
        (
            api_dra::DRANET_DRIVER.to_string(),
            NodeLayout::nic_device(&p.nic),
        )
    };
    let gpu = |node: &str, rail: &str| {
        let p = layouts[node].pair(rail).unwrap();
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
    let rules = c.wait_rules().await?;
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

/// The rail (`hca:port`) whose NIC `alloc` holds on `layout`'s node.
fn rail_of_nic(layout: &NodeLayout, alloc: &[Allocated]) -> String {
    let nic = alloc
        .iter()
        .find(|a| a.driver == api_dra::DRANET_DRIVER)
        .unwrap_or_else(|| panic!("no NIC in {alloc:?}"));
    layout
        .pairs
        .iter()
        .find(|p| NodeLayout::nic_device(&p.nic) == nic.device)
        .unwrap_or_else(|| panic!("{} is no rail's NIC", nic.device))
        .rail
        .clone()
}

/// The pod's `DisruptionTarget` condition (reason, message), if any, and whether it is being
/// deleted; `None` once it is gone.
async fn disruption(
    client: &Client,
    pod: &str,
) -> Result<Option<(Option<(String, String)>, bool)>> {
    let Some(p) = Api::<Pod>::namespaced(client.clone(), NS)
        .get_opt(pod)
        .await?
    else {
        return Ok(None);
    };
    let cond = p
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        .map(|c| (c.reason.unwrap_or_default(), c.message.unwrap_or_default()));
    Ok(Some((cond, p.metadata.deletion_timestamp.is_some())))
}

/// (d) `NoExecute`: the device taint eviction controller evicts exactly the pods whose
/// claims hold a tainted device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_execute_device_taints_evict_the_pods_holding_the_devices() -> Result<()> {
    let t0 = Instant::now();
    let mut c = Cluster::start(None, DraTaintEffect::NoExecute).await?;
    let client = c.client();
    let node = "gpu-d";
    c.add_node(node, &[]).await?;
    assert!(c.wait_rules().await?.is_empty());
    let layout = c.layouts[node].clone();

    // Three 1-rail pods on the node, bound, their claims allocated. `victim-now` may go at
    // once (grace 0); the others have the default 30 s.
    let mut now_pod = claim_pod("victim-now", &template(1));
    now_pod
        .spec
        .as_mut()
        .unwrap()
        .termination_grace_period_seconds = Some(0);
    let mut rails = BTreeMap::new();
    for pod in [
        claim_pod("victim", &template(1)),
        now_pod,
        claim_pod("bystander", &template(1)),
    ] {
        let name = pod.metadata.name.clone().unwrap();
        c.create_pod(pod).await?;
        let (bound, alloc) = wait_allocated(&client, NS, &name, BIND).await?;
        assert_eq!(bound, node);
        assert_aligned(&layout, &alloc, 1);
        rails.insert(name, (rail_of_nic(&layout, &alloc), alloc));
    }
    let (victim_rail, victim_alloc) = rails["victim"].clone();
    let (now_rail, now_alloc) = rails["victim-now"].clone();
    let (_, bystander_alloc) = rails["bystander"].clone();
    eprintln!("dra_e2e: (d) victim on {victim_rail}, victim-now on {now_rail}");

    // The victim's rail loses its link (its NIC is tainted), victim-now's its GPUDirect path
    // (NIC and GPU): NoExecute, as the profile says.
    c.recertify(
        node,
        &[
            (victim_rail.as_str(), RailFault::LinkDown),
            (now_rail.as_str(), RailFault::Gpudirect),
        ],
    )
    .await?;
    let rules = c.wait_rules().await?;
    assert_eq!(rules.len(), 3, "{rules:?}");
    assert!(rules.iter().all(|r| r.effect == DraTaintEffect::NoExecute));
    let tainted = tainted_on(&rules, node);
    let held = |alloc: &[Allocated]| -> BTreeSet<(String, String)> {
        alloc
            .iter()
            .map(|a| (a.driver.clone(), a.device.clone()))
            .collect()
    };
    assert_eq!(held(&victim_alloc).intersection(&tainted).count(), 1);
    assert_eq!(held(&now_alloc).intersection(&tainted).count(), 2);
    assert!(held(&bystander_alloc).is_disjoint(&tainted));

    // The victim is marked and deleted; bound and with no kubelet to confirm its end, it
    // stays Terminating. victim-now (grace 0) is gone.
    let (reason, message) = eventually(BIND, "the victim marked and deleted", || async {
        Ok(match disruption(&client, "victim").await? {
            Some((Some(cond), true)) => Ok(cond),
            other => Err(NotYet(format!("{other:?}"))),
        })
    })
    .await?;
    assert_eq!(reason, "DeletionByDeviceTaintManager", "{message}");
    eventually(BIND, "victim-now gone", || async {
        Ok(match disruption(&client, "victim-now").await? {
            None => Ok(()),
            Some(seen) => Err(NotYet(format!("{seen:?}"))),
        })
    })
    .await?;
    let events = eventually(BIND, "the eviction event of the victim", || async {
        let reasons: Vec<String> = Api::<Event>::namespaced(client.clone(), NS)
            .list(&ListParams::default().fields("involvedObject.name=victim"))
            .await?
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        Ok(
            if reasons.iter().any(|r| r == "DeviceTaintManagerEviction") {
                Ok(reasons)
            } else {
                Err(NotYet(format!("{reasons:?}")))
            },
        )
    })
    .await?;
    // The victim's rule says what it did.
    let victim_nic = victim_alloc
        .iter()
        .find(|a| a.driver == api_dra::DRANET_DRIVER)
        .unwrap()
        .device
        .clone();
    let rule = rules
        .iter()
        .find(|r| r.device.device == victim_nic)
        .unwrap()
        .name
        .clone();
    // The victim's rule reports the eviction done (kube-controller-manager updates the
    // status some 10 s after an eviction): no pod pending, one evicted. The Terminating
    // victim counts as evicted, not pending.
    let status = eventually(BIND, "the rule's eviction completed", || async {
        let r = serde_json::to_value(dra::taint_rules(&client).get(&rule).await?)?;
        let cond = r
            .pointer("/status/conditions")
            .and_then(|c| c.as_array())
            .and_then(|c| {
                c.iter()
                    .find(|c| c["type"] == "EvictionInProgress")
                    .cloned()
            });
        Ok(match cond {
            Some(c) if c["reason"] == "Completed" => Ok(c),
            other => Err(NotYet(format!("{other:?}"))),
        })
    })
    .await?;
    assert_eq!(status["status"], "False", "{status}");
    assert_eq!(
        status["message"], "1 pod evicted since starting the controller.",
        "{status}"
    );
    eprintln!("dra_e2e: (d) victim: {reason}: {message}; events {events:?}; rule {rule}: {status}");

    // The bystander holds no tainted device: left alone (by now the controller has
    // evicted what it was going to and reported it).
    assert_eq!(
        disruption(&client, "bystander").await?,
        Some((None, false)),
        "the bystander was disturbed"
    );
    eprintln!("dra_e2e: (d) passed in {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// (e) A plain `nvidia.com/gpu` request is served by DRA from the GPU class (the Node has
/// no such allocatable) and gets only untainted GPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_resource_gpu_requests_get_untainted_gpus_only() -> Result<()> {
    let t0 = Instant::now();
    let mut c = Cluster::start(Some(GPU_RESOURCE), DraTaintEffect::NoSchedule).await?;
    let client = c.client();
    let node = "gpu-e";
    // Every rail but one fails on its GPUDirect path: seven GPUs tainted, one not.
    let healthy_rail = "mlx5_6:1";
    let rails: Vec<String> =
        c.hw.profile
            .spec
            .rails
            .iter()
            .map(|r| format!("{}:{}", r.hca, r.port))
            .collect();
    let faults: Vec<(&str, RailFault)> = rails
        .iter()
        .filter(|r| *r != healthy_rail)
        .map(|r| (r.as_str(), RailFault::Gpudirect))
        .collect();
    c.add_node(node, &faults).await?;
    let n = Api::<Node>::all(client.clone()).get(node).await?;
    let allocatable = n.status.and_then(|s| s.allocatable).unwrap_or_default();
    assert!(!allocatable.contains_key(GPU_RESOURCE), "{allocatable:?}");
    let rules = c.wait_rules().await?;
    assert_eq!(rules.len(), 14, "seven NICs and seven GPUs");
    let healthy_gpu = NodeLayout::gpu_device(&c.layouts[node].pair(healthy_rail).unwrap().gpu);

    c.create_pod(extended_resource_pod("cuda-1", GPU_RESOURCE, 1))
        .await?;
    let (bound, alloc) = wait_allocated(&client, NS, "cuda-1", BIND).await?;
    assert_eq!(bound, node);
    assert_eq!(alloc.len(), 1, "{alloc:?}");
    assert_eq!(alloc[0].driver, api_dra::NVIDIA_GPU_DRIVER);
    assert_eq!(alloc[0].pool, node);
    assert_eq!(alloc[0].device, healthy_gpu, "{alloc:?}");
    eprintln!("dra_e2e: (e) cuda-1 on {bound}: {alloc:?}");

    c.create_pod(extended_resource_pod("cuda-2", GPU_RESOURCE, 1))
        .await?;
    let why = assert_unschedulable(&client, "cuda-2").await?;
    eprintln!("dra_e2e: (e) cuda-2 waits: {why}");

    // Recertified healthy: the rules go and the waiting request gets a GPU.
    c.recertify(node, &[]).await?;
    assert!(c.wait_rules().await?.is_empty());
    let (bound, alloc) = wait_allocated(&client, NS, "cuda-2", BIND).await?;
    assert_eq!(bound, node);
    assert_eq!(alloc.len(), 1, "{alloc:?}");
    assert_ne!(alloc[0].device, healthy_gpu, "{alloc:?}");
    eprintln!(
        "dra_e2e: (e) cuda-2 on {bound} after recertification: {alloc:?}; {:.1}s in all",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Day one changes nothing (#44): the chart's defaults on 1.37, with DRA served, slices
/// published and a failed rail and an expired certificate on the Nodes. The fleet controller
/// runs exactly as the chart renders it (its env, its ServiceAccount and RBAC): it computes
/// the fleet, says DRA taints are off, and writes no DeviceTaintRule and no Node taint; an
/// 8-rail claim on each node is allocated, the failed rail's NIC included, as without
/// railguard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_defaults_write_no_device_taint_and_change_no_placement() -> Result<()> {
    use railguard_tests::chart_values::DEFAULT;
    use railguard_tests::install::ChartFleet;

    let (cp, client, hw) = scheduling_cluster().await?;
    Api::<FabricProfile>::all(client.clone())
        .create(&PostParams::default(), &hw.profile)
        .await?;
    let ns = DEFAULT.namespace;
    cp.create_namespace(ns, &BTreeMap::new()).await?;
    // The chart as `helm install` renders it with its defaults against this server.
    let docs: Vec<serde_json::Value> = DEFAULT
        .render(&dra::chart_api_versions(), dra::CHART_KUBE_VERSION)?
        .into_iter()
        .map(|d| d.obj)
        .collect();
    let shipped: Vec<&serde_json::Value> = docs
        .iter()
        .filter(|d| {
            d["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("resource.k8s.io/"))
        })
        .collect();
    if !shipped
        .iter()
        .any(|d| d["metadata"]["name"] == template(8).as_str())
    {
        bail!("the default chart ships no {} on 1.37", template(8));
    }
    for obj in &shipped {
        dra::apply(&client, obj).await?;
    }

    // A node with a link-down rail, and one whose certificate expired an hour ago.
    let (down_node, expired_node, down_rail) = ("gpu-a", "gpu-b", "mlx5_3:1");
    let mut layouts = BTreeMap::new();
    for (node, faults) in [
        (down_node, vec![(down_rail, RailFault::LinkDown)]),
        (expired_node, vec![]),
    ] {
        cp.create_node(
            node,
            &labels(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]),
            &[],
        )
        .await?;
        let mut cert = hw.certificate(node, &faults);
        if node == expired_node {
            cert.issued_at = Timestamp::now() - jiff::SignedDuration::from_hours(7);
            cert.expires_at = Timestamp::now() - jiff::SignedDuration::from_hours(1);
        }
        cp.publish_certificate(node, &cert).await?;
        let layout = hw.layout(node)?;
        publish_slices(&client, &layout).await?;
        layouts.insert(node, layout);
    }

    let mut fleet = ChartFleet::start(&cp, &docs, ns, "railguard-fleet-day-one").await?;
    // It ran over both nodes: status.fleet is computed, and the expired certificate's node
    // is `pending` (the one write day one makes, a label only the webhook's affinity reads).
    let profiles: Api<FabricProfile> = Api::all(client.clone());
    eventually(Duration::from_secs(90), "status.fleet", || {
        let profiles = profiles.clone();
        async move {
            Ok(profiles
                .get_status(PROFILE)
                .await?
                .status
                .and_then(|s| s.fleet)
                .and_then(|f| f.computed_at))
        }
    })
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(Duration::from_secs(90), "the expired node pending", || {
        let nodes = nodes.clone();
        async move {
            let n = nodes.get(expired_node).await?;
            Ok(n.metadata
                .labels
                .and_then(|l| l.get(railguard_api::keys::LABEL_FABRIC).cloned())
                .filter(|v| v == "pending"))
        }
    })
    .await?;

    // Claims land as they would without railguard: both nodes serve all eight pairs.
    let mut placed = BTreeMap::new();
    for pod in ["train-8a", "train-8b"] {
        Api::<Pod>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &claim_pod(pod, &template(8)))
            .await?;
        let (node, alloc) = wait_allocated(&client, ns, pod, BIND).await?;
        assert_aligned(&layouts[node.as_str()], &alloc, 8);
        placed.insert(node, alloc);
    }
    assert_eq!(
        placed.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        BTreeSet::from([down_node, expired_node]),
        "one 8-rail claim on each node, the failed and the expired one"
    );
    let down_nic = NodeLayout::nic_device(&layouts[down_node].pair(down_rail).unwrap().nic);
    assert!(
        placed[down_node].iter().any(|a| a.device == down_nic),
        "the failed rail's NIC {down_nic} is allocated as without railguard: {:?}",
        placed[down_node]
    );

    // Several recomputations later (settle 5 s): no rule, no taint, nothing refused.
    tokio::time::sleep(Duration::from_secs(12)).await;
    fleet.daemon.assert_running(cp.log_dir());
    let rules = dra::taint_rules(&client)
        .list(&ListParams::default())
        .await?;
    assert!(
        rules.items.is_empty(),
        "DeviceTaintRules exist: {:?}",
        rules
            .items
            .iter()
            .map(|r| r.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    for node in nodes.list(&ListParams::default()).await? {
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        assert!(
            taints.is_empty(),
            "{:?} tainted: {taints:?}",
            node.metadata.name
        );
    }
    let log = fleet.log()?;
    assert!(
        log.contains("DRA device taints off (--dra-taints=false"),
        "the controller says DRA taints are off:\n{log}"
    );
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "a request of the fleet controller was refused:\n{log}"
    );
    // And it may not write one: the default RBAC has no DeviceTaintRule.
    let as_fleet = fleet.client().await?;
    match dra::taint_rules(&as_fleet)
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => bail!("the default fleet identity reads DeviceTaintRules: {other:?}"),
    }
    Ok(())
}
