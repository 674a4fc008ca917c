//! End-to-end: the fleet of one profile on a real kube-apiserver. Ten simulated DGX H100
//! nodes certify with the real `railguard-prober certify --publish`; one of them (`gpu-07`,
//! the `h100-slow-rail` model) moves 15% less on rail mlx5_4:1 and still passes the profile's
//! thresholds. The real fleet controller (`railguard-prober fleet --watch`) marks it: the
//! `RailguardFleetOutlier` condition, a `FleetOutlier` Event and `status.fleet` name the rail,
//! the value and the baseline, and its metrics carry them. The real `railguard-extender`
//! scores it last for a multi-node job and, once the profile says `outliers: Filter`,
//! filters it out. `railguard-prober fleet --html` names it too, and the report, loaded in
//! headless Chromium, holds one heatmap cell per node × rail with only that one marked.
//! Recertified healthy, the node is cleared (`FleetOutlierCleared`).

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use railguard_api::{keys, FabricProfile};
use railguard_tests::daemon::{spawn_extender, wait_ready, Daemon, ANY_LOOPBACK_PORT};
use railguard_tests::sim_prober::{prober_bin_dir, Prober};
use railguard_tests::{
    chromium, events_about, eventually, fixture_profile, labels, scrape_metrics, ControlPlane,
    ServingCertificate,
};
use serde_json::{json, Value};

const RDMA: &str = "rdma/rdma_shared_device_a";
const NODES: usize = 10;
const SLOW: &str = "gpu-07";
const SLOW_RAIL: &str = "mlx5_4:1";
const JOB: &str = "training.kubeflow.org/job-name";

fn node_name(i: usize) -> String {
    format!("gpu-{i:02}")
}

/// The DGX H100 fixture with thresholds low enough that a rail at 85% still certifies.
fn lenient_profile() -> Result<FabricProfile> {
    let mut p = fixture_profile("dgx-h100-ndr.yaml")?;
    p.metadata.name = Some("h100-fleet".into());
    p.spec.thresholds.write_bw_host_gbps = 300.0;
    p.spec.thresholds.write_bw_gpu_gbps = Some(290.0);
    // The nodes are certified by the prober over simulated hardware.
    p.spec.certification.accept_simulated = true;
    Ok(p)
}

/// The node's `RailguardFleetOutlier` condition: status, reason, message.
async fn fleet_condition(
    nodes: &Api<Node>,
    name: &str,
) -> Result<Option<(String, String, String)>> {
    let n = nodes.get(name).await?;
    Ok(n.status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == keys::CONDITION_FLEET_OUTLIER)
        .map(|c| {
            (
                c.status,
                c.reason.unwrap_or_default(),
                c.message.unwrap_or_default(),
            )
        }))
}

/// A worker of a multi-node job as the webhook leaves it.
fn job_pod(profile: &FabricProfile) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "llama-worker-0", "namespace": "default", "uid": "e2e-fleet-0",
            "labels": {JOB: "llama"},
            "annotations": {
                "railguard.io/profile": profile.name(),
                "railguard.io/signature": profile.spec.signature(),
            }},
        "spec": {"containers": [{
            "name": "trainer", "image": "registry.invalid/trainer:1",
            "resources": {"limits": {"nvidia.com/gpu": "8", RDMA: "1"}},
        }]},
    })
}

