//! The peer side channel over real TCP between two simulated engines: a pair test end to end,
//! authentication, refusals, timeouts, and peers that break the protocol.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use railguard_prober::rdma::peer::*;
use railguard_prober::rdma::*;
use railguard_sim::rdma::{SimLinkFault, SimRailModel, SimRdmaModel, SimulatedRdmaEngine};

const TOKEN: &str = "0123456789abcdef-shared";

fn engine(node: &str, bw: f64, hcas: &[&str]) -> SimulatedRdmaEngine {
    let rail = SimRailModel {
        bw_host_gbps: bw,
        bw_gpu_gbps: None,
        latency_us: 2.0,
        active: true,
        fault: None,
        wire: None,
    };
    SimulatedRdmaEngine::new(SimRdmaModel {
        node: node.into(),
        rails: hcas
            .iter()
            .map(|h| (format!("{h}:1"), rail.clone()))
            .collect(),
        links: BTreeMap::new(),
    })
    .unwrap()
}

fn cfg(node: &str, profile: &str, token: &str) -> PeerConfig {
    let mut c = PeerConfig::new(node, profile, token).unwrap();
    c.io_timeout = Duration::from_secs(5);
    c.test_timeout = Duration::from_secs(5);
    c
}

/// Starts a responder thread serving one connection; returns its address and join handle.
fn responder(
    c: PeerConfig,
    e: SimulatedRdmaEngine,
    locks: RailLocks,
) -> (String, thread::JoinHandle<Result<ServedTest, RdmaError>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let h = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        run_write_test_responder(s, &c, &e, &locks)
    });
    (addr, h)
}

fn small_request(hca: &str) -> PeerTestRequest {
    let mut r = PeerTestRequest::host(hca, 1);
    r.sizes = vec![8, 4096, 1 << 20];
    r
}

#[test]
fn simulated_pair_over_real_tcp() {
    let (addr, h) = responder(
        cfg("b", "prof", TOKEN),
        engine("b", 100.0, &["mlx5_0"]),
        RailLocks::new(),
    );
    let out = run_write_test_initiator(
        &addr,
        &cfg("a", "prof", TOKEN),
        &engine("a", 200.0, &["mlx5_0"]),
        &RailLocks::new(),
        &PeerTestRequest {
            expect_node: Some("b".into()),
            ..small_request("mlx5_0")
        },
    )
    .unwrap();
    assert_eq!(out.peer_node, "b");
    assert_eq!(out.result.points.len(), 3);
    assert!(out.result.peak_bw_gbps > 90.0 && out.result.peak_bw_gbps < 100.0);
    let served = h.join().unwrap().unwrap();
    assert_eq!(served.status, ServedStatus::Completed);
    assert_eq!(served.peer_node, "a");
}

#[test]
fn wrong_token_fails_both_sides() {
    let (addr, h) = responder(
        cfg("b", "prof", TOKEN),
        engine("b", 100.0, &["mlx5_0"]),
        RailLocks::new(),
    );
    let err = run_write_test_initiator(
        &addr,
        &cfg("a", "prof", "wrong-token-wrong-token"),
        &engine("a", 100.0, &["mlx5_0"]),
        &RailLocks::new(),
        &small_request("mlx5_0"),
    )
    .unwrap_err();
    assert!(matches!(err, RdmaError::PeerAuth { .. }), "{err}");
    // The responder sees the initiator hang up before proving anything.
    assert!(h.join().unwrap().is_err());
}

#[test]
fn other_profile_missing_hca_and_busy_are_refused() {
    let run = |initiator_profile: &str, hca: &str, locks: RailLocks| {
        let (addr, h) = responder(
            cfg("b", "prof", TOKEN),
            engine("b", 100.0, &["mlx5_0"]),
            locks,
        );
        let r = run_write_test_initiator(
            &addr,
            &cfg("a", initiator_profile, TOKEN),
            &engine("a", 100.0, &["mlx5_0", "mlx5_1"]),
            &RailLocks::new(),
            &small_request(hca),
        );
        (r, h.join().unwrap().unwrap())
    };
    let (r, served) = run("other", "mlx5_0", RailLocks::new());
    assert!(
        matches!(&r, Err(RdmaError::PeerRefused { reason, .. }) if reason.contains("profile other")),
        "{r:?}"
    );
    assert!(matches!(served.status, ServedStatus::Refused { .. }));

    let (r, _) = run("prof", "mlx5_1", RailLocks::new());
    assert!(
        matches!(&r, Err(RdmaError::PeerRefused { reason, .. }) if reason.contains("mlx5_1 not found")),
        "{r:?}"
    );

    let locks = RailLocks::new();
    let _held = locks.try_acquire("mlx5_0", 1).unwrap();
    let (r, _) = run("prof", "mlx5_0", locks);
    assert!(
        matches!(&r, Err(RdmaError::PeerRefused { reason, .. }) if reason.contains("busy")),
        "{r:?}"
    );
}

#[test]
fn local_busy_rail_is_not_queued() {
    let locks = RailLocks::new();
    let _g = locks.try_acquire("mlx5_0", 1).unwrap();
    let err = run_write_test_initiator(
        "127.0.0.1:1",
        &cfg("a", "prof", TOKEN),
        &engine("a", 100.0, &["mlx5_0"]),
        &locks,
        &small_request("mlx5_0"),
    )
    .unwrap_err();
    assert!(matches!(err, RdmaError::Busy { .. }));
    drop(_g);
    assert!(!locks.is_held("mlx5_0", 1));
}

