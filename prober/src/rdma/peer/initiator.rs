//! The initiator: connects, authenticates, and runs the RDMA WRITE sweep into the peer's
//! buffer.

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::auth::authenticate_responder;
use super::conn::SideChannel;
use super::wire::{check_gid, protocol, unexpected, Message};
use super::{PeerConfig, PeerTestOutcome, PeerTestRequest, RailLocks};
use crate::rdma::{PeerRdmaEngine, QpInfo, RailBenchResult, RdmaError};

/// Connects to `peer`, authenticates, and runs the RDMA WRITE sweep from this node's rail into
/// the peer's buffer on the same rail.
pub fn run_write_test_initiator(
    peer: &str,
    cfg: &PeerConfig,
    engine: &dyn PeerRdmaEngine,
    locks: &RailLocks,
    req: &PeerTestRequest,
) -> Result<PeerTestOutcome, RdmaError> {
    req.as_bench(req.local_memory).validate()?;
    let _rail = locks.try_acquire(&req.hca, req.port)?;
    let addr = resolve(peer)?;
    let stream = TcpStream::connect_timeout(&addr, cfg.io_timeout).map_err(|source| {
        RdmaError::PeerUnreachable {
            peer: peer.to_string(),
            source,
        }
    })?;
    let mut ch = SideChannel::new(stream, peer)?;
    let t = cfg.io_timeout;

    let peer_node = authenticate_responder(&mut ch, cfg, cfg.own_key(), t)?.node;
    if let Some(expect) = &req.expect_node {
        if expect != &peer_node {
            return Err(protocol(
                peer,
                format!("peer identifies as node {peer_node}, expected {expect}"),
            ));
        }
    }

    // Resources, then the QP exchange.
    let buffer = req.sizes.iter().copied().max().unwrap_or(0);
    let mut endpoint = engine.open_endpoint(&req.hca, req.port, req.local_memory, buffer)?;
    ch.send(
        &Message::TestRequest {
            hca: req.hca.clone(),
            port: req.port,
            memory: req.remote_memory,
            sizes: req.sizes.clone(),
            iterations: req.iterations,
            initiator: endpoint.info(),
            class: req.class,
        },
        "test request",
        t,
    )?;
    let remote = match ch.recv("accept", t)? {
        Message::Accept { responder } => responder,
        Message::Refuse { reason } => {
            return Err(RdmaError::PeerRefused {
                peer: peer.to_string(),
                reason,
            })
        }
        other => return Err(unexpected(peer, "accept", &other)),
    };
    check_remote_qp(peer, &remote, req, buffer)?;
    endpoint.connect(&remote, req.class)?;

    let sweep = endpoint
        .write_sweep(&remote, &req.sizes, req.iterations)
        .map_err(|e| explain_sweep_error(ch.stream(), peer, e));
    let (ok, note) = match &sweep {
        Ok(_) => (true, String::new()),
        Err(e) => (false, e.to_string()),
    };
    // The peer learns the outcome either way; if it is gone, the sweep error matters more.
    let done = ch.send(&Message::Done { ok, note }, "done", t);
    let points = sweep?;
    done?;
    match ch.recv("bye", t)? {
        Message::Bye => {}
        other => return Err(unexpected(peer, "bye", &other)),
    }
    let mut result = RailBenchResult::from_points(&req.hca, req.port, req.local_memory, points)
        .with_gid_of(&endpoint.info());
    result.registration = endpoint.registration();
    Ok(PeerTestOutcome {
        peer_node,
        remote_memory: req.remote_memory,
        result,
    })
}

/// A sweep that times out or ends in an error completion often means the peer process died:
/// if its side channel is closed too, say so instead of reporting the symptom.
fn explain_sweep_error(mut stream: &TcpStream, peer: &str, err: RdmaError) -> RdmaError {
    if !matches!(
        err,
        RdmaError::Timeout { .. } | RdmaError::WorkCompletion { .. }
    ) {
        return err;
    }
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => RdmaError::PeerGone {
            peer: peer.to_string(),
            stage: "rdma write sweep",
        },
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
            ) =>
        {
            RdmaError::PeerGone {
                peer: peer.to_string(),
                stage: "rdma write sweep",
            }
        }
        _ => err,
    }
}

/// The peer's QP must be on the rail we asked for and offer a buffer big enough: a peer that
/// answers for another HCA (or lies about its buffer) is rejected before any write.
fn check_remote_qp(
    peer: &str,
    remote: &QpInfo,
    req: &PeerTestRequest,
    buffer: usize,
) -> Result<(), RdmaError> {
    if remote.hca != req.hca || remote.port != req.port {
        return Err(protocol(
            peer,
            format!(
                "peer answered for rail {}:{}, requested {}:{}",
                remote.hca, remote.port, req.hca, req.port
            ),
        ));
    }
    if remote.len < buffer as u64 {
        return Err(protocol(
            peer,
            format!(
                "peer buffer of {} bytes is smaller than {buffer}",
                remote.len
            ),
        ));
    }
    check_gid(peer, &remote.gid)
}

fn resolve(peer: &str) -> Result<SocketAddr, RdmaError> {
    peer.to_socket_addrs()
        .map_err(|source| RdmaError::PeerUnreachable {
            peer: peer.to_string(),
            source,
        })?
        .next()
        .ok_or_else(|| RdmaError::PeerUnreachable {
            peer: peer.to_string(),
            source: std::io::Error::new(ErrorKind::NotFound, "address resolves to nothing"),
        })
}
