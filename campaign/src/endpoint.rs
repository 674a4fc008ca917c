//! The peer endpoint a prober runs for campaigns: one TCP port for the coordinator's control
//! channel ([`super::wire`]) and the RDMA side channel of other probers
//! ([`railguard_prober::rdma::peer`]); the first four bytes of a connection pick the protocol.
//!
//! Rules: the coordinator must prove the shared token; a test for another profile is refused;
//! one test per rail at a time (a second one is refused as busy, never queued, through the
//! shared [`RailLocks`] of the RDMA side channel); no test while GPU pods run on the node
//! unless the request asks for it; every wait has a time limit.
//!
//! The port faces the network, so nothing unauthenticated may hold a thread or linger: every
//! handshake runs asynchronously under one deadline for the whole handshake
//! ([`ConnectionLimits::handshake_timeout`]), unauthenticated connections are capped in all
//! and per source address, all connections are capped, and a connection beyond a cap is
//! closed at once. Only an authenticated RDMA side channel gets a blocking thread for its
//! test. A test starved by a saturated endpoint comes out inconclusive, never as a failed rail.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Encoder, Framed, FramedParts};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::identity::{CoordinatorCheck, CoordinatorIdentity};
use super::kube::GpuPodSource;
use super::nccl_pair::NcclRunner;
use super::wire::{
    self, AcceptPeerRequest, ControlChannel, ControlMessage, ControlRequest, ControlResponse,
    NcclJoinRequest, NcclSide, NcclSideReport, NcclTestRequest, RailRef, RailReport,
    RailTestReport, RunTestRequest, CONTROL_MAGIC, ROLE_COORDINATOR, ROLE_ENDPOINT,
    SESSION_PROTOCOL,
};
use super::CampaignError;
use railguard_prober::rdma::peer::channel::{
    decode_nonce, nonce, proof_hex, trim_token, verify_proof, FrameCodec, Session,
};
use railguard_prober::rdma::peer::wire::{read_error, write_error, FORMAT as RDMA_FORMAT};
use railguard_prober::rdma::peer::{
    answer_hello, run_write_test_initiator, serve_authenticated, AuthenticatedPeer, Message,
    PairKey, PairKeys, RailGuard, SideChannel, MAGIC as RDMA_MAGIC,
};
use railguard_prober::rdma::{PeerConfig, PeerRdmaEngine, PeerTestRequest, RailLocks, RdmaError};

/// Most rails one request may name (a node has at most a few dozen HCA ports).
pub const MAX_RAILS_PER_REQUEST: usize = 64;
/// Longest a pair key announced by the coordinator is kept.
pub const MAX_PAIR_KEY_TTL: Duration = Duration::from_secs(3600);

/// How many connections an endpoint holds, and how long a handshake may take.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectionLimits {
    /// Limit for a whole handshake, from accept to authenticated.
    pub handshake_timeout: Duration,
    /// Connections not yet authenticated, in all.
    pub max_handshakes: usize,
    /// Connections not yet authenticated from one source address.
    pub max_handshakes_per_source: usize,
    /// Connections in all, authenticated or not.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            handshake_timeout: Duration::from_secs(5),
            max_handshakes: 128,
            max_handshakes_per_source: 32,
            max_connections: 512,
        }
    }
}

/// What an endpoint turned away (the endpoint has no metrics port; these are logged and
/// readable by tests).
#[derive(Debug, Default)]
pub struct EndpointStats {
    /// Connections closed at once because a cap was reached.
    pub rejected: AtomicU64,
    /// Handshakes that ran past their deadline.
    pub handshake_timeouts: AtomicU64,
}

/// Everything an endpoint needs.
pub struct EndpointConfig {
    /// Side-channel identity (node, profile, token, RDMA time limits).
    pub peer: PeerConfig,
    token: Vec<u8>,
    pub engine: Arc<dyn PeerRdmaEngine>,
    pub locks: RailLocks,
    pub gpu_pods: GpuPodSource,
    /// Limit for one control-channel step after the handshake.
    pub io_timeout: Duration,
    pub limits: ConnectionLimits,
    pub stats: Arc<EndpointStats>,
    /// How NCCL pair tests start this node's ranks; `None`: they are not measured here.
    pub nccl: Option<NcclRunner>,
    /// Set in coordinator mode: the pair keys announced for tests from peers.
    pub pair_keys: Option<PairKeys>,
    /// The pod's projected service-account token, sent to the coordinator on `Identify`.
    pub identity_token_file: Option<PathBuf>,
    /// Set in coordinator mode: requests without a pair key must carry the coordinator's
    /// token for the connection.
    pub coordinator_check: Option<CoordinatorCheck>,
}

