//! The two-node RDMA WRITE test and its TCP side channel.
//!
//! Wire format (version 1): each frame is `b"RGRP"`, a big-endian `u16` protocol version, a
//! big-endian `u32` payload length (at most [`MAX_FRAME_BYTES`]) and a JSON [`Message`].
//! Authentication is mutual and never sends the token: both sides exchange random nonces and
//! prove knowledge of the shared token with HMAC-SHA256 over both nonces and their role; proofs
//! are compared in constant time.
//!
//! Flow (initiator = the side that writes):
//! ```text
//! initiator                         responder
//!   Hello{node, profile, nonce_i} ->
//!                                 <- Challenge{node, profile, nonce_r, proof_r}
//!   Auth{proof_i}                 ->
//!   TestRequest{rail, sizes, qp_i} ->   (responder checks profile, HCA, busy; opens its QP
//!                                        and buffer; connects to qp_i)
//!                                 <- Accept{qp_r} | Refuse{reason}
//!   (RDMA WRITE sweep into the responder's buffer)
//!   Done{ok, note}                ->
//!                                 <- Bye
//! ```

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::{MemoryKind, PeerRdmaEngine, QpInfo, RailBenchRequest, RailBenchResult, RdmaError};

pub const MAGIC: &[u8; 4] = b"RGRP";
pub const PROTOCOL_VERSION: u16 = 1;
pub const MAX_FRAME_BYTES: u32 = 64 * 1024;
/// Shortest shared token accepted; shorter secrets are guessable.
pub const MIN_TOKEN_BYTES: usize = 16;
const PROOF_CONTEXT: &str = "railguard-peer-v1";

/// Identity and limits of this prober's side channel.
#[derive(Clone)]
pub struct PeerConfig {
    /// This node's name (sent to the peer, checked against expectations).
    pub node: String,
    /// This node's FabricProfile: peers on another profile are refused.
    pub profile: String,
    token: Vec<u8>,
    /// Limit for each side-channel step (connect, one message).
    pub io_timeout: Duration,
    /// Limit for the whole RDMA sweep (the responder waits this long for `Done`).
    pub test_timeout: Duration,
}

impl std::fmt::Debug for PeerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerConfig")
            .field("node", &self.node)
            .field("profile", &self.profile)
            .field("token", &"<redacted>")
            .field("io_timeout", &self.io_timeout)
            .field("test_timeout", &self.test_timeout)
            .finish()
    }
}

impl PeerConfig {
    pub fn new(
        node: impl Into<String>,
        profile: impl Into<String>,
        token: impl AsRef<[u8]>,
    ) -> Result<Self, RdmaError> {
        let token = token.as_ref();
        // A token read from a Secret file often ends in a newline; it is not part of the secret.
        let token = token.strip_suffix(b"\n").unwrap_or(token);
        if token.len() < MIN_TOKEN_BYTES {
            return Err(RdmaError::InvalidRequest {
                reason: format!(
                    "peer token is {} bytes, at least {MIN_TOKEN_BYTES} are required",
                    token.len()
                ),
            });
        }
        Ok(PeerConfig {
            node: node.into(),
            profile: profile.into(),
            token: token.to_vec(),
            io_timeout: Duration::from_secs(10),
            test_timeout: Duration::from_secs(300),
        })
    }

    fn proof(&self, role: &str, nonce_i: &[u8], nonce_r: &[u8]) -> Vec<u8> {
        proof_with(&self.token, role, nonce_i, nonce_r)
    }

    fn verify(&self, role: &str, nonce_i: &[u8], nonce_r: &[u8], proof: &[u8]) -> bool {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.token) else {
            return false;
        };
        mac.update(&proof_input(role, nonce_i, nonce_r));
        mac.verify_slice(proof).is_ok()
    }
}

fn proof_input(role: &str, nonce_i: &[u8], nonce_r: &[u8]) -> Vec<u8> {
    let mut input = Vec::with_capacity(64 + nonce_i.len() + nonce_r.len());
    input.extend_from_slice(PROOF_CONTEXT.as_bytes());
    input.push(0);
    input.extend_from_slice(role.as_bytes());
    input.push(0);
    input.extend_from_slice(nonce_i);
    input.extend_from_slice(nonce_r);
    input
}

