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
const T: Duration = Duration::from_secs(5);

fn engine(node: &str, bw: f64, hcas: &[&str]) -> SimulatedRdmaEngine {
    let rail = SimRailModel {
        bw_host_gbps: bw,
        bw_gpu_gbps: None,
        latency_us: 2.0,
        active: true,
        fault: None,
        wire: None,
        gids: None,
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

/// [`responder`] as most tests want it: node b of profile prof, mlx5_0 at 100 Gb/s, no rail
/// locked.
fn responder_b() -> (String, thread::JoinHandle<Result<ServedTest, RdmaError>>) {
    responder(
        cfg("b", "prof", TOKEN),
        engine("b", 100.0, &["mlx5_0"]),
        RailLocks::new(),
    )
}

fn small_request(hca: &str) -> PeerTestRequest {
    let mut r = PeerTestRequest::host(hca, 1);
    r.sizes = vec![8, 4096, 1 << 20];
    r
}

#[test]
fn simulated_pair_over_real_tcp() {
    let (addr, h) = responder_b();
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
    let (addr, h) = responder_b();
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
    // The peer holds the connection, silent, until the client has given up.
    let (gave_up, wait) = std::sync::mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let _ = wait.recv();
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
    gave_up.send(()).unwrap();
    assert!(
        matches!(
            err,
            RdmaError::PeerTimeout {
                after_ms: 300,
                stage: "challenge",
                ..
            }
        ),
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

/// A rogue responder scripted with the public protocol pieces: a correct handshake, then
/// the script.
fn rogue(script: impl FnOnce(&mut SideChannel, &PeerConfig) + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let c = cfg("rogue", "prof", TOKEN);
        let mut ch = SideChannel::new(s, "i").unwrap();
        authenticate_initiator(&mut ch, &c).unwrap();
        let _req = ch.recv("test request", c.io_timeout).unwrap();
        script(&mut ch, &c);
    });
    addr
}

/// The rogue's Accept of the test for `hca`:1, on an endpoint of its own engine (returned,
/// to stay open while the script goes on).
fn accept_on(s: &mut SideChannel, hca: &str) -> Box<dyn RdmaEndpoint> {
    let e = engine("rogue", 100.0, &[hca]);
    let ep = e.open_endpoint(hca, 1, MemoryKind::Host, 1 << 20).unwrap();
    let accept = Message::Accept {
        responder: ep.info(),
    };
    s.send(&accept, "accept", T).unwrap();
    ep
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
        let _endpoint = accept_on(s, "mlx5_7");
        let _ = s.recv("done", T);
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
        let _ = s.stream().shutdown(std::net::Shutdown::Both);
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
        let _endpoint = accept_on(s, "mlx5_0");
        let _ = s.stream().shutdown(std::net::Shutdown::Both);
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
    let (addr, h) = responder_b();
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

/// What a man in the middle does to the frames of one connection.
#[derive(Clone, Copy)]
enum Tamper {
    /// Flip one bit of the initiator's test request (its second sealed frame).
    FlipBit,
    /// Send the initiator's sealed auth frame a second time in place of the test request.
    Replay,
    /// Send the initiator its own sealed auth frame back as the responder's first.
    Reflect,
}

/// One whole frame from `r`: head and payload.
fn read_frame(r: &mut impl std::io::Read) -> Option<Vec<u8>> {
    let mut head = vec![0u8; channel::HEAD_BYTES];
    r.read_exact(&mut head).ok()?;
    let len = u32::from_be_bytes(head[channel::HEAD_BYTES - 4..].try_into().unwrap()) as usize;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).ok()?;
    head.extend(payload);
    Some(head)
}

/// A proxy in front of `upstream` that tampers with one connection's frames.
fn tampering_proxy(upstream: String, tamper: Tamper) -> String {
    use std::io::Write;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        let (down, _) = listener.accept().unwrap();
        let up = TcpStream::connect(upstream).unwrap();
        let (mut down_r, mut down_w) = (down.try_clone().unwrap(), down);
        let (mut up_r, mut up_w) = (up.try_clone().unwrap(), up);
        let mut to_initiator = down_w.try_clone().unwrap();
        // Responder -> initiator: the challenge always; the rest unless reflecting.
        thread::spawn(move || {
            let mut n = 0;
            while let Some(f) = read_frame(&mut up_r) {
                if n == 0 || !matches!(tamper, Tamper::Reflect) {
                    let _ = down_w.write_all(&f);
                }
                n += 1;
            }
            let _ = down_w.shutdown(std::net::Shutdown::Both);
        });
        let mut auth = None;
        let mut n = 0;
        while let Some(mut f) = read_frame(&mut down_r) {
            match (n, tamper) {
                (1, _) => auth = Some(f.clone()),
                (2, Tamper::FlipBit) => {
                    let i = channel::HEAD_BYTES + 3;
                    f[i] ^= 0x01;
                }
                (2, Tamper::Replay) => f = auth.clone().unwrap(),
                _ => {}
            }
            if n == 1 && matches!(tamper, Tamper::Reflect) {
                let _ = to_initiator.write_all(&f);
            }
            let _ = up_w.write_all(&f);
            n += 1;
        }
        let _ = up_w.shutdown(std::net::Shutdown::Both);
    });
    addr
}