impl std::fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("peer", &self.peer)
            .field("io_timeout", &self.io_timeout)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl EndpointConfig {
    pub fn new(
        peer: PeerConfig,
        token: &[u8],
        engine: Arc<dyn PeerRdmaEngine>,
        gpu_pods: GpuPodSource,
    ) -> Self {
        EndpointConfig {
            peer,
            token: trim_token(token).to_vec(),
            engine,
            locks: RailLocks::new(),
            gpu_pods,
            io_timeout: Duration::from_secs(10),
            limits: ConnectionLimits::default(),
            stats: Arc::default(),
            nccl: None,
            pair_keys: None,
            identity_token_file: None,
            coordinator_check: None,
        }
    }

    /// Peers authenticate with the pair keys the coordinator announces, never with the
    /// shared token.
    pub fn with_pair_keys(mut self) -> Self {
        let keys = PairKeys::new();
        self.peer = self.peer.clone().with_pair_keys(keys.clone());
        self.pair_keys = Some(keys);
        self
    }

    /// Coordinator mode: pair keys, and only the coordinator's service account (checked by
    /// TokenReview for each connection) may announce them or ask for this pod's token.
    pub fn with_coordinator_check(self, check: CoordinatorCheck) -> Self {
        let mut cfg = self.with_pair_keys();
        cfg.coordinator_check = Some(check);
        cfg
    }
}

/// Unauthenticated connections per source address.
#[derive(Debug, Default)]
struct SourceCounts(Mutex<HashMap<IpAddr, usize>>);

/// One unauthenticated connection's place under the caps, given back on drop.
struct HandshakeSlot {
    _permit: OwnedSemaphorePermit,
    sources: Arc<SourceCounts>,
    ip: IpAddr,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut counts = self.sources.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// The caps of one endpoint.
struct Admission {
    connections: Arc<Semaphore>,
    handshakes: Arc<Semaphore>,
    sources: Arc<SourceCounts>,
    per_source: usize,
}

impl Admission {
    fn new(limits: &ConnectionLimits) -> Self {
        Admission {
            connections: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            handshakes: Arc::new(Semaphore::new(limits.max_handshakes.max(1))),
            sources: Arc::default(),
            per_source: limits.max_handshakes_per_source.max(1),
        }
    }

    /// A place for a new connection from `ip`, or why there is none.
    fn admit(&self, ip: IpAddr) -> Result<(OwnedSemaphorePermit, HandshakeSlot), &'static str> {
        let connection = self
            .connections
            .clone()
            .try_acquire_owned()
            .map_err(|_| "connection cap reached")?;
        let handshake = self
            .handshakes
            .clone()
            .try_acquire_owned()
            .map_err(|_| "unauthenticated connection cap reached")?;
        {
            let mut counts = self.sources.0.lock().unwrap_or_else(|p| p.into_inner());
            let n = counts.entry(ip).or_insert(0);
            if *n >= self.per_source {
                return Err("unauthenticated connection cap of the source address reached");
            }
            *n += 1;
        }
        Ok((
            connection,
            HandshakeSlot {
                _permit: handshake,
                sources: self.sources.clone(),
                ip,
            },
        ))
    }
}

/// Serves connections until `shutdown` fires. Each connection runs in its own task.
pub async fn serve(
    listener: TcpListener,
    cfg: Arc<EndpointConfig>,
    shutdown: CancellationToken,
) -> Result<(), CampaignError> {
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    info!(node = %cfg.peer.node, profile = %cfg.peer.profile, listen = %local, limits = ?cfg.limits, "peer endpoint serving");
    let admission = Admission::new(&cfg.limits);
    loop {
        let (stream, addr) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(v) => v,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (connection, slot) = match admission.admit(addr.ip()) {
            Ok(v) => v,
            Err(why) => {
                let n = cfg.stats.rejected.fetch_add(1, Ordering::Relaxed) + 1;
                // One line per hundred: a flood must not flood the log too.
                if n == 1 || n.is_multiple_of(100) {
                    warn!(peer = %addr, reason = why, rejected = n, "connection closed at once");
                }
                drop(stream);
                continue;
            }
        };
        let cfg = cfg.clone();
        let token = shutdown.child_token();
        tokio::spawn(async move {
            let _connection = connection;
            let peer = addr.to_string();
            tokio::select! {
                () = token.cancelled() => debug!(peer = %peer, "connection dropped at shutdown"),
                r = handle(stream, &peer, cfg, slot) => {
                    if let Err(e) = r {
                        warn!(peer = %peer, error = %e, "peer endpoint connection failed");
                    }
                }
            }
        });
    }
    info!(node = %cfg.peer.node, "peer endpoint stopped");
    Ok(())
}

/// A connection past its handshake.
enum Authenticated {
    Rdma {
        ch: Framed<TcpStream, FrameCodec<Message>>,
        initiator: AuthenticatedPeer,
    },
    Control {
        ch: ControlChannel<TcpStream>,
        request: ControlRequest,
        /// The peer node whose pair key the request proved; `None`: the shared token.
        from: Option<String>,
    },
}

async fn handle(
    stream: TcpStream,
    peer: &str,
    cfg: Arc<EndpointConfig>,
    slot: HandshakeSlot,
) -> Result<(), CampaignError> {
    let limit = cfg.limits.handshake_timeout;
    let authenticated = tokio::time::timeout(limit, handshake(stream, peer, &cfg))
        .await
        .map_err(|_| {
            cfg.stats.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
            CampaignError::Timeout {
                peer: peer.to_string(),
                after_ms: limit.as_millis() as u64,
            }
        })??;
    drop(slot);
    match authenticated {
        Authenticated::Rdma { ch, initiator } => serve_rdma(ch, initiator, peer, cfg).await,
        Authenticated::Control { ch, request, from } => {
            serve_control(ch, request, from, peer, &cfg).await
        }
    }
}