/// HMAC-SHA256 proof that the sender knows `token`, bound to both nonces and its role
/// (`"initiator"` or `"responder"`), so a proof cannot be replayed or reflected.
pub fn proof_with(token: &[u8], role: &str, nonce_i: &[u8], nonce_r: &[u8]) -> Vec<u8> {
    match Hmac::<Sha256>::new_from_slice(token) {
        Ok(mut mac) => {
            mac.update(&proof_input(role, nonce_i, nonce_r));
            mac.finalize().into_bytes().to_vec()
        }
        // HMAC takes keys of any length; this arm is unreachable in practice.
        Err(_) => Vec::new(),
    }
}

/// A side-channel message. Byte strings travel as lowercase hex.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Message {
    Hello {
        node: String,
        profile: String,
        nonce: String,
    },
    Challenge {
        node: String,
        profile: String,
        nonce: String,
        proof: String,
    },
    Auth {
        proof: String,
    },
    TestRequest {
        hca: String,
        port: u32,
        /// Memory of the responder's buffer (the initiator's is its own business).
        memory: MemoryKind,
        sizes: Vec<usize>,
        iterations: u32,
        initiator: QpInfo,
    },
    Accept {
        responder: QpInfo,
    },
    Refuse {
        reason: String,
    },
    Done {
        ok: bool,
        #[serde(default)]
        note: String,
    },
    Bye,
    Error {
        reason: String,
    },
}

impl Message {
    fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Challenge { .. } => "challenge",
            Message::Auth { .. } => "auth",
            Message::TestRequest { .. } => "testRequest",
            Message::Accept { .. } => "accept",
            Message::Refuse { .. } => "refuse",
            Message::Done { .. } => "done",
            Message::Bye => "bye",
            Message::Error { .. } => "error",
        }
    }
}

