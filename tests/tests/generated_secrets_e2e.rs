//! The Secrets the chart no longer generates (issue #31), filled by the pods that use them,
//! on the real kube-apiserver (1.20 by default, 1.37 with `RAILGUARD_KUBE_VERSION=1.37`):
//!
//! - the chart's own objects (`helm template` with the default values): the empty
//!   `railguard-extender-tls` and `railguard-peer-token` Secrets, the service accounts and
//!   the Roles that let exactly those accounts get and update them;
//! - the init containers as rendered (their args, `--out` pointed at a test directory),
//!   run as the real binaries under their pods' service accounts' tokens: two of each
//!   racing on the empty Secret end with one set (one writer issues, the other uses it) and
//!   the same files; a later run keeps what is there;
//! - the 409 path itself, deterministic: a competing write between the read and the update
//!   makes the update fail with Conflict, and the loser adopts the winner's data;
//! - the extender serving the set's pair and requiring its client certificate, called by the
//!   real kube-scheduler with the set's `caFile`/`certFile`/`keyFile` (as the chart's
//!   tlsConfig has them), places a training pod on the certified node.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::Client;
use railguard_api::{FabricProfile, Verdict};
use railguard_kube::secret_fill::{fill_secret, FillAction, SecretToFill};
use railguard_sim::certificates as synth;
use railguard_tests::chart_values::DEFAULT;
use railguard_tests::daemon::{wait_ready, Daemon, ANY_LOOPBACK_PORT};
use railguard_tests::helm::{kube_1_20_api_versions, KUBE_1_20_VERSION};
use railguard_tests::{
    fixture_profile, labels, service_account_token, wait_bound, workspace_binary, ControlPlane,
};
use serde_json::{json, Value as Json};

const NS: &str = "railguard";
const TLS_SECRET: &str = "railguard-extender-tls";
const TOKEN_SECRET: &str = "railguard-peer-token";
const TLS_FILES: [&str; 5] = ["ca.crt", "tls.crt", "tls.key", "client.crt", "client.key"];

/// The chart's default render, as objects.
fn rendered() -> Vec<Json> {
    railguard_tests::helm::shared()
        .template_docs(&DEFAULT, &kube_1_20_api_versions(), KUBE_1_20_VERSION)
        .unwrap()
        .into_iter()
        .map(|d| d.obj)
        .collect()
}

fn find<'a>(docs: &'a [Json], kind: &str, name: &str) -> &'a Json {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} rendered"))
}

/// Creates the rendered object `kind/name` in [`NS`].
async fn create<K>(client: &Client, docs: &[Json], kind: &str, name: &str)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(find(docs, kind, name).clone()).unwrap();
    Api::<K>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {kind}/{name}: {e}"));
}

/// A kubeconfig that authenticates as `account` of [`NS`] (a token the API server issues).
async fn kubeconfig_for(cp: &ControlPlane, account: &str, dir: &Path) -> PathBuf {
    let token = service_account_token(&cp.client(), NS, account, None)
        .await
        .unwrap();
    let ca = dir.join("cluster-ca.crt");
    std::fs::write(&ca, cp.ca_pem()).unwrap();
    let path = dir.join(format!("{account}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: {account}\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: {account}\ncurrent-context: c\n",
            cp.server_url(),
            ca.display()
        ),
    )
    .unwrap();
    path
}

/// The init container `init` of a rendered pod, as a command: its binary and args, `--out`
/// written to `out` instead, the cluster reached with `kubeconfig`.
fn init_command(bin: &Path, init: &Json, out: &Path, kubeconfig: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin);
    for a in init["args"].as_array().unwrap() {
        let a = a.as_str().unwrap();
        match a.strip_prefix("--out=") {
            Some(path) => {
                let file = Path::new(path).file_name().unwrap();
                // The extender's --out is a directory, the token's a file in one.
                if init["name"] == "peer-token" {
                    cmd.arg(format!("--out={}", out.join(file).display()));
                } else {
                    cmd.arg(format!("--out={}", out.display()));
                }
            }
            None => {
                cmd.arg(a);
            }
        }
    }
    cmd.env("RAILGUARD_KUBECONFIG", kubeconfig)
        .env("RAILGUARD_LOG", "info")
        .kill_on_drop(true);
    cmd
}