/// Reads the protocol tag, then runs that protocol's handshake.
async fn handshake(
    mut stream: TcpStream,
    peer: &str,
    cfg: &EndpointConfig,
) -> Result<Authenticated, CampaignError> {
    let mut magic = [0u8; 4];
    stream
        .read_exact(&mut magic)
        .await
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::UnexpectedEof => CampaignError::Closed {
                peer: peer.to_string(),
            },
            _ => CampaignError::Io {
                peer: peer.to_string(),
                source,
            },
        })?;
    if &magic == RDMA_MAGIC {
        let mut ch = reframe::<&'static Message, _>(stream, FrameCodec::new(RDMA_FORMAT), &magic);
        let initiator = rdma_handshake(&mut ch, peer, &cfg.peer).await?;
        return Ok(Authenticated::Rdma { ch, initiator });
    }
    if &magic == CONTROL_MAGIC {
        let mut ch =
            reframe::<&'static ControlMessage, _>(stream, FrameCodec::new(wire::FORMAT), &magic);
        let (request, from) = control_handshake(&mut ch, peer, cfg).await?;
        return Ok(Authenticated::Control { ch, request, from });
    }
    Err(CampaignError::Protocol {
        peer: peer.to_string(),
        reason: "unknown protocol (neither control channel nor RDMA side channel)".into(),
    })
}

/// A framed stream whose first bytes (the protocol tag) were already read: they go back in
/// front of the codec, which checks them as part of the first frame.
fn reframe<I, C: Encoder<I>>(io: TcpStream, codec: C, tag: &[u8]) -> Framed<TcpStream, C> {
    let mut parts = FramedParts::new::<I>(io, codec);
    parts.read_buf = BytesMut::from(tag);
    Framed::from_parts(parts)
}

/// The responder's side-channel handshake, asynchronously.
async fn rdma_handshake(
    ch: &mut Framed<TcpStream, FrameCodec<Message>>,
    peer: &str,
    cfg: &PeerConfig,
) -> Result<AuthenticatedPeer, RdmaError> {
    let hello = rdma_recv(ch, peer, "hello").await?;
    let (pending, challenge) = answer_hello(cfg, hello, peer)?;
    ch.send(&challenge)
        .await
        .map_err(|e| write_error(peer, "challenge", e))?;
    ch.codec_mut().seal_with(pending.session());
    let auth = rdma_recv(ch, peer, "auth").await?;
    pending.check_auth(auth)
}

async fn rdma_recv(
    ch: &mut Framed<TcpStream, FrameCodec<Message>>,
    peer: &str,
    stage: &'static str,
) -> Result<Message, RdmaError> {
    match ch.next().await {
        Some(msg) => msg.map_err(|e| read_error(peer, stage, e)),
        None => Err(RdmaError::PeerGone {
            peer: peer.to_string(),
            stage,
        }),
    }
}

/// The RDMA test itself is blocking code (verbs calls block): once the initiator is
/// authenticated, it runs on a blocking thread with its own time limits.
async fn serve_rdma(
    ch: Framed<TcpStream, FrameCodec<Message>>,
    initiator: AuthenticatedPeer,
    peer: &str,
    cfg: Arc<EndpointConfig>,
) -> Result<(), CampaignError> {
    let parts = ch.into_parts();
    let std_stream = parts.io.into_std().map_err(|source| CampaignError::Io {
        peer: peer.to_string(),
        source,
    })?;
    let ch = SideChannel::resume(std_stream, parts.codec, parts.read_buf, peer)?;
    let served = tokio::task::spawn_blocking(move || {
        serve_authenticated(ch, initiator, &cfg.peer, cfg.engine.as_ref(), &cfg.locks)
    })
    .await
    .map_err(|e| CampaignError::Protocol {
        peer: peer.to_string(),
        reason: format!("responder task failed: {e}"),
    })??;
    info!(peer = %peer, peer_node = %served.peer_node, rail = %format!("{}:{}", served.hca, served.port), status = ?served.status, "served peer test");
    Ok(())
}

/// The endpoint's control-channel handshake: the request, and whose key it proved.
async fn control_handshake(
    ch: &mut ControlChannel<TcpStream>,
    peer: &str,
    cfg: &EndpointConfig,
) -> Result<(ControlRequest, Option<String>), CampaignError> {
    let (nonce_c, from) = match wire::recv(ch, peer).await? {
        ControlMessage::Hello { nonce, from } => (
            decode_nonce(&nonce).map_err(|reason| protocol(peer, reason))?,
            from,
        ),
        other => return Err(unexpected(peer, "hello", &other)),
    };
    // An endpoint speaking for `from` proves the pair key of its test with us.
    let key = match (&from, &cfg.pair_keys) {
        (None, _) | (Some(_), None) => cfg.token.clone(),
        (Some(node), Some(keys)) => match keys.get(node) {
            Some(k) => k.0.to_vec(),
            None => {
                return Err(CampaignError::Auth {
                    peer: peer.to_string(),
                    reason: format!(
                        "no pair key for node {node}: the coordinator announced no test with it"
                    ),
                })
            }
        },
    };
    let nonce_e = nonce();
    let challenge = ControlMessage::Challenge {
        node: cfg.peer.node.clone(),
        profile: cfg.peer.profile.clone(),
        nonce: hex::encode(nonce_e),
        proof: proof_hex(&key, ROLE_ENDPOINT, &nonce_c, &nonce_e),
    };
    wire::send(ch, &challenge, peer).await?;
    ch.codec_mut().seal_with(Session::new(
        &key,
        SESSION_PROTOCOL,
        &nonce_c,
        &nonce_e,
        ROLE_ENDPOINT,
        ROLE_COORDINATOR,
    ));
    match wire::recv(ch, peer).await? {
        ControlMessage::Request {
            proof,
            request,
            credential,
        } if verify_proof(&key, ROLE_COORDINATOR, &nonce_c, &nonce_e, &proof) => {
            let (request, credential) = unwrap_secrets(ch, peer, request, credential)?;
            if let (None, Some(check)) = (&from, &cfg.coordinator_check) {
                let token = credential.unwrap_or_default();
                check
                    .verify(&cfg.peer.node, &nonce_e, &token)
                    .await
                    .map_err(|reason| CampaignError::Auth {
                        peer: peer.to_string(),
                        reason: format!("not the coordinator ({}): {reason}", check.coordinator),
                    })?;
            }
            Ok((request, from))
        }
        ControlMessage::Request { .. } => Err(CampaignError::Auth {
            peer: peer.to_string(),
            reason: "the requester's proof does not match the key".into(),
        }),
        other => Err(unexpected(peer, "request", &other)),
    }
}

