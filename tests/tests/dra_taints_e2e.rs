//! End-to-end: the fleet controller keeps DRA DeviceTaintRules for unhealthy rails, on the
//! Kubernetes 1.37 control plane (`resource.k8s.io/v1`), from certificates the real prober
//! wrote on simulated nodes and ResourceSlices shaped as dranet and NVIDIA's GPU driver
//! publish them (`railguard_tests::dra`). One test per transition of a rule's life: a rail
//! fails → its NIC is tainted; the profile changes → the rule follows in place; the rail
//! passes again → untainted; the node goes → its rules go; the leader goes → the other
//! replica takes over. On 1.20 (no DRA) the controller says once that DRA is off.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a broken fixture fails loudly

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use railguard_api::dra::{self, DeviceKind};
use railguard_api::{Certificate, FabricProfile, NodeFabric};
use railguard_tests::daemon::{wait_ready, Daemon, ANY_LOOPBACK_PORT};
use railguard_tests::dra::{layout_from_sysfs, publish_slices, taint_rules, SysfsTree};
use railguard_tests::sim_prober::{h100_profile_file, prober_bin_dir, Prober};
use railguard_tests::{
    eventually, fixture_profile, labels, scrape_metrics, ApiServerOptions, ControlPlane,
    KubeVersion, NotYet,
};
use serde_json::json;

const RDMA: &str = "rdma/rdma_shared_device_a";
/// The rail the `h100-port-down` model takes down.
const DOWN_RAIL: &str = "mlx5_5:1";
const WAIT: Duration = Duration::from_secs(90);

fn fleet(bin: &std::path::Path, kubeconfig: &std::path::Path, identity: &str) -> Command {
    let mut c = Command::new(bin.join("railguard-prober"));
    c.arg("fleet")
        .env("RAILGUARD_FLEET_WATCH", "true")
        // Opt-in (the chart's dra.deviceTaints): these runs are about the rules.
        .env("RAILGUARD_DRA_TAINTS", "true")
        .env("RAILGUARD_KUBECONFIG", kubeconfig)
        .env("RAILGUARD_FLEET_INTERVAL_SECS", "3")
        .env("RAILGUARD_FLEET_SETTLE_SECS", "1")
        .env("RAILGUARD_METRICS_LISTEN", ANY_LOOPBACK_PORT)
        .env("POD_NAMESPACE", "default")
        .env("POD_NAME", identity)
        .env("RAILGUARD_LOG", "info");
    c
}

/// railguard's rules as (name → (driver, device, value, effect)).
async fn rules(client: &Client) -> Result<BTreeMap<String, (String, String, String, String)>> {
    let list = taint_rules(client)
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            dra::LABEL_MANAGED_BY,
            dra::MANAGED_BY
        )))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|o| {
            let v = serde_json::to_value(&o).unwrap();
            let s = |p: &str| {
                v.pointer(p)
                    .and_then(|x| x.as_str())
                    .unwrap_or("")
                    .to_string()
            };
            (
                s("/metadata/name"),
                (
                    s("/spec/deviceSelector/driver"),
                    s("/spec/deviceSelector/device"),
                    s("/spec/taint/value"),
                    s("/spec/taint/effect"),
                ),
            )
        })
        .collect())
}

async fn wait_rules(
    client: &Client,
    what: &str,
    want: &BTreeMap<String, (String, String, String, String)>,
) -> Result<()> {
    eventually(WAIT, what, || async {
        let got = rules(client).await?;
        Ok(if &got == want {
            Ok(())
        } else {
            Err(NotYet(format!("rules {got:?}, want {want:?}")))
        })
    })
    .await
}

async fn certificate(nodes: &Api<Node>, name: &str) -> Result<Certificate> {
    let n = nodes.get(name).await?;
    match NodeFabric::from_node(&n, jiff::Timestamp::now())
        .state
        .certificate()
    {
        Some(c) => Ok(c.clone()),
        None => bail!("{name} has no certificate"),
    }
}