/// Encodes one frame.
pub fn encode_frame(msg: &Message) -> Result<Vec<u8>, RdmaError> {
    let payload = serde_json::to_vec(msg).map_err(|e| RdmaError::InvalidRequest {
        reason: format!("cannot encode side-channel message: {e}"),
    })?;
    if payload.len() > MAX_FRAME_BYTES as usize {
        return Err(RdmaError::InvalidRequest {
            reason: format!(
                "side-channel message of {} bytes is too large",
                payload.len()
            ),
        });
    }
    let mut frame = Vec::with_capacity(10 + payload.len());
    frame.extend_from_slice(MAGIC);
    frame.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// Decodes one frame from `r`. `peer` and `stage` only label errors.
pub fn read_message(
    r: &mut impl Read,
    peer: &str,
    stage: &'static str,
) -> Result<Message, RdmaError> {
    let mut header = [0u8; 10];
    read_exact(r, &mut header, peer, stage)?;
    if &header[..4] != MAGIC {
        return Err(protocol(
            peer,
            "not a railguard peer (bad frame magic)".into(),
        ));
    }
    let version = u16::from_be_bytes([header[4], header[5]]);
    if version != PROTOCOL_VERSION {
        return Err(protocol(
            peer,
            format!("protocol version {version}, this prober speaks {PROTOCOL_VERSION}"),
        ));
    }
    let len = u32::from_be_bytes([header[6], header[7], header[8], header[9]]);
    if len > MAX_FRAME_BYTES {
        return Err(protocol(
            peer,
            format!("frame of {len} bytes exceeds {MAX_FRAME_BYTES}"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    read_exact(r, &mut payload, peer, stage)?;
    serde_json::from_slice(&payload)
        .map_err(|e| protocol(peer, format!("malformed message during {stage}: {e}")))
}

/// Writes one frame to `w`.
pub fn write_message(
    w: &mut impl Write,
    msg: &Message,
    peer: &str,
    stage: &'static str,
) -> Result<(), RdmaError> {
    let frame = encode_frame(msg)?;
    w.write_all(&frame)
        .and_then(|()| w.flush())
        .map_err(|e| io_error(peer, stage, e))
}

/// `read_message` on a socket, with its read timeout in a timeout error.
fn recv(stream: &mut TcpStream, peer: &str, stage: &'static str) -> Result<Message, RdmaError> {
    read_message(stream, peer, stage).map_err(|e| with_timeout(e, stream.read_timeout()))
}

/// `write_message` on a socket, with its write timeout in a timeout error.
fn send(
    stream: &mut TcpStream,
    msg: &Message,
    peer: &str,
    stage: &'static str,
) -> Result<(), RdmaError> {
    write_message(stream, msg, peer, stage).map_err(|e| with_timeout(e, stream.write_timeout()))
}

fn with_timeout(e: RdmaError, limit: std::io::Result<Option<Duration>>) -> RdmaError {
    match (e, limit) {
        (RdmaError::Timeout { op, after_ms: 0 }, Ok(Some(limit))) => RdmaError::Timeout {
            op,
            after_ms: limit.as_millis() as u64,
        },
        (e, _) => e,
    }
}

fn read_exact(
    r: &mut impl Read,
    buf: &mut [u8],
    peer: &str,
    stage: &'static str,
) -> Result<(), RdmaError> {
    r.read_exact(buf).map_err(|e| io_error(peer, stage, e))
}

fn io_error(peer: &str, stage: &'static str, e: std::io::Error) -> RdmaError {
    match e.kind() {
        ErrorKind::UnexpectedEof
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe => RdmaError::PeerGone {
            peer: peer.to_string(),
            stage,
        },
        ErrorKind::WouldBlock | ErrorKind::TimedOut => RdmaError::Timeout {
            op: format!("{stage} with peer {peer}"),
            after_ms: 0,
        },
        _ => RdmaError::PeerIo {
            peer: peer.to_string(),
            stage,
            source: e,
        },
    }
}

fn protocol(peer: &str, reason: String) -> RdmaError {
    RdmaError::PeerProtocol {
        peer: peer.to_string(),
        reason,
    }
}

fn unexpected(peer: &str, stage: &str, msg: &Message) -> RdmaError {
    match msg {
        Message::Error { reason } => {
            protocol(peer, format!("peer reported during {stage}: {reason}"))
        }
        other => protocol(
            peer,
            format!("unexpected {} message during {stage}", other.kind()),
        ),
    }
}

fn nonce() -> [u8; 32] {
    rand::random()
}

fn unhex(peer: &str, what: &str, s: &str) -> Result<Vec<u8>, RdmaError> {
    hex::decode(s).map_err(|_| protocol(peer, format!("{what} is not hex")))
}

/// Rails of this node currently under test. One test per rail at a time: a second request is
/// refused as busy rather than queued.
#[derive(Debug, Clone, Default)]
pub struct RailLocks {
    held: Arc<Mutex<HashSet<(String, u32)>>>,
}

/// Holds a rail until dropped.
#[derive(Debug)]
pub struct RailGuard {
    locks: RailLocks,
    rail: (String, u32),
}

impl RailLocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the rail, or `RdmaError::Busy` if a test already holds it.
    pub fn try_acquire(&self, hca: &str, port: u32) -> Result<RailGuard, RdmaError> {
        let rail = (hca.to_string(), port);
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.insert(rail.clone()) {
            return Err(RdmaError::Busy {
                hca: hca.to_string(),
                port,
            });
        }
        Ok(RailGuard {
            locks: self.clone(),
            rail,
        })
    }

    pub fn is_held(&self, hca: &str, port: u32) -> bool {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.contains(&(hca.to_string(), port))
    }
}

impl Drop for RailGuard {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock().unwrap_or_else(|p| p.into_inner());
        held.remove(&self.rail);
    }
}

/// One two-node test: HCA `hca`:`port` here to the same rail on the peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerTestRequest {
    pub hca: String,
    pub port: u32,
    /// Memory of this node's (source) buffer.
    pub local_memory: MemoryKind,
    /// Memory of the peer's (destination) buffer.
    pub remote_memory: MemoryKind,
    pub sizes: Vec<usize>,
    pub iterations: u32,
    /// When set, the peer must identify as this node.
    #[serde(default)]
    pub expect_node: Option<String>,
}

impl PeerTestRequest {
    /// Host memory on both sides, default sweep.
    pub fn host(hca: impl Into<String>, port: u32) -> Self {
        let bench = RailBenchRequest::host(hca, port);
        PeerTestRequest {
            hca: bench.hca,
            port,
            local_memory: MemoryKind::Host,
            remote_memory: MemoryKind::Host,
            sizes: bench.sizes,
            iterations: bench.iterations,
            expect_node: None,
        }
    }

    fn as_bench(&self, memory: MemoryKind) -> RailBenchRequest {
        RailBenchRequest {
            hca: self.hca.clone(),
            port: self.port,
            memory,
            sizes: self.sizes.clone(),
            iterations: self.iterations,
        }
    }
}

/// Result of a two-node test as seen by the initiator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerTestOutcome {
    /// The peer's node name, as it authenticated.
    pub peer_node: String,
    pub remote_memory: MemoryKind,
    pub result: RailBenchResult,
}

/// What a responder did for one connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServedTest {
    pub peer_node: String,
    pub hca: String,
    pub port: u32,
    #[serde(flatten)]
    pub status: ServedStatus,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "camelCase")]