/// The secrets of a request as they arrived, unwrapped with the connection's session.
fn unwrap_secrets(
    ch: &ControlChannel<TcpStream>,
    peer: &str,
    request: ControlRequest,
    credential: Option<String>,
) -> Result<(ControlRequest, Option<String>), CampaignError> {
    let session = ch
        .codec()
        .session()
        .ok_or_else(|| protocol(peer, "request before the session"))?;
    let open = |w: String| session.unwrap(&w).map_err(|reason| protocol(peer, reason));
    Ok((
        request.map_secrets(open)?,
        credential.map(open).transpose()?,
    ))
}

/// `response` with its secrets wrapped for the connection.
fn wrap_response(ch: &ControlChannel<TcpStream>, response: ControlResponse) -> ControlResponse {
    match ch.codec().session() {
        Some(session) => {
            match response.map_secrets(|s| Ok::<_, std::convert::Infallible>(session.wrap(&s))) {
                Ok(r) => r,
                Err(never) => match never {},
            }
        }
        // Never: responses follow a sealed request. Nothing secret leaves in the clear.
        None => ControlResponse::Refused {
            reason: "no session".into(),
        },
    }
}

async fn serve_control(
    mut ch: ControlChannel<TcpStream>,
    request: ControlRequest,
    from: Option<String>,
    peer: &str,
    cfg: &EndpointConfig,
) -> Result<(), CampaignError> {
    let t = cfg.io_timeout;
    let response = match (request, &from) {
        // A peer endpoint may only join the NCCL test the coordinator paired it for.
        (ControlRequest::JoinNccl(req), _) => {
            if let (Some(node), true) = (&from, cfg.pair_keys.is_some()) {
                if &req.test.peer_node != node {
                    return Err(protocol(
                        peer,
                        format!("{node} asked to join a test of {}", req.test.peer_node),
                    ));
                }
            }
            // The rank-0 endpoint hangs up when its side is over: stop ours with it.
            tokio::select! {
                r = join_nccl(cfg, req) => r,
                _ = wire::recv(&mut ch, peer) => {
                    info!(node = %cfg.peer.node, peer = %peer, "NCCL pair test cancelled by the rank-0 side");
                    return Ok(());
                }
            }
        }
        (_, Some(node)) if cfg.pair_keys.is_some() => {
            return Err(protocol(
                peer,
                format!("{node}'s pair key only lets it join an NCCL test"),
            ))
        }
        (ControlRequest::Status, _) => ControlResponse::Status {
            node: cfg.peer.node.clone(),
            profile: cfg.peer.profile.clone(),
            devices: cfg.engine.devices().unwrap_or_default(),
            gpu_pods: cfg.gpu_pods.gpu_pods().await.unwrap_or_default(),
        },
        (ControlRequest::RunTest(req), _) => run_test(cfg, req).await,
        (ControlRequest::RunNccl(req), _) => run_nccl(cfg, req).await,
        (ControlRequest::Identify, _) => identify(cfg),
        (ControlRequest::AcceptPeer(req), _) => accept_peer(cfg, req),
    };
    let response = wrap_response(&ch, response);
    step(
        t,
        peer,
        wire::send(&mut ch, &ControlMessage::Response { response }, peer),
    )
    .await
}

/// This pod's service-account token, for the coordinator's check of which node it runs on.
fn identify(cfg: &EndpointConfig) -> ControlResponse {
    let Some(path) = &cfg.identity_token_file else {
        return ControlResponse::Refused {
            reason: "this endpoint has no identity token (--identity-token-file)".into(),
        };
    };
    // Read each time: the kubelet rotates the projected token.
    match std::fs::read_to_string(path) {
        Ok(token) => ControlResponse::Identity {
            node: cfg.peer.node.clone(),
            token: token.trim().to_string(),
        },
        Err(e) => ControlResponse::Refused {
            reason: format!("cannot read the identity token {}: {e}", path.display()),
        },
    }
}

