//! The responder: checks a request against this node, opens the target QP and buffer, and
//! keeps them alive while the initiator writes.

use std::net::TcpStream;

use super::auth::{authenticate_initiator, AuthenticatedPeer};
use super::conn::SideChannel;
use super::wire::{check_gid, unexpected, Message};
use super::{PeerConfig, RailLocks, ServedStatus, ServedTest};
use crate::rdma::{PeerRdmaEngine, RailBenchRequest, RdmaError};

/// Serves one accepted side-channel connection: authenticates the initiator (within
/// `cfg.handshake_timeout`), then [`serve_authenticated`].
pub fn run_write_test_responder(
    stream: TcpStream,
    cfg: &PeerConfig,
    engine: &dyn PeerRdmaEngine,
    locks: &RailLocks,
) -> Result<ServedTest, RdmaError> {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "unknown".into());
    let mut ch = SideChannel::new(stream, peer)?;
    let initiator = authenticate_initiator(&mut ch, cfg)?;
    serve_authenticated(ch, initiator, cfg, engine, locks)
}

/// Serves an authenticated initiator: checks the request against this node (profile, HCA,
/// busy rail), opens and connects the target QP and buffer, and keeps them alive until the
/// initiator reports `Done` (or `test_timeout`).
pub fn serve_authenticated(
    mut ch: SideChannel,
    initiator: AuthenticatedPeer,
    cfg: &PeerConfig,
    engine: &dyn PeerRdmaEngine,
    locks: &RailLocks,
) -> Result<ServedTest, RdmaError> {
    let peer = ch.peer().to_string();
    let peer = peer.as_str();
    let t = cfg.io_timeout;
    let AuthenticatedPeer {
        node: peer_node,
        profile: peer_profile,
    } = initiator;

    let (hca, port, memory, sizes, iterations, initiator, class) =
        match ch.recv("test request", t)? {
            Message::TestRequest {
                hca,
                port,
                memory,
                sizes,
                iterations,
                initiator,
                class,
            } => (hca, port, memory, sizes, iterations, initiator, class),
            other => return Err(unexpected(peer, "test request", &other)),
        };
    let served = |status| ServedTest {
        peer_node: peer_node.clone(),
        hca: hca.clone(),
        port,
        status,
    };
    let mut refuse = |reason: String| -> Result<ServedTest, RdmaError> {
        ch.send(
            &Message::Refuse {
                reason: reason.clone(),
            },
            "refuse",
            t,
        )?;
        Ok(served(ServedStatus::Refused { reason }))
    };

    if peer_profile != cfg.profile {
        return refuse(format!(
            "peer is on profile {peer_profile}, this node on {}",
            cfg.profile
        ));
    }
    let bench = RailBenchRequest {
        hca: hca.clone(),
        port,
        memory,
        sizes: sizes.clone(),
        iterations,
        class,
    };
    if let Err(e) = bench.validate() {
        return refuse(e.to_string());
    }
    if initiator.hca != hca || initiator.port != port {
        return refuse(format!(
            "initiator QP is on {}:{}, the request names {hca}:{port}",
            initiator.hca, initiator.port
        ));
    }
    if let Err(e) = check_gid(peer, &initiator.gid) {
        return refuse(e.to_string());
    }
    let _rail = match locks.try_acquire(&hca, port) {
        Ok(guard) => guard,
        Err(e) => return refuse(e.to_string()),
    };
    let mut endpoint = match engine.open_endpoint(&hca, port, memory, bench.buffer_bytes()) {
        Ok(ep) => ep,
        Err(e) => return refuse(format!("{} on node {}", e, cfg.node)),
    };
    if let Err(e) = endpoint.connect(&initiator, class) {
        return refuse(e.to_string());
    }
    ch.send(
        &Message::Accept {
            responder: endpoint.info(),
        },
        "accept",
        t,
    )?;

    // The initiator writes into our buffer now; we only keep it registered until Done.
    let status = match ch.recv("done", cfg.test_timeout)? {
        Message::Done { ok: true, .. } => ServedStatus::Completed,
        Message::Done { ok: false, note } => ServedStatus::InitiatorFailed { note },
        other => return Err(unexpected(peer, "done", &other)),
    };
    ch.send(&Message::Bye, "bye", t)?;
    drop(endpoint);
    Ok(served(status))
}
