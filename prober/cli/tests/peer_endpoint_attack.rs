//! The peer endpoint under attack, loopback only, against the real `railguard-prober
//! peer-endpoint` binary: slow handshakes (one byte every second), connection floods beyond
//! the caps, and a frame altered on the control channel. Real pair tests keep passing while
//! the caps hold; a test starved by a saturated endpoint comes out inconclusive and blames
//! nobody.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/endpoints.rs"]
mod endpoints;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use endpoints::*;
use railguard_campaign::coordinator::run_campaign;
use railguard_campaign::endpoint::request;
use railguard_campaign::wire::{
    ControlRequest, ControlResponse, RailReport, RailTestReport, RunTestRequest,
};
use railguard_prober::rdma::MemoryKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const T: Duration = Duration::from_secs(5);

fn run_test(peer_node: &str, peer_addr: &str) -> ControlRequest {
    let s = settings();
    ControlRequest::RunTest(RunTestRequest {
        profile: s.profile.clone(),
        peer_node: peer_node.into(),
        peer_addr: peer_addr.into(),
        rails: s.rails.clone(),
        memory: MemoryKind::Host,
        sizes: vec![8, 4096, 1 << 20],
        iterations: 10,
        class: s.class,
        allow_gpu_pods: false,
        timeout_ms: 20_000,
        pair_key: None,
    })
}

/// Asks the endpoint at `addr` (node `node`) for a pair test with `peer` at `peer_addr`;
/// the result of each rail.
async fn pair_test(addr: &str, node: &str, peer: &str, peer_addr: &str) -> Vec<RailTestReport> {
    let answer = request(
        addr,
        TOKEN.as_bytes(),
        &run_test(peer, peer_addr),
        Some(node),
        T,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let ControlResponse::TestResult { rails, .. } = answer else {
        panic!("{answer:?}")
    };
    rails
}

/// Accepts one client on `listener` and connects it to `upstream`, whose answers go straight
/// back: the client's read half and the upstream write half, for the proxy to pass on.
async fn proxy_one(listener: TcpListener, upstream: String) -> (OwnedReadHalf, OwnedWriteHalf) {
    let (down, _) = listener.accept().await.unwrap();
    let up = TcpStream::connect(upstream).await.unwrap();
    let (down_r, mut down_w) = down.into_split();
    let (mut up_r, up_w) = up.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut up_r, &mut down_w).await;
    });
    (down_r, up_w)
}

/// A connection to `to` from the loopback address `from`.
async fn connect_from(from: &str, to: &str) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(format!("{from}:0").parse::<SocketAddr>().unwrap())?;
    socket.connect(to.parse().unwrap()).await
}