/// Accepts tests from one peer node with the coordinator's pair key.
fn accept_peer(cfg: &EndpointConfig, req: AcceptPeerRequest) -> ControlResponse {
    let Some(keys) = &cfg.pair_keys else {
        return ControlResponse::Refused {
            reason: "this endpoint takes no pair keys (shared-token mode)".into(),
        };
    };
    if req.peer_node == cfg.peer.node {
        return ControlResponse::Refused {
            reason: "a node cannot test against itself".into(),
        };
    }
    match PairKey::from_hex(&req.pair_key) {
        Ok(key) => {
            let ttl = Duration::from_millis(req.ttl_ms).min(MAX_PAIR_KEY_TTL);
            keys.insert(&req.peer_node, key, ttl);
            ControlResponse::PeerAccepted {
                peer_node: req.peer_node,
            }
        }
        Err(reason) => ControlResponse::Refused {
            reason: reason.into(),
        },
    }
}

/// Whether this node takes a test of `profile` with `peer_node` on `rails` now: the reason
/// it refuses, if not.
async fn admit(
    cfg: &EndpointConfig,
    profile: &str,
    peer_node: &str,
    rails: &[RailRef],
    allow_gpu_pods: bool,
) -> Result<(), String> {
    if profile != cfg.peer.profile {
        return Err(format!(
            "this node is on profile {}, the campaign runs {profile}",
            cfg.peer.profile
        ));
    }
    if peer_node == cfg.peer.node {
        return Err("a node cannot test against itself".into());
    }
    if rails.is_empty() || rails.len() > MAX_RAILS_PER_REQUEST {
        return Err(format!(
            "a test names 1..={MAX_RAILS_PER_REQUEST} rails, got {}",
            rails.len()
        ));
    }
    if !allow_gpu_pods {
        match cfg.gpu_pods.gpu_pods().await {
            Ok(pods) if !pods.is_empty() => {
                return Err(format!("GPU pods run on this node: {}", pods.join(", ")))
            }
            Ok(_) => {}
            Err(e) => return Err(format!("cannot tell whether GPU pods run here: {e}")),
        }
    }
    Ok(())
}

/// The refusal of a request [`admit`] refuses, logged; `None` when it is admitted.
/// What an endpoint checks before it runs a pair test of either kind: the profile, the
/// peer, the rails the test holds and whether GPU pods may be on the node.
#[derive(Debug, Clone, Copy)]
struct TestScope<'a> {
    profile: &'a str,
    peer_node: &'a str,
    rails: &'a [RailRef],
    allow_gpu_pods: bool,
}

impl<'a> TestScope<'a> {
    fn new(
        profile: &'a str,
        peer_node: &'a str,
        rails: &'a [RailRef],
        allow_gpu_pods: bool,
    ) -> Self {
        TestScope {
            profile,
            peer_node,
            rails,
            allow_gpu_pods,
        }
    }
}

async fn refusal_of(cfg: &EndpointConfig, test: TestScope<'_>) -> Option<ControlResponse> {
    let reason = admit(
        cfg,
        test.profile,
        test.peer_node,
        test.rails,
        test.allow_gpu_pods,
    )
    .await
    .err()?;
    Some(refusal(cfg, test.peer_node, reason))
}

fn refusal(cfg: &EndpointConfig, peer_node: &str, reason: String) -> ControlResponse {
    info!(node = %cfg.peer.node, peer_node = %peer_node, reason = %reason, "refused test");
    ControlResponse::Refused { reason }
}

/// Checks a test request against this node, then runs every rail at once.
async fn run_test(cfg: &EndpointConfig, req: RunTestRequest) -> ControlResponse {
    let scope = TestScope::new(&req.profile, &req.peer_node, &req.rails, req.allow_gpu_pods);
    if let Some(refused) = refusal_of(cfg, scope).await {
        return refused;
    }
    let timeout = Duration::from_millis(req.timeout_ms.max(1));
    let deadline = tokio::time::Instant::now() + timeout;
    let base = match (&req.pair_key, &cfg.pair_keys) {
        (Some(hex_key), _) => match PairKey::from_hex(hex_key) {
            Ok(key) => cfg.peer.for_pair(&key),
            Err(reason) => return refusal(cfg, &req.peer_node, reason.into()),
        },
        (None, Some(_)) => {
            return refusal(
                cfg,
                &req.peer_node,
                "this endpoint runs tests only with a pair key from the coordinator".into(),
            )
        }
        (None, None) => cfg.peer.clone(),
    };
    let mut tasks = Vec::with_capacity(req.rails.len());
    for rail in &req.rails {
        let test = PeerTestRequest {
            hca: rail.hca.clone(),
            port: rail.port,
            local_memory: req.memory,
            remote_memory: req.memory,
            sizes: req.sizes.clone(),
            iterations: req.iterations,
            expect_node: Some(req.peer_node.clone()),
            class: req.class,
        };
        let mut peer_cfg = base.clone();
        peer_cfg.test_timeout = peer_cfg.test_timeout.min(timeout);
        let engine = cfg.engine.clone();
        let locks = cfg.locks.clone();
        let addr = req.peer_addr.clone();
        tasks.push(tokio::task::spawn_blocking(move || {
            run_write_test_initiator(&addr, &peer_cfg, engine.as_ref(), &locks, &test)
        }));
    }
    let mut rails = Vec::with_capacity(tasks.len());
    for (rail, task) in req.rails.iter().zip(tasks) {
        // A blocking test cannot be interrupted; past the deadline we stop waiting for it
        // (it keeps its rail locked until its own RDMA time limits end it). A test that did
        // not finish in time says nothing about the rail: this side or the peer may be
        // saturated.
        let report = match tokio::time::timeout_at(deadline, task).await {
            Err(_) => RailReport::Inconclusive {
                reason: format!(
                    "no result within {} ms (this endpoint or the peer is saturated or slow; \
                     no evidence against the rail)",
                    timeout.as_millis()
                ),
            },
            Ok(Err(e)) => RailReport::Inconclusive {
                reason: format!("test task failed: {e}"),
            },
            Ok(Ok(Ok(outcome))) => RailReport::Measured {
                bw_gbps: outcome.result.peak_bw_gbps,
                latency_us: outcome.result.small_msg_latency_us,
            },
            Ok(Ok(Err(e))) => classify(&e),
        };
        rails.push(RailTestReport {
            rail: rail.clone(),
            report,
        });
    }
    info!(node = %cfg.peer.node, peer_node = %req.peer_node, rails = rails.len(), "ran test");
    ControlResponse::TestResult {
        node: cfg.peer.node.clone(),
        peer_node: req.peer_node.clone(),
        rails,
    }
}