pub enum ServedStatus {
    /// The initiator finished its sweep and said so.
    Completed,
    /// The initiator reported a failed sweep.
    InitiatorFailed { note: String },
    /// This side refused (busy, other profile, no such HCA, ...).
    Refused { reason: String },
}

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
    let mut stream = TcpStream::connect_timeout(&addr, cfg.io_timeout).map_err(|source| {
        RdmaError::PeerUnreachable {
            peer: peer.to_string(),
            source,
        }
    })?;
    set_timeout(&stream, peer, cfg.io_timeout)?;
    let _ = stream.set_nodelay(true);

    // Mutual authentication.
    let nonce_i = nonce();
    send(
        &mut stream,
        &Message::Hello {
            node: cfg.node.clone(),
            profile: cfg.profile.clone(),
            nonce: hex::encode(nonce_i),
        },
        peer,
        "hello",
    )?;
    let (peer_node, nonce_r) = match recv(&mut stream, peer, "challenge")? {
        Message::Challenge {
            node,
            profile: _,
            nonce,
            proof,
        } => {
            let nonce_r = unhex(peer, "nonce", &nonce)?;
            let proof = unhex(peer, "proof", &proof)?;
            if nonce_r.len() < 16 || !cfg.verify("responder", &nonce_i, &nonce_r, &proof) {
                return Err(RdmaError::PeerAuth {
                    peer: peer.to_string(),
                    reason: "responder's proof does not match the shared token".into(),
                });
            }
            (node, nonce_r)
        }
        other => return Err(unexpected(peer, "challenge", &other)),
    };
    send(
        &mut stream,
        &Message::Auth {
            proof: hex::encode(cfg.proof("initiator", &nonce_i, &nonce_r)),
        },
        peer,
        "auth",
    )?;
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
    send(
        &mut stream,
        &Message::TestRequest {
            hca: req.hca.clone(),
            port: req.port,
            memory: req.remote_memory,
            sizes: req.sizes.clone(),
            iterations: req.iterations,
            initiator: endpoint.info(),
        },
        peer,
        "test request",
    )?;
    let remote = match recv(&mut stream, peer, "accept")? {
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
    endpoint.connect(&remote)?;

    let sweep = endpoint
        .write_sweep(&remote, &req.sizes, req.iterations)
        .map_err(|e| explain_sweep_error(&mut stream, peer, e));
    let (ok, note) = match &sweep {
        Ok(_) => (true, String::new()),
        Err(e) => (false, e.to_string()),
    };
    // The peer learns the outcome either way; if it is gone, the sweep error matters more.
    let done = send(&mut stream, &Message::Done { ok, note }, peer, "done");
    let points = sweep?;
    done?;
    set_timeout(&stream, peer, cfg.io_timeout)?;
    match recv(&mut stream, peer, "bye")? {
        Message::Bye => {}
        other => return Err(unexpected(peer, "bye", &other)),
    }
    Ok(PeerTestOutcome {
        peer_node,
        remote_memory: req.remote_memory,
        result: RailBenchResult::from_points(&req.hca, req.port, req.local_memory, points),
    })
}