/// A real initiator and a real responder with a man in the middle.
fn tampered(
    tamper: Tamper,
) -> (
    Result<PeerTestOutcome, RdmaError>,
    Result<ServedTest, RdmaError>,
) {
    let (addr, h) = responder_b();
    let proxy = tampering_proxy(addr, tamper);
    let initiated = initiate(&proxy);
    (initiated, h.join().unwrap())
}

#[test]
fn a_frame_altered_after_authentication_is_rejected_and_the_connection_closed() {
    let (initiated, served) = tampered(Tamper::FlipBit);
    let e = served.unwrap_err();
    assert!(
        matches!(&e, RdmaError::PeerAuth { reason, .. }
            if reason.contains("test request") && reason.contains("frame 1 failed its integrity check")),
        "{e}"
    );
    // The responder hung up: the initiator learns nothing but that.
    let e = initiated.unwrap_err();
    assert!(
        matches!(
            e,
            RdmaError::PeerGone {
                stage: "accept",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_replayed_frame_is_rejected() {
    let (initiated, served) = tampered(Tamper::Replay);
    let e = served.unwrap_err();
    assert!(
        matches!(&e, RdmaError::PeerAuth { reason, .. } if reason.contains("frame 1 failed its integrity check")),
        "{e}"
    );
    assert!(initiated.is_err());
}

#[test]
fn a_reflected_frame_is_rejected() {
    let (initiated, _served) = tampered(Tamper::Reflect);
    let e = initiated.unwrap_err();
    assert!(
        matches!(&e, RdmaError::PeerAuth { reason, .. }
            if reason.contains("accept") && reason.contains("frame 0 failed its integrity check")),
        "{e}"
    );
}

#[test]
fn under_pair_keys_the_shared_token_cannot_pose_as_the_expected_peer() {
    let keys = PairKeys::new();
    let pair = PairKey::random();
    keys.insert("a", pair.clone(), Duration::from_secs(60));
    let responder_cfg = cfg("b", "prof", TOKEN).with_pair_keys(keys);
    let run = |initiator: PeerConfig| {
        let (addr, h) = responder(
            responder_cfg.clone(),
            engine("b", 100.0, &["mlx5_0"]),
            RailLocks::new(),
        );
        let r = run_write_test_initiator(
            &addr,
            &initiator,
            &engine(&initiator.node, 100.0, &["mlx5_0"]),
            &RailLocks::new(),
            &small_request("mlx5_0"),
        );
        (r, h.join().unwrap())
    };
    // Node c holds the cluster token and claims to be a: b asks for a's pair key.
    // The impostor cannot check b's challenge (made with the pair key) and b never sees a
    // valid proof.
    let (r, served) = run(cfg("a", "prof", TOKEN));
    assert!(
        matches!(&r, Err(RdmaError::PeerAuth { reason, .. }) if reason.contains("does not match")),
        "{r:?}"
    );
    let e = served.unwrap_err();
    assert!(
        matches!(e, RdmaError::PeerGone { stage: "auth", .. }),
        "{e}"
    );
    // A node without any announcement is refused outright.
    let (_, served) = run(cfg("c", "prof", TOKEN));
    let e = served.unwrap_err();
    assert!(e.to_string().contains("no pair key for node c"), "{e}");
    // The real a, with the pair key, passes.
    let (r, served) = run(cfg("a", "prof", TOKEN).for_pair(&pair));
    assert_eq!(r.unwrap().peer_node, "b");
    assert_eq!(served.unwrap().status, ServedStatus::Completed);
}