/// Takes every rail of an NCCL test (a pair test holds all rails it uses), or says which is
/// busy.
fn lock_rails(cfg: &EndpointConfig, rails: &[RailRef]) -> Result<Vec<RailGuard>, String> {
    rails
        .iter()
        .map(|r| cfg.locks.try_acquire(&r.hca, r.port))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

fn nccl_result(cfg: &EndpointConfig, peer_node: &str, sides: Vec<NcclSide>) -> ControlResponse {
    let nodes = [cfg.peer.node.clone(), peer_node.to_string()];
    ControlResponse::NcclResult {
        node: cfg.peer.node.clone(),
        peer_node: peer_node.to_string(),
        sides: nodes
            .into_iter()
            .zip(sides)
            .map(|(node, side)| NcclSideReport { node, side })
            .collect(),
    }
}

/// The rank-0 side of an NCCL pair test: starts this node's ranks, sends their unique id to
/// the peer's endpoint and waits for both sides. When one side fails first, the other is
/// stopped (its ranks would wait for the missing ones until the time limit).
async fn run_nccl(cfg: &EndpointConfig, req: NcclTestRequest) -> ControlResponse {
    let scope = TestScope::new(&req.profile, &req.peer_node, &req.rails, req.allow_gpu_pods);
    if let Some(refused) = refusal_of(cfg, scope).await {
        return refused;
    }
    let untested = |why: &str| NcclSide::Inconclusive {
        reason: format!("not started: {why}"),
    };
    let Some(runner) = &cfg.nccl else {
        let side = NcclSide::NotMeasured {
            reason: "this endpoint runs no NCCL pair tests (no NCCL runner configured)".into(),
        };
        return nccl_result(
            cfg,
            &req.peer_node,
            vec![side, untested("this side cannot")],
        );
    };
    let _held = match lock_rails(cfg, &req.rails) {
        Ok(g) => g,
        Err(reason) => return refusal(cfg, &req.peer_node, reason),
    };
    let limit = Duration::from_millis(req.timeout_ms.max(1));
    let deadline = tokio::time::Instant::now() + limit;
    let mut child = match runner.start(&req, None).await {
        Ok(c) => c,
        Err(side) => {
            return nccl_result(
                cfg,
                &req.peer_node,
                vec![side, untested("this side failed")],
            )
        }
    };
    let (unique_id, nranks, local_ranks) = match child.next_line(limit).await {
        Ok(Some(railguard_prober::nccl::ranks::RanksLine::UniqueId {
            id,
            nranks,
            local_ranks,
        })) => (id, nranks, local_ranks),
        Ok(Some(other)) => {
            child.stop().await;
            let side = super::nccl_pair::side_of(other);
            return nccl_result(
                cfg,
                &req.peer_node,
                vec![side, untested("this side failed")],
            );
        }
        Ok(None) => {
            let side = child.finish(limit).await;
            return nccl_result(
                cfg,
                &req.peer_node,
                vec![side, untested("this side failed")],
            );
        }
        Err(side) => {
            child.stop().await;
            return nccl_result(
                cfg,
                &req.peer_node,
                vec![side, untested("this side failed")],
            );
        }
    };
    // The unique id travels under the pair key when the coordinator gave one (the peer
    // checks it is us), else under the shared token.
    let (key, from) = match &req.pair_key {
        Some(hex_key) => match PairKey::from_hex(hex_key) {
            Ok(k) => (k.0.to_vec(), Some(cfg.peer.node.as_str())),
            Err(reason) => return refusal(cfg, &req.peer_node, reason.into()),
        },
        None if cfg.pair_keys.is_some() => {
            return refusal(
                cfg,
                &req.peer_node,
                "this endpoint runs tests only with a pair key from the coordinator".into(),
            )
        }
        None => (cfg.token.clone(), None),
    };
    let join = ControlRequest::JoinNccl(NcclJoinRequest {
        test: NcclTestRequest {
            peer_node: cfg.peer.node.clone(),
            peer_addr: String::new(),
            pair_key: None,
            ..req.clone()
        },
        unique_id,
        nranks,
        first_rank: local_ranks,
    });
    let peer_node = req.peer_node.clone();
    let peer = async {
        let speaker = Speaker {
            key: &key,
            from,
            identity: None,
        };
        let answer = request_as(
            &req.peer_addr,
            speaker,
            &join,
            Some(&peer_node),
            cfg.io_timeout,
            limit + cfg.io_timeout,
        )
        .await;
        peer_side(&peer_node, answer)
    };
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let own = child.finish(left);
    tokio::pin!(own, peer);
    let sides = tokio::select! {
        mine = &mut own => {
            let theirs = if matches!(mine, NcclSide::Measured { .. }) {
                peer.await
            } else {
                // Dropping the request hangs up on the peer, which stops its ranks.
                NcclSide::Inconclusive { reason: format!("stopped: {} failed first", cfg.peer.node) }
            };
            vec![mine, theirs]
        }
        theirs = &mut peer => {
            let mine = if matches!(theirs, NcclSide::Measured { .. }) {
                own.await
            } else {
                // Dropping the child's future kills it (kill_on_drop).
                NcclSide::Inconclusive { reason: format!("stopped: {peer_node} failed first") }
            };
            vec![mine, theirs]
        }
    };
    info!(node = %cfg.peer.node, peer_node = %req.peer_node, rails = req.rails.len(), "ran NCCL pair test");
    nccl_result(cfg, &req.peer_node, sides)
}

/// The peer's side from its endpoint's answer.
fn peer_side(peer_node: &str, answer: Result<ControlResponse, CampaignError>) -> NcclSide {
    match answer {
        Ok(ControlResponse::NcclResult { mut sides, .. }) if !sides.is_empty() => {
            sides.swap_remove(0).side
        }
        Ok(ControlResponse::Refused { reason }) => NcclSide::Inconclusive {
            reason: format!("{peer_node} refused: {reason}"),
        },
        Ok(_) => NcclSide::Inconclusive {
            reason: format!("{peer_node} answered the NCCL join with something else"),
        },
        Err(e) => NcclSide::Inconclusive {
            reason: format!("{peer_node}: {e}"),
        },
    }
}

/// The second side of an NCCL pair test: joins the rank-0 node's communicator.
async fn join_nccl(cfg: &EndpointConfig, req: NcclJoinRequest) -> ControlResponse {
    let t = &req.test;
    if let Err(reason) = admit(cfg, &t.profile, &t.peer_node, &t.rails, t.allow_gpu_pods).await {
        return refusal(cfg, &t.peer_node, reason);
    }
    let Some(runner) = &cfg.nccl else {
        let side = NcclSide::NotMeasured {
            reason: "this endpoint runs no NCCL pair tests (no NCCL runner configured)".into(),
        };
        return nccl_result(cfg, &t.peer_node, vec![side]);
    };
    let _held = match lock_rails(cfg, &t.rails) {
        Ok(g) => g,
        Err(reason) => return refusal(cfg, &t.peer_node, reason),
    };
    let limit = Duration::from_millis(t.timeout_ms.max(1));
    let side = match runner.start(t, Some(&req)).await {
        Ok(child) => child.finish(limit).await,
        Err(side) => side,
    };
    nccl_result(cfg, &t.peer_node, vec![side])
}

/// Whether an RDMA error is evidence against the rail/wire, or no evidence at all.
pub fn classify(e: &RdmaError) -> RailReport {
    let reason = e.to_string();
    match e {
        RdmaError::WorkCompletion { .. }
        | RdmaError::Timeout { .. }
        | RdmaError::PeerUnreachable { .. }
        | RdmaError::PortNotActive { .. }
        | RdmaError::DeviceNotFound { .. }
        | RdmaError::NoDevices
        | RdmaError::GpuMemoryUnavailable { .. }
        | RdmaError::Verbs { .. } => RailReport::Failed { reason },
        // Closed before it authenticated: a peer at its connection cap closes at once.
        RdmaError::PeerGone {
            stage: "hello" | "challenge",
            ..
        } => RailReport::Inconclusive {
            reason: format!(
                "{reason} (before authenticating: the peer endpoint may be saturated or \
                 restarting; no evidence against the rail)"
            ),
        },
        RdmaError::PeerTimeout { .. } => RailReport::Inconclusive {
            reason: format!("{reason} (the side channel, not the rail: no evidence against it)"),
        },
        RdmaError::PeerGone { .. }
        | RdmaError::PeerIo { .. }
        | RdmaError::PeerAuth { .. }
        | RdmaError::PeerProtocol { .. }
        | RdmaError::PeerRefused { .. }
        | RdmaError::Busy { .. }
        | RdmaError::NodeBusy { .. }
        | RdmaError::InvalidRequest { .. } => RailReport::Inconclusive { reason },
        // A kind this match does not know yet proves nothing about the wire.
        #[allow(unreachable_patterns)]
        _ => RailReport::Inconclusive { reason },
    }
}

async fn step<T>(
    t: Duration,
    peer: &str,
    fut: impl std::future::Future<Output = Result<T, CampaignError>>,
) -> Result<T, CampaignError> {
    tokio::time::timeout(t, fut)
        .await
        .map_err(|_| CampaignError::Timeout {
            peer: peer.to_string(),
            after_ms: t.as_millis() as u64,
        })?
}

fn unexpected(peer: &str, stage: &str, msg: &ControlMessage) -> CampaignError {
    let reason = match msg {
        ControlMessage::Error { reason } => format!("peer reported during {stage}: {reason}"),
        other => format!(
            "unexpected {} during {stage}",
            serde_json::to_value(other)
                .ok()
                .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(String::from))
                .unwrap_or_else(|| "message".into())
        ),
    };
    protocol(peer, reason)
}