/// The fleet controller, as the chart runs it (flags from its env) with short intervals,
/// once ready: the daemon and its metrics URL.
async fn ready_fleet_controller(
    bin: &std::path::Path,
    cp: &ControlPlane,
    logs: &std::path::Path,
) -> (Daemon, String) {
    let mut controller = Daemon::spawn(
        "railguard-fleet",
        Command::new(bin.join("railguard-prober"))
            .arg("fleet")
            .env("RAILGUARD_FLEET_WATCH", "true")
            .env("RAILGUARD_KUBECONFIG", cp.kubeconfig_path())
            .env("RAILGUARD_FLEET_INTERVAL_SECS", "3")
            .env("RAILGUARD_FLEET_SETTLE_SECS", "1")
            .env("RAILGUARD_METRICS_LISTEN", ANY_LOOPBACK_PORT)
            .env("RAILGUARD_LOG", "info"),
        logs,
    );
    let metrics_url = format!(
        "http://{}",
        controller.listen_addr("--metrics-listen").await
    );
    wait_ready(
        &format!("{metrics_url}/readyz"),
        "fleet controller",
        &mut controller,
        logs,
    )
    .await;
    (controller, metrics_url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleet_controller_marks_a_slow_rail_that_passes_its_thresholds() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bin = prober_bin_dir()?;
    let extender_bin =
        railguard_tests::workspace_binary("railguard-extender-cli", "railguard-extender")?;
    let mut cp = ControlPlane::start().await?;
    cp.apply_fabricprofile_crd().await?;
    let client = cp.client();
    let logs = cp.log_dir().to_path_buf();
    let work = tempfile::tempdir()?;
    let profile = lenient_profile()?;
    let profile_file = work.path().join("profile.yaml");
    std::fs::write(&profile_file, serde_yaml_ng::to_string(&profile)?)?;
    let profiles: Api<FabricProfile> = Api::all(client.clone());
    profiles.create(&PostParams::default(), &profile).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let prober = Prober {
        bin: bin.clone(),
        kubeconfig: cp.kubeconfig_path(),
        work: work.path(),
        profile_file: profile_file.clone(),
    };
    let names: Vec<String> = (0..NODES).map(node_name).collect();
    for n in &names {
        cp.create_node(
            n,
            &labels(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]),
            &[(RDMA, "1k"), ("nvidia.com/gpu", "8")],
        )
        .await?;
    }
    // Certify in waves of five (each run is a real prober with its child processes).
    for wave in names.chunks(5) {
        let runs = wave.iter().map(|n| {
            let model = if n == SLOW {
                "h100-slow-rail"
            } else {
                "dgx-h100"
            };
            prober.certify(n, model)
        });
        for (n, r) in wave.iter().zip(futures::future::join_all(runs).await) {
            let (code, matrix) = r?;
            assert_eq!(
                code, 0,
                "{n} must certify (the slow rail is above 300 Gb/s):\n{matrix}"
            );
        }
    }

    // The controller, as the chart runs it (flags from its env), with short intervals.
    let (mut controller, metrics_url) = ready_fleet_controller(&bin, &cp, &logs).await;

    // The condition names the rail, its value and the baseline.
    let (status, reason, message) =
        eventually(Duration::from_secs(60), "the slow node is marked", || {
            let nodes = nodes.clone();
            async move {
                Ok(fleet_condition(&nodes, SLOW)
                    .await?
                    .filter(|(s, _, _)| s == "True"))
            }
        })
        .await?;
    assert_eq!(reason, "FleetOutlier");
    // Host and GPU-memory bandwidth of the rail, each about 15% below (the simulated sweep
    // measures a little under the model's figure, so the fleet median is near 380 Gb/s).
    for kind in ["writeBwHost", "writeBwGpu"] {
        let mark = format!("rail {SLOW_RAIL} {kind} ");
        let at = message
            .find(&mark)
            .with_context(|| format!("{mark} in {message}"))?;
        let words: Vec<&str> = message[at + mark.len()..].split_whitespace().collect();
        // `<value> Gb/s is <p>% below the fleet median <median> Gb/s`
        let below: f64 = words[3].trim_end_matches('%').parse()?;
        assert!(
            (14.0..=16.0).contains(&below) && words[4] == "below",
            "{message}"
        );
    }
    assert!(
        message.ends_with("(profile h100-fleet, 10 certified nodes)"),
        "{message}"
    );
    assert_eq!(status, "True");
    for n in names.iter().filter(|n| *n != SLOW) {
        let c = eventually(Duration::from_secs(30), "healthy nodes get False", || {
            let nodes = nodes.clone();
            let n = n.clone();
            async move { fleet_condition(&nodes, &n).await }
        })
        .await?;
        assert_eq!(
            (c.0.as_str(), c.1.as_str()),
            ("False", "WithinFleetBaseline"),
            "{n}: {c:?}"
        );
    }

    // One Warning Event on the slow node with the same words; none on the others.
    let events = events_about(&client, SLOW).await?;
    let marks: Vec<_> = events.iter().filter(|e| e.1 == "FleetOutlier").collect();
    assert_eq!(marks.len(), 1, "{events:?}");
    assert_eq!(marks[0].0, "Warning");
    assert_eq!(marks[0].2, message);
    for n in names.iter().filter(|n| *n != SLOW) {
        let e = events_about(&client, n).await?;
        assert!(e.iter().all(|e| !e.1.starts_with("Fleet")), "{n}: {e:?}");
    }

    // The profile's status carries the baseline and names the outlier.
    let fleet = profiles
        .get_status("h100-fleet")
        .await?
        .status
        .and_then(|s| s.fleet)
        .context("status.fleet is written")?;
    assert_eq!((fleet.nodes, fleet.outliers), (10, 1), "{fleet:?}");
    assert_eq!(fleet.outlier_nodes, vec![SLOW.to_string()]);
    let rail = fleet
        .baseline
        .iter()
        .find(|b| b.measurement == format!("writeBwHost/{SLOW_RAIL}"))
        .context("the slow rail has a baseline")?;
    assert!(
        (360.0..=390.0).contains(&rail.median) && rail.nodes == 10,
        "{rail:?}"
    );
    assert_eq!(fleet.history.len(), 1);
    assert!(fleet.drift.is_empty(), "{:?}", fleet.drift);
    // Every certified node has all 8 rails healthy (a slow rail is still healthy): what
    // `nccl.consistentRails` answers on each of them.
    assert_eq!(fleet.consistent_rail_count, Some(8), "{fleet:?}");

    // Metrics: the outlier count and the slow rail at 85% of the median.
    let scraped = scrape_metrics(&metrics_url).await?;
    assert!(
        scraped.contains("railguard_fleet_outliers{profile=\"h100-fleet\"} 1"),
        "{scraped}"
    );
    let relative = scraped
        .lines()
        .find(|l| {
            l.starts_with("railguard_fleet_node_rail_relative{")
                && l.contains(&format!("node=\"{SLOW}\""))
                && l.contains(&format!("rail=\"{SLOW_RAIL}\""))
        })
        .context("the slow rail's relative bandwidth is exported")?;
    let value: f64 = relative.rsplit(' ').next().unwrap_or_default().parse()?;
    assert!((0.84..=0.86).contains(&value), "{relative}");

    // The extender (as deployed: TLS, the scheduler's client certificate) scores the outlier
    // last for a multi-node job.
    let tls = ServingCertificate::loopback("railguard-fleet-e2e-ca")?;
    let (mut extender, extender_url, _) =
        spawn_extender(&extender_bin, cp.kubeconfig_path(), &tls, &logs, &[]).await?;
    let https = tls.scheduler_https_client()?;
    let args = json!({"Pod": job_pod(&profile), "Nodes": null, "NodeNames": names});
    let scores = eventually(
        Duration::from_secs(30),
        "the extender scores the outlier last",
        || {
            let (https, url, args) = (https.clone(), extender_url.clone(), args.clone());
            async move {
                let list: Vec<Value> = https
                    .post(format!("{url}/prioritize"))
                    .json(&args)
                    .send()
                    .await?
                    .json()
                    .await?;
                // Hosts left out score 0.
                let score = |n: &str| {
                    list.iter()
                        .find(|h| h["Host"] == n)
                        .and_then(|h| h["Score"].as_i64())
                        .unwrap_or(0)
                };
                let slow = score(SLOW);
                let others: Vec<i64> = (0..NODES)
                    .map(node_name)
                    .filter(|n| n != SLOW)
                    .map(|n| score(&n))
                    .collect();
                Ok(others.iter().all(|s| *s > slow).then_some((slow, others)))
            }
        },
    )
    .await?;
    assert_eq!(scores.0, 0, "{scores:?}");

    // A profile that filters outliers: the extender rejects the node with the mark's words.
    profiles
        .patch(
            "h100-fleet",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"fleet": {"outliers": "Filter"}}})),
        )
        .await?;
    let reason = eventually(
        Duration::from_secs(30),
        "the extender filters the outlier",
        || {
            let (https, url, args) = (https.clone(), extender_url.clone(), args.clone());
            async move {
                let answer: Value = https
                    .post(format!("{url}/filter"))
                    .json(&args)
                    .send()
                    .await?
                    .json()
                    .await?;
                let passing: Vec<&str> = answer["NodeNames"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let failed = answer["FailedAndUnresolvableNodes"][SLOW]
                    .as_str()
                    .or(answer["FailedNodes"][SLOW].as_str())
                    .map(str::to_string);
                Ok(failed.filter(|_| passing.len() == NODES - 1 && !passing.contains(&SLOW)))
            }
        },
    )
    .await?;
    assert!(
        reason.contains("fleet outlier") && reason.contains("mlx5_4:1"),
        "{reason}"
    );
    extender.assert_running(&logs);

    // The report names it, and its HTML holds one cell per node × rail, only that one marked.
    let html = work.path().join("fleet.html");
    let out = Command::new(bin.join("railguard-prober"))
        .args(["fleet", "--profile", "h100-fleet", "--kubeconfig"])
        .arg(cp.kubeconfig_path())
        .arg("--html")
        .arg(&html)
        .output()?;
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "an outlier exits 1:\n{table}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.starts_with("profile h100-fleet: 10 certified node(s), 1 outlier(s)\n"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with(SLOW))
        .context("the slow node's row")?;
    assert!(row.contains("yes") && row.contains(" 85."), "{row}");
    assert!(table.contains("rail mlx5_4:1 writeBwHost "), "{table}");
    let dom = chromium::dump_dom(&html)?;
    let cells: Vec<&str> = dom
        .match_indices("class=\"cell\"")
        .map(|(i, _)| &dom[i..])
        .collect();
    assert_eq!(cells.len(), NODES * 8, "one cell per node × rail");
    let marked: Vec<&str> = cells
        .iter()
        .map(|c| &c[..c.find('>').unwrap_or(c.len())])
        .filter(|tag| tag.contains("data-outlier=\"true\""))
        .collect();
    assert_eq!(marked.len(), 1, "{marked:?}");
    assert!(
        marked[0].contains(&format!("data-node=\"{SLOW}\""))
            && marked[0].contains(&format!("data-rail=\"{SLOW_RAIL}\"")),
        "{}",
        marked[0]
    );

    // Recertified healthy (the cable replaced), the node is cleared.
    let (code, matrix) = prober.certify(SLOW, "dgx-h100").await?;
    assert_eq!(code, 0, "{matrix}");
    let cleared = eventually(Duration::from_secs(60), "the mark is cleared", || {
        let nodes = nodes.clone();
        async move {
            Ok(fleet_condition(&nodes, SLOW)
                .await?
                .filter(|(s, _, _)| s == "False"))
        }
    })
    .await?;
    assert_eq!(cleared.1, "WithinFleetBaseline");
    let events = events_about(&client, SLOW).await?;
    assert!(
        events
            .iter()
            .any(|e| e.0 == "Normal" && e.1 == "FleetOutlierCleared"),
        "{events:?}"
    );

    // A drop the whole fleet shares is not held against a node: with the profile reporting
    // drift on the rail, a node that now measures 15% below its own history stays certified
    // (without the drift its own-history check degrades it).
    profiles
        .patch_status(
            "h100-fleet",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"fleet": {"drift": [{
                "measurement": format!("writeBwHost/{SLOW_RAIL}"),
                "reference": 378.6, "current": 322.5, "worsePercent": 14.8,
            }]}}})),
        )
        .await?;
    let (code, matrix) = prober.certify("gpu-03", "h100-slow-rail").await?;
    assert_eq!(code, 0, "the fleet's drift is not this node's:\n{matrix}");
    let cert =
        railguard_api::NodeFabric::from_node(&nodes.get("gpu-03").await?, jiff::Timestamp::now());
    let reasons = cert
        .state
        .certificate()
        .context("gpu-03 has a certificate")?
        .reasons
        .join("\n");
    assert!(
        reasons.contains("history median")
            && reasons.contains("(fleet drift), so it is not held against this node"),
        "{reasons}"
    );
    controller.assert_running(&logs);
    cp.check_alive()?;
    Ok(())
}