/// The rule (name → fields) the controller must keep for `device` of `node`.
fn rule(
    node: &str,
    kind: DeviceKind,
    driver: &str,
    device: &str,
    value: &str,
    effect: &str,
) -> (String, (String, String, String, String)) {
    let d = dra::DeviceRef {
        kind,
        driver: driver.into(),
        pool: node.into(),
        device: device.into(),
        pcie_root: None,
    };
    (
        dra::rule_name(node, &d),
        (driver.into(), device.into(), value.into(), effect.into()),
    )
}

#[tokio::test]
async fn device_taint_rules_follow_rail_health_profile_nodes_and_the_leader() {
    let cp = ControlPlane::start_version(KubeVersion::V1_37, &ApiServerOptions::default())
        .await
        .unwrap();
    cp.apply_fabricprofile_crd().await.unwrap();
    let client = cp.client();
    let logs = cp.log_dir().to_path_buf();
    let bin = prober_bin_dir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = cp.kubeconfig_path().to_path_buf();
    let prober = Prober {
        bin: bin.clone(),
        kubeconfig: &kubeconfig,
        work: work.path(),
        profile_file: h100_profile_file(),
    };
    let profile = fixture_profile("dgx-h100-ndr.yaml").unwrap();
    let profile_name = profile.name().to_string();
    let profiles: Api<FabricProfile> = Api::all(client.clone());
    profiles
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    for n in ["gpu-a", "gpu-b"] {
        cp.create_node(
            n,
            &labels(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]),
            &[(RDMA, "1k")],
        )
        .await
        .unwrap();
        let (code, matrix) = prober.certify(n, "dgx-h100").await.unwrap();
        assert_eq!(code, 0, "{n}:\n{matrix}");
        // The drivers publish what the node has (read from its sysfs tree).
        let cert = certificate(&nodes, n).await.unwrap();
        let tree = SysfsTree::under(&work.path().join(format!("sysfs-{n}")));
        let layout = layout_from_sysfs(n, &cert, &tree).unwrap();
        assert_eq!(layout.pairs.len(), 8, "{n}: every rail has a GPU+NIC pair");
        publish_slices(&client, &layout).await.unwrap();
    }
    let down = {
        let cert = certificate(&nodes, "gpu-a").await.unwrap();
        let rail = cert.rails.iter().find(|r| r.id() == DOWN_RAIL).unwrap();
        railguard_tests::dra::dranet_device_name(rail.pci_address.as_deref().unwrap())
    };
    // The rules while `node`'s DOWN_RAIL is down: its NIC tainted with `effect`.
    let down_rail_rules = |node: &str, effect: &str| -> BTreeMap<_, _> {
        [rule(
            node,
            DeviceKind::Nic,
            "dra.net",
            &down,
            "link-down",
            effect,
        )]
        .into()
    };

    // Two replicas; one leads.
    let mut first = Daemon::spawn(
        "railguard-fleet-0",
        &mut fleet(&bin, &kubeconfig, "railguard-fleet-0"),
        &logs,
    );
    let url = format!("http://{}", first.listen_addr("--metrics-listen").await);
    wait_ready(
        &format!("{url}/readyz"),
        "fleet controller",
        &mut first,
        &logs,
    )
    .await;
    let log = std::fs::read_to_string(&first.log).unwrap();
    assert!(
        log.contains("DRA device taints on"),
        "the controller says DRA is on:\n{log}"
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let holder = eventually(WAIT, "the first replica leads", || async {
        let l = leases.get_opt("railguard-fleet").await?;
        Ok(l.and_then(|l| l.spec?.holder_identity)
            .filter(|h| h == "railguard-fleet-0"))
    })
    .await
    .unwrap();
    assert_eq!(holder, "railguard-fleet-0");
    let mut second = Daemon::spawn(
        "railguard-fleet-1",
        &mut fleet(&bin, &kubeconfig, "railguard-fleet-1"),
        &logs,
    );

    // Healthy: no rule.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(rules(&client).await.unwrap().is_empty());

    // A port goes down on gpu-a: that rail's NIC (not its GPU, the fault is the link) is
    // tainted NoSchedule, named for the reason.
    let (code, matrix) = prober.certify("gpu-a", "h100-port-down").await.unwrap();
    assert_eq!(code, 1, "{matrix}");
    let cert = certificate(&nodes, "gpu-a").await.unwrap();
    assert_eq!(cert.verdict, railguard_api::Verdict::Degraded);
    assert_eq!(cert.usable_rails, Some(7));
    let want = down_rail_rules("gpu-a", "NoSchedule");
    wait_rules(&client, "gpu-a's down rail tainted", &want)
        .await
        .unwrap();
    let (name, _) = want.iter().next().unwrap();
    let uid = taint_rules(&client).get(name).await.unwrap().metadata.uid;

    // The profile asks for NoExecute: the same rule, updated in place.
    profiles
        .patch(
            &profile_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"dra": {"taintEffect": "NoExecute"}}})),
        )
        .await
        .unwrap();
    let mut noexec = want.clone();
    for v in noexec.values_mut() {
        v.3 = "NoExecute".into();
    }
    wait_rules(&client, "the rule follows the profile", &noexec)
        .await
        .unwrap();
    assert_eq!(
        taint_rules(&client).get(name).await.unwrap().metadata.uid,
        uid,
        "updated in place, not replaced"
    );

    // The rail passes again: untainted.
    let (code, matrix) = prober.certify("gpu-a", "dgx-h100").await.unwrap();
    assert_eq!(code, 0, "{matrix}");
    wait_rules(&client, "gpu-a recertified, untainted", &BTreeMap::new())
        .await
        .unwrap();

    // gpu-b fails the same rail, then the Node is deleted: its rules go with it.
    let (code, _) = prober.certify("gpu-b", "h100-port-down").await.unwrap();
    assert_eq!(code, 1);
    let want_b = down_rail_rules("gpu-b", "NoExecute");
    wait_rules(&client, "gpu-b's down rail tainted", &want_b)
        .await
        .unwrap();
    nodes
        .delete("gpu-b", &DeleteParams::default())
        .await
        .unwrap();
    wait_rules(&client, "gpu-b deleted, its rules too", &BTreeMap::new())
        .await
        .unwrap();

    // The leader goes: the other replica takes the Lease and keeps the rules.
    first.child.kill().unwrap();
    let _ = first.child.wait();
    let holder = eventually(
        Duration::from_secs(60),
        "the second replica leads",
        || async {
            let l = leases.get_opt("railguard-fleet").await?;
            Ok(l.and_then(|l| l.spec?.holder_identity)
                .filter(|h| h == "railguard-fleet-1"))
        },
    )
    .await
    .unwrap();
    assert_eq!(holder, "railguard-fleet-1");
    let (code, _) = prober.certify("gpu-a", "h100-port-down").await.unwrap();
    assert_eq!(code, 1);
    let want_a = down_rail_rules("gpu-a", "NoExecute");
    wait_rules(&client, "the new leader taints gpu-a", &want_a)
        .await
        .unwrap();
    second.assert_running(&logs);
    let _ = second.child.kill();
}