fn protocol(peer: &str, reason: impl Into<String>) -> CampaignError {
    CampaignError::Protocol {
        peer: peer.to_string(),
        reason: reason.into(),
    }
}

/// Who opens a control connection, and how it proves it.
#[derive(Clone, Copy)]
pub struct Speaker<'a> {
    /// The shared token (the coordinator) or a pair key (an endpoint).
    pub key: &'a [u8],
    /// An endpoint speaking for its node with the pair key of a test with the peer.
    pub from: Option<&'a str>,
    /// The coordinator's account, when endpoints check who the coordinator is.
    pub identity: Option<&'a CoordinatorIdentity>,
}

impl<'a> Speaker<'a> {
    /// The coordinator, known by the shared token alone.
    pub fn coordinator(token: &'a [u8]) -> Self {
        Speaker {
            key: token,
            from: None,
            identity: None,
        }
    }
}

/// The coordinator's side: one authenticated request to the endpoint at `addr`.
pub async fn request(
    addr: &str,
    token: &[u8],
    req: &ControlRequest,
    expect_node: Option<&str>,
    io_timeout: Duration,
    answer_timeout: Duration,
) -> Result<ControlResponse, CampaignError> {
    request_as(
        addr,
        Speaker::coordinator(token),
        req,
        expect_node,
        io_timeout,
        answer_timeout,
    )
    .await
}