/// Whether the endpoint has closed `s` (a read sees the end, or the connection is reset).
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(limit, s.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// A slow client: opens a connection from `from` and sends the side channel's tag one byte
/// per second, then one more byte per second; returns how long the endpoint kept it open
/// (`None`: it never got in).
async fn slowloris(from: String, to: String, stop_after: Duration) -> Option<Duration> {
    let mut s = connect_from(&from, &to).await.ok()?;
    let started = Instant::now();
    let bytes = b"RGRP\x00\x02\x00\x00\x00\x10{";
    let mut i = 0;
    while started.elapsed() < stop_after {
        if s.write_all(&bytes[i % bytes.len()..][..1]).await.is_err() {
            return Some(started.elapsed());
        }
        i += 1;
        if closed_within(&mut s, Duration::from_secs(1)).await {
            return Some(started.elapsed());
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_handshakes_and_floods_neither_hold_threads_nor_starve_a_real_test() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(dir.path(), &spec("node-a"), &listen_on(70));
    let mut b_spec = spec("node-b");
    b_spec.extra = vec!["--peer-handshake-timeout-seconds".into(), "3".into()];
    let b = start(dir.path(), &b_spec, &listen_on(71));
    let (a_addr, b_addr) = (a.addr.clone(), b.addr.clone());
    let idle_threads = b.threads();

    // 300 slow clients from two addresses: at most 32 of each get a handshake slot, whose
    // deadline (3 s) ends them however steadily they trickle; the rest are closed at once.
    let slow: Vec<_> = (0..300)
        .map(|i| {
            let from = format!("127.0.0.{}", 200 + i % 2);
            tokio::spawn(slowloris(from, b_addr.clone(), Duration::from_secs(30)))
        })
        .collect();
    // A flood from a third address: 400 connections that never send a byte.
    let mut flood = Vec::new();
    for _ in 0..400 {
        if let Ok(s) = connect_from("127.0.0.202", &b_addr).await {
            flood.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let busy_threads = b.threads();

    // Meanwhile a real pair test from node-a to node-b passes on every rail.
    let started = Instant::now();
    let rails = pair_test(&a_addr, "node-a", "node-b", &b_addr).await;
    assert_eq!(rails.len(), settings().rails.len());
    for r in &rails {
        assert!(
            matches!(r.report, RailReport::Measured { bw_gbps, .. } if bw_gbps > 300.0),
            "{r:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // And the coordinator still reaches node-b's control channel.
    let status = request(
        &b_addr,
        TOKEN.as_bytes(),
        &ControlRequest::Status,
        Some("node-b"),
        T,
        T,
    )
    .await
    .unwrap();
    assert!(
        matches!(status, ControlResponse::Status { .. }),
        "{status:?}"
    );

    // Every flooding connection is gone: the ones beyond the cap at once, the others at
    // their handshake deadline.
    let mut open = 0;
    for s in &mut flood {
        if !closed_within(s, Duration::from_secs(8)).await {
            open += 1;
        }
    }
    assert_eq!(
        open, 0,
        "flooding connections still open after their deadline"
    );
    let mut held = Vec::new();
    for h in slow {
        held.push(h.await.unwrap());
    }
    let let_in = held.iter().flatten().count();
    assert!(let_in >= 250, "{let_in} slow clients connected at all");
    // Those with a slot were held until their deadline, the others closed at once.
    let until_deadline = held
        .iter()
        .flatten()
        .filter(|d| **d >= Duration::from_secs(2))
        .count();
    let at_once = held
        .iter()
        .flatten()
        .filter(|d| **d < Duration::from_millis(1500))
        .count();
    assert!(
        (32..=64).contains(&until_deadline) && at_once >= 200,
        "{until_deadline} held to the deadline, {at_once} closed at once"
    );
    let longest = held.iter().flatten().max().copied().unwrap_or_default();
    // Sending a byte every second does not stretch the 3 s deadline (bound generous).
    assert!(
        longest < Duration::from_secs(10),
        "a slow client was held {longest:?}"
    );
    // Slow clients got no threads: the process grew by far less than one thread each.
    assert!(
        busy_threads < idle_threads + 16,
        "{idle_threads} threads idle, {busy_threads} under attack"
    );
    let log = b.log_text();
    assert!(log.contains("connection closed at once"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_test_starved_by_a_saturated_endpoint_is_inconclusive_and_blames_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["node-0", "node-1", "node-2"];
    let mut eps = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut s = spec(name);
        if i == 1 {
            // node-1 takes four handshakes at a time, for up to 60 s each.
            s.extra = [
                "--peer-max-handshakes",
                "4",
                "--peer-max-handshakes-per-source",
                "4",
                "--peer-handshake-timeout-seconds",
                "60",
            ]
            .map(String::from)
            .to_vec();
        }
        eps.push(start(dir.path(), &s, &listen_on(80 + i as u8)));
    }
    let addrs: Vec<String> = eps.iter().map(|e| e.addr.clone()).collect();
    // An attacker holds node-1's four handshake slots with slow clients.
    let done = Arc::new(AtomicUsize::new(0));
    let mut slow = Vec::new();
    for _ in 0..4 {
        let to = addrs[1].clone();
        let done = done.clone();
        slow.push(tokio::spawn(async move {
            let r = slowloris("127.0.0.203".into(), to, Duration::from_secs(50)).await;
            done.fetch_add(1, Ordering::Relaxed);
            r
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // node-0's test with node-1 cannot even start its side channel: no evidence either way.
    let rails = pair_test(&addrs[0], "node-0", "node-1", &addrs[1]).await;
    for r in &rails {
        match &r.report {
            RailReport::Inconclusive { reason } => assert!(
                reason.contains("saturated") && reason.contains("no evidence against the rail"),
                "{reason}"
            ),
            other => panic!("a starved test must be inconclusive: {other:?}"),
        }
    }

    // A whole campaign while node-1 is saturated blames nobody.
    let nodes = campaign_nodes(&names, &addrs);
    let report = run_campaign(&nodes, &settings(), jiff::Timestamp::now())
        .await
        .unwrap();
    assert!(report.blamed_nodes().is_empty(), "{:#?}", report.findings);
    assert!(
        report.findings.values().all(|f| f.links.is_empty()),
        "{:#?}",
        report.findings
    );
    let with_node_1: Vec<_> = report
        .tests
        .iter()
        .filter(|t| t.initiator == "node-1" || t.responder == "node-1")
        .collect();
    assert!(!with_node_1.is_empty());
    for t in with_node_1 {
        for r in &t.rails {
            assert!(
                matches!(r.report, RailReport::Inconclusive { .. }),
                "{t:#?}"
            );
        }
    }
    assert_eq!(
        done.load(Ordering::Relaxed),
        0,
        "the attack ended before the checks"
    );
    for h in slow {
        h.abort();
    }
}

/// A proxy to `upstream` that flips one bit of the second frame the client sends (the
/// control channel's sealed request).
async fn flipping_proxy(upstream: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut down_r, mut up_w) = proxy_one(listener, upstream).await;
        let mut frames = 0;
        loop {
            let mut head = [0u8; 10];
            if down_r.read_exact(&mut head).await.is_err() {
                break;
            }
            let len = u32::from_be_bytes(head[6..10].try_into().unwrap()) as usize;
            let mut payload = vec![0u8; len];
            if down_r.read_exact(&mut payload).await.is_err() {
                break;
            }
            if frames == 1 {
                payload[12] ^= 0x04;
            }
            frames += 1;
            let _ = up_w.write_all(&head).await;
            let _ = up_w.write_all(&payload).await;
        }
    });
    addr
}

/// A proxy to `upstream` that records what the client sends.
async fn recording_proxy(upstream: String) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let recorded = tokio::spawn(async move {
        let (mut down_r, mut up_w) = proxy_one(listener, upstream).await;
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = down_r.read(&mut buf).await {
            seen.extend_from_slice(&buf[..n]);
            let _ = up_w.write_all(&buf[..n]).await;
        }
        seen
    });
    (addr, recorded)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_key_never_crosses_the_wire_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(dir.path(), &spec("node-a"), &listen_on(91));
    let a_addr = a.addr.clone();
    let (proxy, recorded) = recording_proxy(a_addr).await;
    let key = railguard_prober::rdma::peer::PairKey::random().to_hex();
    let announce = ControlRequest::AcceptPeer(railguard_campaign::wire::AcceptPeerRequest {
        peer_node: "node-b".into(),
        pair_key: key.clone(),
        ttl_ms: 1000,
    });
    // A shared-token endpoint refuses it, but it was sent, sealed and wrapped.
    let answer = request(&proxy, TOKEN.as_bytes(), &announce, None, T, T)
        .await
        .unwrap();
    assert!(
        matches!(answer, ControlResponse::Refused { .. }),
        "{answer:?}"
    );
    let seen = recorded.await.unwrap();
    assert!(
        seen.windows(8).any(|w| w == b"pairKey\""),
        "the request went through"
    );
    let text = String::from_utf8_lossy(&seen);
    assert!(!text.contains(&key), "the pair key travelled in the clear");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_request_altered_in_flight_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(dir.path(), &spec("node-a"), &listen_on(90));
    let a_addr = a.addr.clone();
    let proxy = flipping_proxy(a_addr.clone()).await;
    let e = request(
        &proxy,
        TOKEN.as_bytes(),
        &ControlRequest::Status,
        None,
        T,
        T,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("closed the control channel"), "{e}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.log_text().contains("integrity check") {
        assert!(Instant::now() < deadline, "{}", a.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The endpoint keeps serving untampered requests.
    assert!(request(
        &a_addr,
        TOKEN.as_bytes(),
        &ControlRequest::Status,
        None,
        T,
        T
    )
    .await
    .is_ok());
}