/// The railguard taint on a Node: its value, if it carries one.
async fn railguard_taint(nodes: &Api<Node>, name: &str) -> Result<Option<String>> {
    let n = nodes.get(name).await?;
    Ok(n.spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .find(|t| t.key == keys::TAINT_FABRIC_UNHEALTHY)
        .map(|t| format!("{}:{}", t.value.unwrap_or_default(), t.effect)))
}

/// A training pod as a user writes it for the default scheduler: 8 GPUs, no railguard
/// affinity, no toleration, not seen by the webhook.
const TRAINING: &str = "training";

fn plain_training_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TRAINING},
        "spec": {"containers": [{
            "name": "trainer", "image": "registry.invalid/trainer:1",
            "resources": {"limits": {"nvidia.com/gpu": "8"}},
        }]},
    })
}

/// Expiry and health as taints (issue #29): with `certification.taints`, the real fleet
/// controller keeps `railguard.io/fabric-unhealthy:NoSchedule` on the failed, degraded and
/// expired nodes (flipping the expired one's label to `pending`), and the real default
/// kube-scheduler, with no extender and no railguard affinity, keeps a plain 8-GPU pod off
/// them; a passing certificate lifts the taint and the waiting pod lands there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhealthy_nodes_are_tainted_and_the_default_scheduler_keeps_pods_off_them() -> Result<()> {
    use railguard_api::{Certificate, Verdict};
    let bin = prober_bin_dir()?;
    let mut cp = ControlPlane::start().await?;
    cp.apply_fabricprofile_crd().await?;
    let client = cp.client();
    let logs = cp.log_dir().to_path_buf();
    let mut profile = fixture_profile("dgx-h100-ndr.yaml")?;
    profile.metadata.name = Some("h100-taints".into());
    profile.spec.certification.taints = true;
    Api::<FabricProfile>::all(client.clone())
        .create(&PostParams::default(), &profile)
        .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let now = jiff::Timestamp::now();
    let cert = |node: &str, verdict: Verdict, expires_in_hours: i64| -> Certificate {
        let mut c = railguard_sim::certificates::certificate(&profile, verdict, now, 384.0, 0.0);
        c.expires_at = now + jiff::SignedDuration::from_hours(expires_in_hours);
        c.node = Some(node.to_string());
        if verdict != Verdict::Certified {
            c.reasons = vec![format!("rail mlx5_3:1 is {verdict} (test)")];
        }
        c
    };
    let states = [
        ("gpu-ok", cert("gpu-ok", Verdict::Certified, 6)),
        ("gpu-failed", cert("gpu-failed", Verdict::Failed, 6)),
        ("gpu-degraded", cert("gpu-degraded", Verdict::Degraded, 6)),
        ("gpu-expired", {
            let mut c = cert("gpu-expired", Verdict::Certified, -1);
            c.issued_at = now - jiff::SignedDuration::from_hours(25);
            c
        }),
    ];
    for (name, c) in &states {
        cp.create_node(name, &labels(&[]), &[("nvidia.com/gpu", "8")])
            .await?;
        cp.publish_certificate(name, c).await?;
    }

    let (mut controller, metrics_url) = ready_fleet_controller(&bin, &cp, &logs).await;

    for (name, want) in [
        ("gpu-failed", "failed:NoSchedule"),
        ("gpu-degraded", "degraded:NoSchedule"),
        ("gpu-expired", "expired:NoSchedule"),
    ] {
        eventually(
            Duration::from_secs(60),
            &format!("{name} tainted {want}"),
            || {
                let nodes = nodes.clone();
                async move {
                    let seen = railguard_taint(&nodes, name).await?;
                    Ok(match seen.as_deref() {
                        Some(s) if s == want => Ok(()),
                        other => Err(railguard_tests::NotYet(format!("{other:?}"))),
                    })
                }
            },
        )
        .await?;
    }
    assert_eq!(railguard_taint(&nodes, "gpu-ok").await?, None);
    // The expired node's label no longer says certified (selectors on it stop matching);
    // its certificate is left as the prober wrote it.
    let expired = nodes.get("gpu-expired").await?;
    let label = |n: &Node, k: &str| n.metadata.labels.as_ref().and_then(|l| l.get(k)).cloned();
    assert_eq!(
        label(&expired, keys::LABEL_FABRIC).as_deref(),
        Some("pending")
    );
    let on_node = Certificate::from_annotation(
        &expired.metadata.annotations.clone().unwrap_or_default()[keys::ANNOTATION_CERTIFICATE],
    )?;
    assert_eq!(on_node, states[3].1);
    // Each Event follows its Node patch (`write_upkeep`), so it may land a moment after the
    // taint is seen.
    for reason in ["CertificationExpired", "FabricUnhealthyTainted"] {
        eventually(Duration::from_secs(30), reason, || async {
            let events = events_about(&client, "gpu-expired").await?;
            Ok(match events.iter().any(|(_, r, _)| r == reason) {
                true => Ok(()),
                false => Err(railguard_tests::NotYet(format!("{reason} in {events:?}"))),
            })
        })
        .await?;
    }
    let scraped = scrape_metrics(&metrics_url).await?;
    for reason in ["failed", "degraded", "expired"] {
        let series = format!(
            "railguard_fleet_tainted_nodes{{profile=\"h100-taints\",reason=\"{reason}\"}} 1"
        );
        assert!(scraped.contains(&series), "{series} in:\n{scraped}");
    }

    // The default scheduler alone: the first pod goes to the one healthy node, the second
    // waits, refused for the taint.
    cp.create_namespace(TRAINING, &labels(&[])).await?;
    cp.start_scheduler("[]").await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), TRAINING);
    for name in ["train-a", "train-b"] {
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(plain_training_pod(name))?,
        )
        .await?;
    }
    let (placed, node) = eventually(Duration::from_secs(60), "a pod bound", || {
        let client = client.clone();
        async move {
            for name in ["train-a", "train-b"] {
                if let Some(node) = railguard_tests::pod_node(&client, TRAINING, name).await {
                    return Ok(Some((name, node)));
                }
            }
            Ok(None)
        }
    })
    .await?;
    assert_eq!(node, "gpu-ok", "only the healthy node takes a pod");
    let waiting = if placed == "train-a" {
        "train-b"
    } else {
        "train-a"
    };
    eventually(
        Duration::from_secs(30),
        "the waiting pod's FailedScheduling event",
        || {
            let client = client.clone();
            async move {
                let m =
                    railguard_tests::failed_scheduling_messages(&client, TRAINING, waiting).await?;
                // 1.20 names the taint ("had taint {railguard.io/fabric-unhealthy: failed},
                // that the pod didn't tolerate"), 1.37 only counts ("had untolerated
                // taint(s)"): the three tainted nodes either way.
                let ours = |m: &&String| {
                    m.contains("3 node(s) had untolerated taint")
                        || (m.contains(keys::TAINT_FABRIC_UNHEALTHY)
                            && m.contains("didn't tolerate"))
                };
                Ok(match m.iter().find(ours) {
                    Some(m) => Ok(m.clone()),
                    None => Err(railguard_tests::NotYet(format!("{m:?}"))),
                })
            }
        },
    )
    .await?;
    assert_eq!(
        railguard_tests::pod_node(&client, TRAINING, waiting).await,
        None
    );

    // The failed node recertifies: the taint goes, the waiting pod lands there.
    cp.publish_certificate("gpu-failed", &cert("gpu-failed", Verdict::Certified, 6))
        .await?;
    let landed = railguard_tests::wait_bound(&client, TRAINING, waiting).await?;
    assert_eq!(landed, "gpu-failed");
    assert_eq!(railguard_taint(&nodes, "gpu-failed").await?, None);
    // The controller records the Event after its Node patch lands (`write_upkeep`): the
    // taint can be gone a moment before the Event is (a cold CI run caught that moment).
    eventually(
        Duration::from_secs(30),
        "the FabricUnhealthyCleared event",
        || async {
            let events = events_about(&client, "gpu-failed").await?;
            Ok(
                match events.iter().any(|(_, r, _)| r == "FabricUnhealthyCleared") {
                    true => Ok(()),
                    false => Err(railguard_tests::NotYet(format!("{events:?}"))),
                },
            )
        },
    )
    .await?;
    controller.assert_running(&logs);
    Ok(())
}
