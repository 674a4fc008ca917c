//! Campaigns over real TCP: `railguard-prober peer-endpoint` processes on loopback addresses
//! (127.0.0.x), each a simulated node with the simulated RDMA engine, driven by the
//! coordinator's library entry point. The Kubernetes side is in tests/tests/campaign_e2e.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/endpoints.rs"]
mod endpoints;

use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use endpoints::*;
use railguard_campaign::coordinator::{run_campaign, CampaignNode, CampaignReport};
use railguard_campaign::endpoint::request;
use railguard_campaign::wire::{ControlRequest, ControlResponse};
use railguard_prober::rdma::peer::{authenticate_initiator, Message, SideChannel};
use railguard_prober::rdma::{MemoryKind, PeerConfig, PeerRdmaEngine};

const T: Duration = Duration::from_secs(5);

async fn campaign(nodes: &[CampaignNode]) -> CampaignReport {
    run_campaign(nodes, &settings(), jiff::Timestamp::now())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn degraded_rail_bad_link_and_dead_node_are_localized() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..8).map(|i| format!("node-{i}")).collect();
    let mut addrs = Vec::new();
    let mut endpoints = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut s = spec(name);
        match i {
            // (a) mlx5_4 port 1 trained at 200 instead of 400.
            2 => s.model = "h100-rate-downshift.yaml",
            // (b) the path node-4 <-> node-5 on mlx5_0 is dead (one side's model says so).
            4 => s.extra = vec!["--sim-link".into(), "node-5=dead@mlx5_0".into()],
            _ => {}
        }
        let e = start(dir.path(), &s, &listen_on(i as u8));
        addrs.push(e.addr.clone());
        endpoints.push(Some(e));
    }
    // (c) node-7 dies before the campaign.
    endpoints[7] = None;
    let nodes = campaign_nodes(&names, &addrs);
    let report = campaign(&nodes).await;

    let mut blamed = report.blamed_nodes();
    blamed.sort();
    assert_eq!(blamed, vec!["node-2", "node-7"], "{:#?}", report.findings);
    let n2 = &report.findings["node-2"];
    assert_eq!(n2.blamed_rails.keys().collect::<Vec<_>>(), vec!["mlx5_4:1"]);
    let reason = &n2.blamed_rails["mlx5_4:1"].reason;
    assert!(
        reason.contains("degraded with 2 healthy peers")
            && reason.contains("node-1")
            && reason.contains("node-3"),
        "{reason}"
    );
    assert!(n2.node_fault.is_none());
    assert!(report.findings["node-7"]
        .node_fault
        .as_deref()
        .unwrap_or_default()
        .contains("every rail"));
    for n in ["node-4", "node-5"] {
        let f = &report.findings[n];
        assert!(!f.blames_node());
        assert_eq!(f.links.len(), 1, "{n}: {:?}", f.links);
        assert!(
            f.links[0].contains("link node-4<->node-5 on mlx5_0:1")
                && f.links[0].contains("cable or switch port"),
            "{}",
            f.links[0]
        );
    }
    for n in ["node-0", "node-1", "node-3", "node-6"] {
        assert!(
            report.findings[n].links.is_empty() && !report.findings[n].blames_node(),
            "{n}"
        );
    }
    // Every node met at least two peers, and far fewer tests than all pairs.
    assert!(report.tests.len() <= 3 * 8, "{} tests", report.tests.len());
    // Healthy wire entries carry measured values.
    let w = &report.findings["node-0"].wire["mlx5_0:1"];
    assert!(
        w.iter()
            .any(|w| w.peer == "node-1" && w.ok && w.write_bw_gbps.unwrap_or(0.0) > 360.0),
        "{w:?}"
    );
}