#[test]
fn silent_peer_times_out_with_the_configured_limit() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let h = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        thread::sleep(Duration::from_millis(1500));
        drop(s);
    });
    let mut c = cfg("a", "prof", TOKEN);
    c.io_timeout = Duration::from_millis(300);
    let err = run_write_test_initiator(
        &addr,
        &c,
        &engine("a", 100.0, &["mlx5_0"]),
        &RailLocks::new(),
        &small_request("mlx5_0"),
    )
    .unwrap_err();
    assert!(
        matches!(err, RdmaError::Timeout { after_ms: 300, ref op } if op.contains("challenge")),
        "{err}"
    );
    h.join().unwrap();
}

#[test]
fn unreachable_peer_is_a_clean_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let err = run_write_test_initiator(
        &addr,
        &cfg("a", "prof", TOKEN),
        &engine("a", 100.0, &["mlx5_0"]),
        &RailLocks::new(),
        &small_request("mlx5_0"),
    )
    .unwrap_err();
    assert!(matches!(err, RdmaError::PeerUnreachable { .. }), "{err}");
}

/// A rogue responder scripted with the public protocol pieces.
fn rogue(script: impl FnOnce(&mut TcpStream, &PeerConfig) + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let c = cfg("rogue", "prof", TOKEN);
        let Message::Hello { nonce, .. } = read_message(&mut s, "i", "hello").unwrap() else {
            panic!()
        };
        let nonce_i = hex::decode(nonce).unwrap();
        let nonce_r = [7u8; 32];
        write_message(
            &mut s,
            &Message::Challenge {
                node: "rogue".into(),
                profile: "prof".into(),
                nonce: hex::encode(nonce_r),
                proof: hex::encode(proof_with(
                    TOKEN.as_bytes(),
                    "responder",
                    &nonce_i,
                    &nonce_r,
                )),
            },
            "i",
            "challenge",
        )
        .unwrap();
        let _auth = read_message(&mut s, "i", "auth").unwrap();
        let _req = read_message(&mut s, "i", "test request").unwrap();
        script(&mut s, &c);
    });
    addr
}

fn initiate(addr: &str) -> Result<PeerTestOutcome, RdmaError> {
    run_write_test_initiator(
        addr,
        &cfg("a", "prof", TOKEN),
        &engine("a", 100.0, &["mlx5_0"]),
        &RailLocks::new(),
        &small_request("mlx5_0"),
    )
}

#[test]
fn peer_claiming_another_hca_is_rejected() {
    let addr = rogue(|s, _| {
        let e = engine("rogue", 100.0, &["mlx5_7"]);
        let ep = e
            .open_endpoint("mlx5_7", 1, MemoryKind::Host, 1 << 20)
            .unwrap();
        write_message(
            s,
            &Message::Accept {
                responder: ep.info(),
            },
            "i",
            "accept",
        )
        .unwrap();
        let _ = read_message(s, "i", "done");
    });
    let err = initiate(&addr).unwrap_err();
    assert!(
        err.to_string().contains("peer answered for rail mlx5_7:1"),
        "{err}"
    );
}

#[test]
fn peer_disconnecting_mid_test_is_peer_gone() {
    let addr = rogue(|s, _| {
        let _ = s.shutdown(std::net::Shutdown::Both);
    });
    let err = initiate(&addr).unwrap_err();
    assert!(
        matches!(
            err,
            RdmaError::PeerGone {
                stage: "accept",
                ..
            }
        ),
        "{err}"
    );

    // Gone after accepting: the writes "succeed" in simulation but the peer never says Bye.
    let addr = rogue(|s, _| {
        let e = engine("rogue", 100.0, &["mlx5_0"]);
        let ep = e
            .open_endpoint("mlx5_0", 1, MemoryKind::Host, 1 << 20)
            .unwrap();
        write_message(
            s,
            &Message::Accept {
                responder: ep.info(),
            },
            "i",
            "accept",
        )
        .unwrap();
        let _ = s.shutdown(std::net::Shutdown::Both);
    });
    let err = initiate(&addr).unwrap_err();
    assert!(matches!(err, RdmaError::PeerGone { .. }), "{err}");
}

#[test]
fn dead_link_reports_failure_to_responder() {
    let mut model = engine("a", 100.0, &["mlx5_0"]).model().clone();
    model.links.insert(
        "b".into(),
        SimLinkFault {
            bw_factor: 1.0,
            dead: true,
            hcas: vec![],
        },
    );
    let a = SimulatedRdmaEngine::new(model).unwrap();
    let (addr, h) = responder(
        cfg("b", "prof", TOKEN),
        engine("b", 100.0, &["mlx5_0"]),
        RailLocks::new(),
    );
    let err = run_write_test_initiator(
        &addr,
        &cfg("a", "prof", TOKEN),
        &a,
        &RailLocks::new(),
        &small_request("mlx5_0"),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            RdmaError::WorkCompletion {
                status_code: 12,
                ..
            }
        ),
        "{err}"
    );
    let served = h.join().unwrap().unwrap();
    assert!(
        matches!(served.status, ServedStatus::InitiatorFailed { ref note } if note.contains("retry"))
    );
}
