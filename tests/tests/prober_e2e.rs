//! End-to-end: the real `railguard-prober` binary on simulated nodes (synthetic sysfs, the
//! simulated RDMA engine, the `all_reduce_perf_sim` child process) publishing certificates to
//! a real kube-apiserver 1.20; what the extender reads (`NodeFabric::from_node`) follows.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use railguard_api::{keys, profiles_from_yaml, Certificate, FabricState, NodeFabric};
use railguard_tests::ports::logged_listen_addr;
use railguard_tests::sim_prober::{h100_profile_file, prober_bin_dir, terminate, Prober};
use railguard_tests::{events_about, eventually, labels, workspace_root, ControlPlane};

const RDMA: &str = "rdma/rdma_shared_device_a";

async fn fabric(nodes: &Api<Node>, name: &str) -> Result<NodeFabric> {
    let n = nodes.get(name).await?;
    Ok(NodeFabric::from_node(&n, jiff::Timestamp::now()))
}

fn certificate(f: &NodeFabric) -> &Certificate {
    f.state.certificate().expect("node has a certificate")
}

async fn events_for(client: &kube::Client, node: &str) -> Result<Vec<(String, String)>> {
    Ok(events_about(client, node)
        .await?
        .into_iter()
        .map(|(_, reason, message)| (reason, message))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simulated_nodes_certify_fail_on_faults_and_flip_on_passive_counters() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bin = prober_bin_dir()?;
    let cp = ControlPlane::start().await?;
    let client = cp.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let work = tempfile::tempdir()?;
    let prober = Prober {
        bin,
        kubeconfig: cp.kubeconfig_path(),
        work: work.path(),
        profile_file: h100_profile_file(),
    };
    let profile = profiles_from_yaml(&std::fs::read_to_string(h100_profile_file())?)?.remove(0);
    let names = ["gpu-a", "gpu-b", "gpu-c"];
    for n in names {
        cp.create_node(
            n,
            &labels(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")]),
            &[(RDMA, "1k"), ("nvidia.com/gpu", "8")],
        )
        .await?;
    }

    // 1. Several probers certify and publish concurrently.
    let (a, b, c) = tokio::join!(
        prober.certify("gpu-a", "dgx-h100"),
        prober.certify("gpu-b", "dgx-h100"),
        prober.certify("gpu-c", "dgx-h100"),
    );
    for (n, r) in names.iter().zip([a, b, c]) {
        let (code, matrix) = r?;
        assert_eq!(code, 0, "{n} not certified:\n{matrix}");
        assert!(matrix.contains("nccl/main"), "{matrix}");
        assert!(matrix.contains("verdict: certified"), "{matrix}");
    }
    for n in names {
        let f = fabric(&nodes, n).await?;
        assert!(
            matches!(f.state, FabricState::Certified(_)),
            "{n}: {}",
            f.state
        );
        let c = certificate(&f);
        assert_eq!(c.profile, "h100-ndr");
        assert_eq!(c.signature, profile.spec.signature());
        assert_eq!(f.signature.as_deref(), Some(c.signature.as_str()));
        assert_eq!(c.rails.len(), 8);
        assert!(c.rails.iter().all(|r| r.write_bw_host_gbps.is_some()));
        let nccl = c.nccl.as_ref().expect("nccl result");
        // The loopback of the default profile: one rank per GPU, every byte through a NIC.
        assert!(nccl.busbw_plateau_gbps.unwrap() >= profile.spec.thresholds.busbw_plateau_gbps);
        assert_eq!(nccl.ranks, Some(8));
        assert!(c.simulated, "made with --sim: the certificate says so");
        assert_eq!(
            f.labels.get(keys::LABEL_SIMULATED).map(String::as_str),
            Some("true"),
            "the label a node affinity sees goes with it"
        );
        // The shipped profile counts no simulated certificate; the tests' profiles do.
        assert!(!profile.spec.certification.accept_simulated);
        let refused = railguard_extender::decision::check_node(
            &f,
            &profile,
            &profile.spec.signature(),
            jiff::Timestamp::now(),
        )
        .expect_err("a simulated certificate must not place pods for the shipped profile");
        assert_eq!(
            refused.reason,
            railguard_extender::RejectReason::Simulated,
            "{}",
            refused.message
        );
        let mut accepting = profile.clone();
        accepting.spec.certification.accept_simulated = true;
        railguard_extender::decision::check_node(
            &f,
            &accepting,
            &profile.spec.signature(),
            jiff::Timestamp::now(),
        )
        .map_err(|r| anyhow::anyhow!("{}", r.message))?;
        assert_eq!(nccl.gdr, Some(true));
        assert_eq!(
            c.software.get("driver").map(String::as_str),
            Some("550.54.15")
        );
        // The default runner, native: the NCCL library that ran and the version it answered.
        assert!(c.software.contains_key("libnccl"), "{:?}", c.software);
        assert_eq!(c.software.get("nccl").map(String::as_str), Some("2.21.5"));
        let node = nodes.get(n).await?;
        let cond = node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == keys::CONDITION_FABRIC_READY)
            .expect("condition");
        assert_eq!(cond.status, "True");
        assert_eq!(cond.reason.as_deref(), Some("Certified"));
        // the prober owns its fields through one field manager
        let managers: Vec<String> = node
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.manager)
            .collect();
        assert!(
            managers.iter().any(|m| m == keys::PROBER_FIELD_MANAGER),
            "{managers:?}"
        );
        assert!(events_for(&client, n)
            .await?
            .iter()
            .any(|(r, _)| r == "Certified"));
    }

    // 2. A fault injected before the next run: gpu-b's NCCL falls back to sockets.
    let fault = work.path().join("gpu-b-socket.yaml");
    std::fs::write(
        &fault,
        format!(
            "base: {}\nname: gpu-b-socket\nnccl: {{ transport: Socket }}\n",
            workspace_root()
                .join("prober/models/dgx-h100.yaml")
                .display()
        ),
    )?;
    let (code, matrix) = prober
        .certify("gpu-b", fault.to_str().unwrap_or_default())
        .await?;
    assert_eq!(code, 1, "{matrix}");
    let f = fabric(&nodes, "gpu-b").await?;
    // Failed, not degraded: the loopback fell back to sockets, a node-wide fault no failed
    // rail explains.
    let FabricState::Failed(c) = &f.state else {
        bail!("gpu-b should be failed, is {}", f.state);
    };
    assert!(
        c.reasons
            .iter()
            .any(|r| r == "NCCL fell back to NET/Socket, expected NET/IB: the run did not use RDMA"),
        "{:?}",
        c.reasons
    );
    assert_eq!(c.generation, 2);
    assert_eq!(c.history.len(), 2, "the pass and the failure");
    assert!(events_for(&client, "gpu-b")
        .await?
        .iter()
        .any(|(r, m)| r == "CertificationFailed" && m.contains("NET/Socket")));
    // the other nodes are untouched
    assert!(matches!(
        fabric(&nodes, "gpu-a").await?.state,
        FabricState::Certified(_)
    ));

    // A link that trained down (mlx5_4 at 200 Gb/s) is judged as that rail, not as a node
    // of another layout: the certificate keeps the profile's signature, names the rail, and
    // so does the extender's one-line reason for the node.
    let (code, matrix) = prober.certify("gpu-b", "h100-rate-downshift").await?;
    assert_eq!(code, 1, "{matrix}");
    let f = fabric(&nodes, "gpu-b").await?;
    // That rail failed; the other seven pass: the node is degraded, one rail short.
    let FabricState::Degraded(c) = &f.state else {
        bail!("gpu-b should be degraded, is {}", f.state);
    };
    assert_eq!(c.usable_rails, Some(c.rails.len() as u32 - 1));
    assert_eq!(c.signature, profile.spec.signature());
    assert_eq!(f.signature.as_deref(), Some(c.signature.as_str()));
    assert!(
        c.reasons
            .iter()
            .any(|r| r.contains("mlx5_4:1") && r.contains("link rate 200 Gb/s, expected 400 Gb/s")),
        "{:?}",
        c.reasons
    );
    assert!(
        !c.reasons.iter().any(|r| r.contains("signature")),
        "{:?}",
        c.reasons
    );
    let rejection = railguard_extender::decision::check_node(
        &f,
        &profile,
        &profile.spec.signature(),
        jiff::Timestamp::now(),
    )
    .err()
    .context("a degraded node must be rejected on the extender path")?;
    assert!(
        rejection.message.contains("mlx5_4:1"),
        "{}",
        rejection.message
    );

    // 3. The daemon on gpu-c: its certificate from step 1 is valid, so it does not retest at
    //    start; the operator asks for a run (railguard.io/recertify), which certifies, then
    //    counters grow on one rail and a passive check fails the node without another
    //    invasive run.
    nodes
        .patch(
            "gpu-c",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                keys::ANNOTATION_RECERTIFY: "e2e"}}})),
        )
        .await?;
    let daemon_log = prober.work.join("daemon-gpu-c.log");
    let mut daemon = prober
        .passive_daemon("gpu-c", "dgx-h100")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&daemon_log)?)
        .spawn()
        .context("starting the daemon")?;
    let metrics_port = logged_listen_addr(
        &mut daemon,
        &daemon_log,
        "--metrics-listen",
        Duration::from_secs(60),
    )
    .await?
    .port();
    let certified = eventually(
        Duration::from_secs(60),
        "gpu-c recertified by the daemon",
        || async {
            let f = fabric(&nodes, "gpu-c").await?;
            Ok(match &f.state {
                FabricState::Certified(c) if c.history.len() == 2 => Some(c.generation),
                _ => None,
            })
        },
    )
    .await?;
    // The run came from the request, not from the start.
    let log = std::fs::read_to_string(&daemon_log)?;
    assert!(
        log.contains("no invasive run at start"),
        "the daemon retested a node with a valid certificate at start:\n{log}"
    );
    // The run's lines carry its span, so an operator can follow one node's certification.
    assert!(
        log.contains("certification{node=gpu-c profile=") && log.contains("run=\"invasive\""),
        "the invasive run's lines are in its certification span:\n{log}"
    );
    let counter = work
        .path()
        .join("sysfs-gpu-c/sys/class/infiniband/mlx5_4/ports/1/counters/symbol_error");
    // One rail of eight failing passively leaves the node degraded on the other seven.
    let failed = eventually(
        Duration::from_secs(60),
        "passive rail failure on gpu-c",
        || {
            let counter = counter.clone();
            let nodes = nodes.clone();
            async move {
                // Link errors keep coming while the cable is bad.
                let now: u64 = std::fs::read_to_string(&counter)?.trim().parse()?;
                std::fs::write(&counter, format!("{}\n", now + 3))?;
                let f = fabric(&nodes, "gpu-c").await?;
                Ok(match f.state {
                    FabricState::Degraded(c) => Some(c),
                    _ => None,
                })
            }
        },
    )
    .await?;
    assert!(
        failed
            .reasons
            .iter()
            .any(|r| r.starts_with("rail mlx5_4:1: error counter symbol_error grew by")),
        "{:?}",
        failed.reasons
    );
    assert!(failed.generation > certified);
    assert_eq!(failed.history.len(), 2, "no invasive run happened");
    assert_eq!(failed.usable_rails, Some(failed.rails.len() as u32 - 1));
    let rail = failed.rail("mlx5_4", 1).expect("rail");
    assert!(
        rail.counter_deltas
            .get("symbol_error")
            .copied()
            .unwrap_or(0)
            > 0
    );
    // The Event is posted after the Node patch the loop above saw.
    eventually(
        Duration::from_secs(30),
        "Regressed event for gpu-c",
        || async {
            let events = events_for(&client, "gpu-c").await?;
            Ok(events
                .iter()
                .any(|(r, m)| r == "Regressed" && m.contains("symbol_error"))
                .then_some(()))
        },
    )
    .await?;

    // metrics and health on the plain port
    let metrics = http_get(metrics_port, "/metrics").await?;
    assert!(
        metrics.contains("railguard_prober_verdict{verdict=\"degraded\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "railguard_prober_rail_counter_delta{rail=\"mlx5_4:1\",counter=\"symbol_error\"}"
        ),
        "{metrics}"
    );
    // What the RailguardCertificateExpiringSoon alert reads: the certificate's expiresAt.
    assert!(
        metrics.contains(&format!(
            "railguard_prober_certificate_expires_at_seconds {}",
            failed.expires_at.as_second()
        )),
        "{metrics}"
    );
    assert!(http_get(metrics_port, "/healthz").await?.ends_with("ok"));

    // graceful shutdown on SIGTERM
    let status = terminate(&mut daemon, Duration::from_secs(20)).await?;
    assert!(status.success(), "daemon exit: {status}");
    Ok(())
}

async fn http_get(port: u16, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    Ok(buf)
}