/// A scripted side-channel peer: authenticates correctly, then misbehaves. It also answers
/// the coordinator's control connections by hanging up.
/// A rogue peer on `listen` (port 0); returns where it listens.
fn rogue(listen: &str, node: &'static str, behaviour: &'static str) -> String {
    let listener = TcpListener::bind(listen).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(s) = stream else { continue };
            thread::spawn(move || {
                let cfg = PeerConfig::new(node, "h100-ndr", TOKEN).unwrap();
                let Ok(mut s) = SideChannel::new(s, "i") else {
                    return;
                };
                if authenticate_initiator(&mut s, &cfg).is_err() {
                    return;
                }
                let _ = s.recv("test request", T);
                if behaviour == "wrong-hca" {
                    let model =
                        railguard_sim::NodeModel::load(&root().join("models/dgx-h100.yaml"))
                            .unwrap();
                    let engine = railguard_sim::node::engine(&model, node, &[], &[]).unwrap();
                    // Claims mlx5_99, a rail it does not have, whatever was asked.
                    let mut ep = engine
                        .open_endpoint("mlx5_0", 1, MemoryKind::Host, 8 << 20)
                        .unwrap();
                    let mut info = ep.info();
                    info.hca = "mlx5_99".into();
                    let _ = ep.connect(&info, railguard_prober::rdma::TrafficClass::default());
                    let _ = s.send(&Message::Accept { responder: info }, "accept", T);
                    let _ = s.recv("done", T);
                }
                // "disconnect": hang up in the middle of the test.
                let _ = s.stream().shutdown(std::net::Shutdown::Both);
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_peers_get_clear_errors_and_blame_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let names = [
        "node-0", "node-1", "node-2", "node-3", "node-4", "node-5", "node-6", "node-7",
    ];
    let mut addrs = Vec::new();
    let mut endpoints = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let listen = listen_on(20 + i as u8);
        let endpoint = match i {
            1 => start(
                dir.path(),
                &Spec {
                    profile: "other-profile",
                    ..spec(name)
                },
                &listen,
            ),
            3 => start(
                dir.path(),
                &Spec {
                    token: "a-wrong-token-of-enough-bytes",
                    ..spec(name)
                },
                &listen,
            ),
            5 => {
                addrs.push(rogue(&listen, "node-5", "disconnect"));
                continue;
            }
            7 => {
                addrs.push(rogue(&listen, "node-7", "wrong-hca"));
                continue;
            }
            _ => start(dir.path(), &spec(name), &listen),
        };
        addrs.push(endpoint.addr.clone());
        endpoints.push(endpoint);
    }
    let nodes = campaign_nodes(&names, &addrs);
    let report = campaign(&nodes).await;
    assert!(report.blamed_nodes().is_empty(), "{:#?}", report.findings);
    for f in report.findings.values() {
        assert!(
            f.links.iter().all(|l| l.contains("suspect")) || f.links.is_empty(),
            "{:?}",
            f.links
        );
    }
    // The healthy nodes were proven good with at least two peers.
    for n in ["node-0", "node-2", "node-4", "node-6"] {
        let peers: std::collections::BTreeSet<&str> = report.findings[n]
            .wire
            .values()
            .flatten()
            .filter(|w| w.ok)
            .map(|w| w.peer.as_str())
            .collect();
        assert!(peers.len() >= 2, "{n} passed with {peers:?}");
    }
    let errors: Vec<String> = report
        .tests
        .iter()
        .flat_map(|t| t.rails.iter().map(|r| format!("{:?}", r.report)))
        .collect();
    let all = errors.join("\n");
    assert!(
        all.contains("peer is on profile h100-ndr, this node on other-profile")
            || all.contains("this node is on profile other-profile"),
        "{all}"
    );
    assert!(all.contains("authentication"), "{all}");
    assert!(all.contains("closed the side channel"), "{all}");
    assert!(all.contains("peer answered for rail mlx5_99:1"), "{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_refuses_wrong_token_other_profile_and_self_tests() {
    let dir = tempfile::tempdir().unwrap();
    let e = start(dir.path(), &spec("node-a"), &listen_on(40));
    let a = e.addr.clone();
    let t = Duration::from_secs(5);
    // Status with the right token names the node and its devices.
    match request(
        &a,
        TOKEN.as_bytes(),
        &ControlRequest::Status,
        Some("node-a"),
        t,
        t,
    )
    .await
    .unwrap()
    {
        ControlResponse::Status {
            node,
            profile,
            devices,
            gpu_pods,
        } => {
            assert_eq!((node.as_str(), profile.as_str()), ("node-a", "h100-ndr"));
            assert!(devices.contains(&"mlx5_0".to_string()));
            assert!(gpu_pods.is_empty());
        }
        other => panic!("{other:?}"),
    }
    let e = request(
        &a,
        b"a-wrong-token-of-enough-bytes",
        &ControlRequest::Status,
        None,
        t,
        t,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("authentication with"), "{e}");
    let e = request(
        &a,
        TOKEN.as_bytes(),
        &ControlRequest::Status,
        Some("node-b"),
        t,
        t,
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("identifies as node node-a, expected node-b"),
        "{e}"
    );

    let mut s = settings();
    s.profile = "other".into();
    let run = |profile: &str, peer: &str| {
        ControlRequest::RunTest(railguard_campaign::wire::RunTestRequest {
            profile: profile.into(),
            peer_node: peer.into(),
            peer_addr: a.clone(),
            rails: s.rails.clone(),
            memory: MemoryKind::Host,
            sizes: vec![8, 4096],
            iterations: 2,
            class: Default::default(),
            allow_gpu_pods: false,
            timeout_ms: 5000,
            pair_key: None,
        })
    };
    match request(&a, TOKEN.as_bytes(), &run("other", "node-b"), None, t, t)
        .await
        .unwrap()
    {
        ControlResponse::Refused { reason } => assert!(
            reason.contains("this node is on profile h100-ndr, the campaign runs other"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    match request(&a, TOKEN.as_bytes(), &run("h100-ndr", "node-a"), None, t, t)
        .await
        .unwrap()
    {
        ControlResponse::Refused { reason } => {
            assert!(reason.contains("against itself"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // Garbage on the port is answered by closing, and the endpoint keeps serving.
    {
        use std::io::Write;
        let mut g = TcpStream::connect(&a).unwrap();
        g.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    }
    assert!(
        request(&a, TOKEN.as_bytes(), &ControlRequest::Status, None, t, t)
            .await
            .is_ok()
    );
}