/// Runs the commands at once; each must succeed. Their logs, in order.
async fn race(cmds: Vec<tokio::process::Command>) -> Vec<String> {
    let runs = cmds
        .into_iter()
        .map(|mut c| async move { c.output().await.unwrap() });
    futures::future::join_all(runs)
        .await
        .into_iter()
        .map(|o| {
            let log = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(o.status.success(), "{}: {log}", o.status);
            log
        })
        .collect()
}

fn read_files(dir: &Path, names: &[&str]) -> BTreeMap<String, Vec<u8>> {
    names
        .iter()
        .map(|n| (n.to_string(), std::fs::read(dir.join(n)).unwrap()))
        .collect()
}

async fn secret_data(client: &Client, name: &str) -> BTreeMap<String, Vec<u8>> {
    let secret = Api::<Secret>::namespaced(client.clone(), NS)
        .get(name)
        .await
        .unwrap();
    railguard_kube::secret_fill::secret_data(&secret)
}

fn count(logs: &[String], needle: &str) -> usize {
    logs.iter().filter(|l| l.contains(needle)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pods_fill_the_charts_empty_secrets_once_and_the_scheduler_speaks_mtls_with_the_set() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let extender_bin = workspace_binary("railguard-extender-cli", "railguard-extender").unwrap();
    let prober_bin = workspace_binary("railguard-prober-cli", "railguard-prober").unwrap();
    let mut cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client();
    let dir = tempfile::tempdir().unwrap();
    let logs = cp.log_dir().to_path_buf();

    // The chart's objects: the empty Secrets, the accounts of the pods that fill them, and
    // the Roles that name each Secret.
    let docs = rendered();
    cp.create_namespace(NS, &labels(&[])).await.unwrap();
    for secret in [TLS_SECRET, TOKEN_SECRET] {
        assert!(
            find(&docs, "Secret", secret).get("data").is_none(),
            "{secret} is rendered empty"
        );
        create::<Secret>(&client, &docs, "Secret", secret).await;
        create::<Role>(&client, &docs, "Role", secret).await;
        create::<RoleBinding>(&client, &docs, "RoleBinding", secret).await;
    }
    for account in [
        "railguard-scheduler",
        "railguard-prober",
        "railguard-campaign",
    ] {
        create::<ServiceAccount>(&client, &docs, "ServiceAccount", account).await;
    }

    // The extender's set: the scheduler pod's init container, twice at once (two replicas
    // starting together), under the scheduler's account.
    let scheduler_pod =
        &find(&docs, "Deployment", "railguard-scheduler")["spec"]["template"]["spec"];
    assert_eq!(scheduler_pod["serviceAccountName"], "railguard-scheduler");
    let tls_init = &scheduler_pod["initContainers"][0];
    assert_eq!(tls_init["name"], "extender-tls");
    let scheduler_kc = kubeconfig_for(&cp, "railguard-scheduler", dir.path()).await;
    let (out_a, out_b, out_c) = (
        dir.path().join("replica-a"),
        dir.path().join("replica-b"),
        dir.path().join("later"),
    );
    let tls_logs = race(vec![
        init_command(&extender_bin, tls_init, &out_a, &scheduler_kc),
        init_command(&extender_bin, tls_init, &out_b, &scheduler_kc),
    ])
    .await;
    assert_eq!(
        count(&tls_logs, "issued a new set"),
        1,
        "exactly one writer: {tls_logs:?}"
    );
    let set = read_files(&out_a, &TLS_FILES);
    assert_eq!(set, read_files(&out_b, &TLS_FILES), "one set in both pods");
    assert_eq!(
        secret_data(&client, TLS_SECRET).await,
        set,
        "the Secret holds it"
    );
    // The files are readable by the pod's user and group only, like the Secret volume was.
    use std::os::unix::fs::PermissionsExt as _;
    for f in TLS_FILES {
        let mode = std::fs::metadata(out_a.join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o440, "{f}");
    }
    // A pod started later (an upgrade's new ReplicaSet) keeps the set.
    let later = race(vec![init_command(
        &extender_bin,
        tls_init,
        &out_c,
        &scheduler_kc,
    )])
    .await;
    assert_eq!(count(&later, "kept the Secret's set"), 1, "{later:?}");
    assert_eq!(read_files(&out_c, &TLS_FILES), set);

    // The campaign token: a prober's and a campaign pod's init container at once, each under
    // its own account.
    let prober_ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "railguard-prober-h100-ndr")
        .unwrap();
    let prober_pod = &prober_ds["spec"]["template"]["spec"];
    let campaign_pod = &find(&docs, "CronJob", "railguard-campaign-h100-ndr")["spec"]
        ["jobTemplate"]["spec"]["template"]["spec"];
    let token_init = |pod: &Json| -> Json {
        pod["initContainers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "peer-token")
            .unwrap()
            .clone()
    };
    let prober_kc = kubeconfig_for(&cp, "railguard-prober", dir.path()).await;
    let campaign_kc = kubeconfig_for(&cp, "railguard-campaign", dir.path()).await;
    let token_logs = race(vec![
        init_command(&prober_bin, &token_init(prober_pod), &out_a, &prober_kc),
        init_command(&prober_bin, &token_init(campaign_pod), &out_b, &campaign_kc),
    ])
    .await;
    assert_eq!(count(&token_logs, "generated a token"), 1, "{token_logs:?}");
    let token = std::fs::read(out_a.join("token")).unwrap();
    assert_eq!(token.len(), 48);
    assert!(token.iter().all(u8::is_ascii_alphanumeric));
    assert_eq!(std::fs::read(out_b.join("token")).unwrap(), token);
    assert_eq!(secret_data(&client, TOKEN_SECRET).await["token"], token);
    let later = race(vec![init_command(
        &prober_bin,
        &token_init(prober_pod),
        &out_c,
        &prober_kc,
    )])
    .await;
    assert_eq!(count(&later, "kept the Secret's token"), 1, "{later:?}");
    assert_eq!(std::fs::read(out_c.join("token")).unwrap(), token);

    // Their accounts may touch nothing but their own Secret: the token writer cannot fill
    // the extender's.
    let foreign = run_allowing_failure(init_command(
        &prober_bin,
        &token_init(prober_pod),
        &out_c,
        &scheduler_kc,
    ))
    .await;
    assert!(
        !foreign.0 && foreign.1.contains("forbidden"),
        "the scheduler's account may not read the token: {}",
        foreign.1
    );

    // The 409 path, deterministic: another writer fills the Secret between this read and
    // this update; the update fails with Conflict and the winner's data is used.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let empty: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "raced"}, "type": "Opaque",
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &empty)
        .await
        .unwrap();
    let winner = BTreeMap::from([("k".to_string(), b"winner".to_vec())]);
    let calls = AtomicUsize::new(0);
    let target = SecretToFill {
        namespace: NS,
        name: "raced",
        keys: &["k"],
        field_manager: "railguard-e2e",
    };
    let filled = fill_secret(&client, &target, || {
        calls.fetch_add(1, Ordering::SeqCst);
        let secrets = secrets.clone();
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                let mut s = secrets.get("raced").await.unwrap();
                s.data = Some(BTreeMap::from([(
                    "k".to_string(),
                    ByteString(b"winner".to_vec()),
                )]));
                secrets
                    .replace("raced", &PostParams::default(), &s)
                    .await
                    .unwrap();
            })
        });
        Ok(BTreeMap::from([("k".to_string(), b"loser".to_vec())]))
    })
    .await
    .unwrap();
    assert_eq!(filled.action, FillAction::AdoptedWinner);
    assert_eq!(filled.data, winner);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(secret_data(&client, "raced").await, winner);

    // The extender serving the set (as the chart's sidecar: the replica's files), and the
    // real kube-scheduler calling it with the other replica's copy of the CA and client pair.
    cp.apply_fabricprofile_crd().await.unwrap();
    let h100: FabricProfile = fixture_profile("dgx-h100-ndr.yaml").unwrap();
    Api::<FabricProfile>::all(client.clone())
        .create(&PostParams::default(), &h100)
        .await
        .unwrap();
    let product = "nvidia.com/gpu.product";
    let pool = h100.spec.node_selector[product].as_str();
    let alloc = [("nvidia.com/gpu", "8"), ("rdma/rdma_shared_device_a", "1")];
    for node in ["n-certified", "n-uncertified"] {
        cp.create_node(node, &labels(&[(product, pool)]), &alloc)
            .await
            .unwrap();
    }
    let issued = Timestamp::now()
        .checked_sub(SignedDuration::from_secs(3600))
        .unwrap();
    let cert = synth::certificate(&h100, Verdict::Certified, issued, 392.0, 370.0);
    cp.publish_certificate("n-certified", &cert).await.unwrap();

    let admin_kc = cp.kubeconfig_path().to_path_buf();
    let mut extender = Daemon::spawn(
        "railguard-extender",
        std::process::Command::new(&extender_bin)
            .arg("--kubeconfig")
            .arg(&admin_kc)
            .arg(format!("--listen={ANY_LOOPBACK_PORT}"))
            .arg(format!("--metrics-listen={ANY_LOOPBACK_PORT}"))
            .arg(format!("--tls-cert={}", out_a.join("tls.crt").display()))
            .arg(format!("--tls-key={}", out_a.join("tls.key").display()))
            .arg(format!(
                "--tls-client-ca={}",
                out_a.join("ca.crt").display()
            ))
            .arg("--report-unresolvable-as-failed"),
        &logs,
    );
    let port = extender.listen_addr("--listen").await.port();
    let metrics = extender.listen_addr("--metrics-listen").await.port();
    wait_ready(
        &format!("http://127.0.0.1:{metrics}/readyz"),
        "railguard-extender",
        &mut extender,
        &logs,
    )
    .await;
    cp.start_scheduler(&format!(
        "- urlPrefix: \"https://127.0.0.1:{port}\"\n  filterVerb: filter\n  prioritizeVerb: prioritize\n  weight: 5\n  enableHTTPS: true\n  tlsConfig:\n    caFile: {}\n    certFile: {}\n    keyFile: {}\n  nodeCacheCapable: true\n  ignorable: false\n  managedResources:\n    - name: nvidia.com/gpu\n      ignoredByScheduler: false\n",
        out_b.join("ca.crt").display(),
        out_b.join("client.crt").display(),
        out_b.join("client.key").display(),
    ))
    .await
    .unwrap();
    cp.create_namespace("train", &labels(&[])).await.unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer", "annotations": {
            "railguard.io/profile": h100.name(),
            "railguard.io/signature": h100.spec.signature(),
        }},
        "spec": {"containers": [{
            "name": "trainer", "image": "registry.invalid/trainer:1",
            "resources": {"limits": {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1"}},
        }]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "train")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    assert_eq!(
        wait_bound(&client, "train", "trainer").await.unwrap(),
        "n-certified",
        "placed through the extender over mTLS (logs in {})",
        logs.display()
    );
    // The extender answered the scheduler (its filter counted the uncertified node).
    extender.assert_running(&logs);
    let text = reqwest::get(format!("http://127.0.0.1:{metrics}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let filtered: f64 = text
        .lines()
        .find(|l| l.starts_with("railguard_extender_filter_duration_seconds_count"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_default();
    assert!(filtered >= 1.0, "no /filter call answered: {text}");
    drop(extender);
    cp.stop_scheduler();
}

/// Runs one command that may fail: (succeeded, its log).
async fn run_allowing_failure(mut cmd: tokio::process::Command) -> (bool, String) {
    let o = cmd.output().await.unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// `helm ARGS --namespace NS --kubeconfig K`, which must succeed.
fn helm_on(cp: &ControlPlane, args: &[&str]) {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--namespace", NS]);
    railguard_tests::helm::shared()
        .on_cluster(cp.kubeconfig_path(), &all)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

async fn both_secrets(client: &Client) -> BTreeMap<&'static str, BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for name in [TLS_SECRET, TOKEN_SECRET] {
        out.insert(name, secret_data(client, name).await);
    }
    out
}

/// What the init containers do, in-process: fill each Secret the way its command does.
async fn fill_as_the_pods_do(client: &Client) {
    let spec = railguard_extender_cli::tls_material::TlsMaterialSpec {
        ca_common_name: "railguard-extender-ca".into(),
        server_common_name: "railguard-extender".into(),
        server_ips: vec!["127.0.0.1".parse().unwrap()],
        server_dns: vec!["localhost".into()],
        client_common_name: "railguard-scheduler".into(),
        validity_days: 30,
    };
    let tls = SecretToFill {
        namespace: NS,
        name: TLS_SECRET,
        keys: &railguard_extender_cli::tls_material::KEYS,
        field_manager: railguard_extender_cli::tls_bootstrap::FIELD_MANAGER,
    };
    let filled = fill_secret(client, &tls, || {
        railguard_extender_cli::tls_material::issue(
            &spec,
            railguard_kube::pki::time::OffsetDateTime::now_utc(),
        )
        .map_err(|e| e.into())
    })
    .await
    .unwrap();
    assert!(matches!(filled.action, FillAction::Filled { .. }));
    let token = SecretToFill {
        namespace: NS,
        name: TOKEN_SECRET,
        keys: &["token"],
        field_manager: railguard_prober_cli::peer_token::FIELD_MANAGER,
    };
    let filled = fill_secret(client, &token, || {
        Ok(BTreeMap::from([(
            "token".to_string(),
            railguard_campaign::token::generate_token().into_bytes(),
        )]))
    })
    .await
    .unwrap();
    assert!(matches!(filled.action, FillAction::Filled { .. }));
}

/// `helm upgrade` keeps what is in the Secrets: what the pods wrote after an install of this
/// chart (which rendered them empty), and what the previous release (0.1.0, which generated
/// the token and the extender's set in its templates) rendered. Without `lookup` rendering
/// the data back, Helm's three-way merge would remove the keys the new manifest drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_upgrade_keeps_what_the_pods_or_the_previous_release_put_in_the_secrets() {
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client();
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, "extender:\n  tls:\n    enabled: true\n").unwrap();
    let values = values.to_str().unwrap();
    let chart = railguard_tests::helm::chart_dir();
    let chart = chart.to_str().unwrap();
    cp.create_namespace(NS, &labels(&[])).await.unwrap();

    // This chart: installed empty, filled by the pods, kept by two upgrades.
    helm_on(
        &cp,
        &["install", "railguard", chart, "--no-hooks", "-f", values],
    );
    for (name, data) in both_secrets(&client).await {
        assert!(data.is_empty(), "{name} installed empty: {data:?}");
    }
    fill_as_the_pods_do(&client).await;
    let filled = both_secrets(&client).await;
    for _ in 0..2 {
        helm_on(
            &cp,
            &["upgrade", "railguard", chart, "--no-hooks", "-f", values],
        );
        assert_eq!(both_secrets(&client).await, filled, "kept by helm upgrade");
    }
    helm_on(&cp, &["uninstall", "railguard", "--no-hooks"]);

    // The previous release generated them in its templates; the upgrade keeps its data.
    let previous =
        railguard_tests::workspace_root().join("tests/fixtures/charts/railguard-0.1.0.tgz");
    helm_on(
        &cp,
        &[
            "install",
            "railguard",
            previous.to_str().unwrap(),
            "--no-hooks",
            "-f",
            values,
        ],
    );
    let generated = both_secrets(&client).await;
    assert_eq!(
        generated[TLS_SECRET].len(),
        TLS_FILES.len(),
        "{:?}",
        generated[TLS_SECRET].keys()
    );
    assert_eq!(generated[TOKEN_SECRET]["token"].len(), 48);
    // The release's CRD first, as the chart's pre-upgrade hook applies it (crds/ is never
    // upgraded by Helm).
    let crd = railguard_tests::workspace_root().join("charts/railguard/crds/fabricprofile.yaml");
    let out = railguard_tests::helm::shared()
        .kubectl_with(
            cp.kubeconfig_path(),
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                crd.to_str().unwrap(),
            ],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    helm_on(
        &cp,
        &["upgrade", "railguard", chart, "--no-hooks", "-f", values],
    );
    assert_eq!(both_secrets(&client).await, generated, "kept from 0.1.0");
}