/// One authenticated request by `speaker`.
pub async fn request_as(
    addr: &str,
    speaker: Speaker<'_>,
    req: &ControlRequest,
    expect_node: Option<&str>,
    io_timeout: Duration,
    answer_timeout: Duration,
) -> Result<ControlResponse, CampaignError> {
    let Speaker {
        key,
        from,
        identity,
    } = speaker;
    let key = trim_token(key);
    // A connect that does not complete is a node that cannot be reached.
    let stream = tokio::time::timeout(io_timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| CampaignError::Unreachable {
            peer: addr.to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connect timed out after {} ms", io_timeout.as_millis()),
            ),
        })?
        .map_err(|source| CampaignError::Unreachable {
            peer: addr.to_string(),
            source,
        })?;
    let _ = stream.set_nodelay(true);
    let mut ch = wire::control_channel(stream);
    let nonce_c = nonce();
    let hello = ControlMessage::Hello {
        nonce: hex::encode(nonce_c),
        from: from.map(String::from),
    };
    step(io_timeout, addr, wire::send(&mut ch, &hello, addr)).await?;
    let (node, nonce_e) = match step(io_timeout, addr, wire::recv(&mut ch, addr)).await? {
        ControlMessage::Challenge {
            node,
            profile: _,
            nonce,
            proof,
        } => {
            let nonce_e = decode_nonce(&nonce).map_err(|reason| protocol(addr, reason))?;
            if !verify_proof(key, ROLE_ENDPOINT, &nonce_c, &nonce_e, &proof) {
                return Err(CampaignError::Auth {
                    peer: addr.to_string(),
                    reason: "endpoint's proof does not match the key".into(),
                });
            }
            if let Some(expect) = expect_node {
                if expect != node {
                    return Err(protocol(
                        addr,
                        format!("endpoint identifies as node {node}, expected {expect}"),
                    ));
                }
            }
            (node, nonce_e)
        }
        other => return Err(unexpected(addr, "challenge", &other)),
    };
    ch.codec_mut().seal_with(Session::new(
        key,
        SESSION_PROTOCOL,
        &nonce_c,
        &nonce_e,
        ROLE_COORDINATOR,
        ROLE_ENDPOINT,
    ));
    let credential = match (identity, from) {
        (Some(identity), None) => Some(identity.token_for(&node, &nonce_e).await?),
        _ => None,
    };
    let (request, credential) = {
        let session = ch
            .codec()
            .session()
            .ok_or_else(|| protocol(addr, "no session after the challenge"))?;
        let wrap = |s: String| Ok::<_, CampaignError>(session.wrap(&s));
        (
            req.clone().map_secrets(wrap)?,
            credential.map(wrap).transpose()?,
        )
    };
    let msg = ControlMessage::Request {
        proof: proof_hex(key, ROLE_COORDINATOR, &nonce_c, &nonce_e),
        request,
        credential,
    };
    step(io_timeout, addr, wire::send(&mut ch, &msg, addr)).await?;
    match step(answer_timeout, addr, wire::recv(&mut ch, addr)).await? {
        ControlMessage::Response { response } => {
            let session = ch
                .codec()
                .session()
                .ok_or_else(|| protocol(addr, "no session after the challenge"))?;
            response.map_secrets(|w| session.unwrap(&w).map_err(|reason| protocol(addr, reason)))
        }
        ControlMessage::Error { reason } if reason.contains("authentication") => {
            Err(CampaignError::Auth {
                peer: addr.to_string(),
                reason,
            })
        }
        other => Err(unexpected(addr, "response", &other)),
    }
}