/// A sweep that times out or ends in an error completion often means the peer process died:
/// if its side channel is closed too, say so instead of reporting the symptom.
fn explain_sweep_error(stream: &mut TcpStream, peer: &str, err: RdmaError) -> RdmaError {
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

fn check_gid(peer: &str, gid: &str) -> Result<(), RdmaError> {
    if gid.len() != 32 || !gid.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(protocol(peer, format!("gid {gid:?} is not 32 hex digits")));
    }
    Ok(())
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

fn set_timeout(stream: &TcpStream, peer: &str, t: Duration) -> Result<(), RdmaError> {
    stream
        .set_read_timeout(Some(t))
        .and_then(|()| stream.set_write_timeout(Some(t)))
        .map_err(|e| io_error(peer, "socket setup", e))
}

/// Who the initiator said it is, after it proved knowledge of the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedPeer {
    pub node: String,
    pub profile: String,
}

/// The responder's half of the mutual authentication (hello, challenge, auth). Public so test
/// tools can script misbehaving peers on top of a correct handshake.
pub fn authenticate_initiator(
    stream: &mut TcpStream,
    cfg: &PeerConfig,
    peer: &str,
) -> Result<AuthenticatedPeer, RdmaError> {
    let (peer_node, peer_profile, nonce_i) = match recv(stream, peer, "hello")? {
        Message::Hello {
            node,
            profile,
            nonce,
        } => (node, profile, unhex(peer, "nonce", &nonce)?),
        other => return Err(unexpected(peer, "hello", &other)),
    };
    if nonce_i.len() < 16 {
        return Err(protocol(peer, "nonce shorter than 16 bytes".into()));
    }
    let nonce_r = nonce();
    send(
        stream,
        &Message::Challenge {
            node: cfg.node.clone(),
            profile: cfg.profile.clone(),
            nonce: hex::encode(nonce_r),
            proof: hex::encode(cfg.proof("responder", &nonce_i, &nonce_r)),
        },
        peer,
        "challenge",
    )?;
    match recv(stream, peer, "auth")? {
        Message::Auth { proof } => {
            let proof = unhex(peer, "proof", &proof)?;
            if !cfg.verify("initiator", &nonce_i, &nonce_r, &proof) {
                let _ = send(
                    stream,
                    &Message::Error {
                        reason: "authentication failed".into(),
                    },
                    peer,
                    "auth",
                );
                return Err(RdmaError::PeerAuth {
                    peer: peer.to_string(),
                    reason: "initiator's proof does not match the shared token".into(),
                });
            }
        }
        other => return Err(unexpected(peer, "auth", &other)),
    }
    Ok(AuthenticatedPeer {
        node: peer_node,
        profile: peer_profile,
    })
}