/// On 1.20 nothing DRA runs: the controller says so once and goes on with the rest.
#[tokio::test]
async fn on_kubernetes_1_20_the_controller_says_dra_is_off_once() {
    let cp = ControlPlane::start_version(KubeVersion::V1_20, &ApiServerOptions::default())
        .await
        .unwrap();
    cp.apply_fabricprofile_crd().await.unwrap();
    let logs = cp.log_dir().to_path_buf();
    let bin = prober_bin_dir().unwrap();
    let mut c = Daemon::spawn(
        "railguard-fleet-120",
        &mut fleet(&bin, cp.kubeconfig_path(), "railguard-fleet-120"),
        &logs,
    );
    let url = format!("http://{}", c.listen_addr("--metrics-listen").await);
    wait_ready(&format!("{url}/readyz"), "fleet controller", &mut c, &logs).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let log = std::fs::read_to_string(&c.log).unwrap();
    let said = log
        .matches("DRA device taints off: the API server does not serve resource.k8s.io/v1 DeviceTaintRules")
        .count();
    assert_eq!(said, 1, "said once:\n{log}");
    assert!(!log.contains("resourceslices"), "no DRA watch:\n{log}");
    let metrics = scrape_metrics(&url).await.unwrap();
    assert!(
        metrics.contains("railguard_fleet_device_taint_rules 0"),
        "{metrics}"
    );
    c.assert_running(&logs);
    let _ = c.child.kill();
}