/// Serves one accepted side-channel connection: authenticates the initiator, checks the
/// request against this node (profile, HCA, busy rail), opens and connects the target QP and
/// buffer, and keeps them alive until the initiator reports `Done` (or `test_timeout`).
pub fn run_write_test_responder(
    mut stream: TcpStream,
    cfg: &PeerConfig,
    engine: &dyn PeerRdmaEngine,
    locks: &RailLocks,
) -> Result<ServedTest, RdmaError> {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "unknown".into());
    let peer = peer.as_str();
    set_timeout(&stream, peer, cfg.io_timeout)?;
    // A stream handed over from an async runtime may still be non-blocking.
    stream
        .set_nonblocking(false)
        .map_err(|e| io_error(peer, "socket setup", e))?;
    let _ = stream.set_nodelay(true);

    let AuthenticatedPeer {
        node: peer_node,
        profile: peer_profile,
    } = authenticate_initiator(&mut stream, cfg, peer)?;

    let (hca, port, memory, sizes, iterations, initiator) =
        match recv(&mut stream, peer, "test request")? {
            Message::TestRequest {
                hca,
                port,
                memory,
                sizes,
                iterations,
                initiator,
            } => (hca, port, memory, sizes, iterations, initiator),
            other => return Err(unexpected(peer, "test request", &other)),
        };
    let served = |status| ServedTest {
        peer_node: peer_node.clone(),
        hca: hca.clone(),
        port,
        status,
    };
    let mut refuse = |reason: String| -> Result<ServedTest, RdmaError> {
        send(
            &mut stream,
            &Message::Refuse {
                reason: reason.clone(),
            },
            peer,
            "refuse",
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
    if let Err(e) = endpoint.connect(&initiator) {
        return refuse(e.to_string());
    }
    send(
        &mut stream,
        &Message::Accept {
            responder: endpoint.info(),
        },
        peer,
        "accept",
    )?;

    // The initiator writes into our buffer now; we only keep it registered until Done.
    set_timeout(&stream, peer, cfg.test_timeout)?;
    let status = match recv(&mut stream, peer, "done")? {
        Message::Done { ok: true, .. } => ServedStatus::Completed,
        Message::Done { ok: false, note } => ServedStatus::InitiatorFailed { note },
        other => return Err(unexpected(peer, "done", &other)),
    };
    set_timeout(&stream, peer, cfg.io_timeout)?;
    send(&mut stream, &Message::Bye, peer, "bye")?;
    drop(endpoint);
    Ok(served(status))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const TOKEN: &str = "0123456789abcdef-shared";

    #[test]
    fn frame_roundtrip_and_rejections() {
        let msg = Message::Done {
            ok: true,
            note: String::new(),
        };
        let frame = encode_frame(&msg).unwrap();
        assert_eq!(&frame[..4], MAGIC);
        assert_eq!(read_message(&mut &frame[..], "p", "t").unwrap(), msg);

        let mut bad = frame.clone();
        bad[0] = b'X';
        assert!(read_message(&mut &bad[..], "p", "t")
            .unwrap_err()
            .to_string()
            .contains("bad frame magic"));
        let mut v2 = frame.clone();
        v2[5] = 2;
        assert!(read_message(&mut &v2[..], "p", "t")
            .unwrap_err()
            .to_string()
            .contains("version 2"));
        let mut huge = frame.clone();
        huge[6..10].copy_from_slice(&(MAX_FRAME_BYTES + 1).to_be_bytes());
        assert!(read_message(&mut &huge[..], "p", "t")
            .unwrap_err()
            .to_string()
            .contains("exceeds"));
        let cut = &frame[..frame.len() - 1];
        assert!(matches!(
            read_message(&mut &cut[..], "p", "done"),
            Err(RdmaError::PeerGone { stage: "done", .. })
        ));
        let mut junk = frame[..10].to_vec();
        junk[6..10].copy_from_slice(&3u32.to_be_bytes());
        junk.extend_from_slice(b"{x}");
        assert!(matches!(
            read_message(&mut &junk[..], "p", "t"),
            Err(RdmaError::PeerProtocol { .. })
        ));
    }

    #[test]
    fn short_token_is_rejected_and_newline_ignored() {
        assert!(PeerConfig::new("n", "p", "short").is_err());
        let a = PeerConfig::new("n", "p", format!("{TOKEN}\n")).unwrap();
        let b = PeerConfig::new("n", "p", TOKEN).unwrap();
        assert_eq!(
            a.proof("initiator", b"x", b"y"),
            b.proof("initiator", b"x", b"y")
        );
        assert!(
            !format!("{a:?}").contains(TOKEN),
            "token must not be printed"
        );
    }

    #[test]
    fn proofs_bind_role_and_nonces() {
        let c = PeerConfig::new("n", "p", TOKEN).unwrap();
        let p = c.proof("initiator", b"aaaa", b"bbbb");
        assert!(c.verify("initiator", b"aaaa", b"bbbb", &p));
        assert!(
            !c.verify("responder", b"aaaa", b"bbbb", &p),
            "reflection must fail"
        );
        assert!(!c.verify("initiator", b"aaaa", b"bbbc", &p));
        let other = PeerConfig::new("n", "p", "another-token-of-16+").unwrap();
        assert!(!other.verify("initiator", b"aaaa", b"bbbb", &p));
    }
}
