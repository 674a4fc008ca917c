//! The peer endpoint a prober runs for campaigns: one TCP port for the coordinator's control
//! channel ([`super::wire`]) and the RDMA side channel of other probers
//! ([`crate::rdma::peer`]); the first four bytes of a connection pick the protocol.
//!
//! Rules: the coordinator must prove the shared token; a test for another profile is refused;
//! one test per rail at a time (a second one is refused as busy, never queued, through the
//! shared [`RailLocks`] of the RDMA side channel); no test while GPU pods run on the node
//! unless the request asks for it; every wait has a time limit.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::kube::GpuPodSource;
use super::nccl_pair::NcclRunner;
use super::wire::{
    self, ControlMessage, ControlRequest, ControlResponse, NcclJoinRequest, NcclSide,
    NcclSideReport, NcclTestRequest, RailRef, RailReport, RailTestReport, RunTestRequest,
    CONTROL_MAGIC, ROLE_COORDINATOR, ROLE_ENDPOINT,
};
use super::CampaignError;
use crate::rdma::peer::channel::{decode_nonce, nonce, proof_hex, trim_token, verify_proof};
use crate::rdma::peer::RailGuard;
use crate::rdma::peer::{run_write_test_initiator, run_write_test_responder, MAGIC as RDMA_MAGIC};
use crate::rdma::{PeerConfig, PeerRdmaEngine, PeerTestRequest, RailLocks, RdmaError};

/// Most rails one request may name (a node has at most a few dozen HCA ports).
pub const MAX_RAILS_PER_REQUEST: usize = 64;

/// Everything an endpoint needs.
pub struct EndpointConfig {
    /// Side-channel identity (node, profile, token, RDMA time limits).
    pub peer: PeerConfig,
    token: Vec<u8>,
    pub engine: Arc<dyn PeerRdmaEngine>,
    pub locks: RailLocks,
    pub gpu_pods: GpuPodSource,
    /// Limit for one control-channel step.
    pub io_timeout: Duration,
    /// How NCCL pair tests start this node's ranks; `None`: they are not measured here.
    pub nccl: Option<NcclRunner>,
}

impl std::fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("peer", &self.peer)
            .field("io_timeout", &self.io_timeout)
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
            nccl: None,
        }
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
    info!(node = %cfg.peer.node, profile = %cfg.peer.profile, listen = %local, "peer endpoint serving");
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
        let cfg = cfg.clone();
        let token = shutdown.child_token();
        tokio::spawn(async move {
            let peer = addr.to_string();
            tokio::select! {
                () = token.cancelled() => debug!(peer = %peer, "connection dropped at shutdown"),
                r = handle(stream, &peer, cfg) => {
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

async fn handle(
    stream: TcpStream,
    peer: &str,
    cfg: Arc<EndpointConfig>,
) -> Result<(), CampaignError> {
    let mut magic = [0u8; 4];
    // Wait for the first four bytes without consuming them.
    let peeked = tokio::time::timeout(cfg.io_timeout, async {
        loop {
            match stream.peek(&mut magic).await {
                Ok(n) if n >= 4 => return Ok(()),
                Ok(0) => {
                    return Err(CampaignError::Closed {
                        peer: peer.to_string(),
                    })
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(source) => {
                    return Err(CampaignError::Io {
                        peer: peer.to_string(),
                        source,
                    })
                }
            }
        }
    })
    .await
    .map_err(|_| CampaignError::Timeout {
        peer: peer.to_string(),
        after_ms: cfg.io_timeout.as_millis() as u64,
    })?;
    peeked?;
    if &magic == RDMA_MAGIC {
        return serve_rdma(stream, peer, cfg).await;
    }
    if &magic == CONTROL_MAGIC {
        return serve_control(stream, peer, &cfg).await;
    }
    Err(CampaignError::Protocol {
        peer: peer.to_string(),
        reason: "unknown protocol (neither control channel nor RDMA side channel)".into(),
    })
}

/// The RDMA side channel is blocking code (verbs calls block): it runs on a blocking thread
/// with its own time limits.
async fn serve_rdma(
    stream: TcpStream,
    peer: &str,
    cfg: Arc<EndpointConfig>,
) -> Result<(), CampaignError> {
    let std_stream = stream.into_std().map_err(|source| CampaignError::Io {
        peer: peer.to_string(),
        source,
    })?;
    std_stream
        .set_nonblocking(false)
        .map_err(|source| CampaignError::Io {
            peer: peer.to_string(),
            source,
        })?;
    let served = tokio::task::spawn_blocking(move || {
        run_write_test_responder(std_stream, &cfg.peer, cfg.engine.as_ref(), &cfg.locks)
    })
    .await
    .map_err(|e| CampaignError::Protocol {
        peer: peer.to_string(),
        reason: format!("responder task failed: {e}"),
    })??;
    info!(peer = %peer, peer_node = %served.peer_node, rail = %format!("{}:{}", served.hca, served.port), status = ?served.status, "served peer test");
    Ok(())
}

async fn serve_control(
    stream: TcpStream,
    peer: &str,
    cfg: &EndpointConfig,
) -> Result<(), CampaignError> {
    let t = cfg.io_timeout;
    let mut ch = wire::control_channel(stream);
    let nonce_c = match step(t, peer, wire::recv(&mut ch, peer)).await? {
        ControlMessage::Hello { nonce } => {
            decode_nonce(&nonce).map_err(|reason| protocol(peer, reason))?
        }
        other => return Err(unexpected(peer, "hello", &other)),
    };
    let nonce_e = nonce();
    let challenge = ControlMessage::Challenge {
        node: cfg.peer.node.clone(),
        profile: cfg.peer.profile.clone(),
        nonce: hex::encode(nonce_e),
        proof: proof_hex(&cfg.token, ROLE_ENDPOINT, &nonce_c, &nonce_e),
    };
    step(t, peer, wire::send(&mut ch, &challenge, peer)).await?;
    let request = match step(t, peer, wire::recv(&mut ch, peer)).await? {
        ControlMessage::Request { proof, request } => {
            if !verify_proof(&cfg.token, ROLE_COORDINATOR, &nonce_c, &nonce_e, &proof) {
                let refusal = ControlMessage::Error {
                    reason: "authentication failed".into(),
                };
                let _ = step(t, peer, wire::send(&mut ch, &refusal, peer)).await;
                return Err(CampaignError::Auth {
                    peer: peer.to_string(),
                    reason: "coordinator's proof does not match the shared token".into(),
                });
            }
            request
        }
        other => return Err(unexpected(peer, "request", &other)),
    };
    let response = match request {
        ControlRequest::Status => ControlResponse::Status {
            node: cfg.peer.node.clone(),
            profile: cfg.peer.profile.clone(),
            devices: cfg.engine.devices().unwrap_or_default(),
            gpu_pods: cfg.gpu_pods.gpu_pods().await.unwrap_or_default(),
        },
        ControlRequest::RunTest(req) => run_test(cfg, req).await,
        ControlRequest::RunNccl(req) => run_nccl(cfg, req).await,
        ControlRequest::JoinNccl(req) => {
            // The rank-0 endpoint hangs up when its side is over: stop ours with it.
            tokio::select! {
                r = join_nccl(cfg, req) => r,
                _ = wire::recv(&mut ch, peer) => {
                    info!(node = %cfg.peer.node, peer = %peer, "NCCL pair test cancelled by the rank-0 side");
                    return Ok(());
                }
            }
        }
    };
    step(
        t,
        peer,
        wire::send(&mut ch, &ControlMessage::Response { response }, peer),
    )
    .await
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

fn refusal(cfg: &EndpointConfig, peer_node: &str, reason: String) -> ControlResponse {
    info!(node = %cfg.peer.node, peer_node = %peer_node, reason = %reason, "refused test");
    ControlResponse::Refused { reason }
}

/// Checks a test request against this node, then runs every rail at once.
async fn run_test(cfg: &EndpointConfig, req: RunTestRequest) -> ControlResponse {
    if let Err(reason) = admit(
        cfg,
        &req.profile,
        &req.peer_node,
        &req.rails,
        req.allow_gpu_pods,
    )
    .await
    {
        return refusal(cfg, &req.peer_node, reason);
    }
    let timeout = Duration::from_millis(req.timeout_ms.max(1));
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
        };
        let mut peer_cfg = cfg.peer.clone();
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
        // (it keeps its rail locked until its own RDMA time limits end it).
        let report = match tokio::time::timeout(timeout, task).await {
            Err(_) => RailReport::Failed {
                reason: format!("no result within {} ms", timeout.as_millis()),
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
    if let Err(reason) = admit(
        cfg,
        &req.profile,
        &req.peer_node,
        &req.rails,
        req.allow_gpu_pods,
    )
    .await
    {
        return refusal(cfg, &req.peer_node, reason);
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
        Ok(Some(crate::nccl::ranks::RanksLine::UniqueId {
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
    let join = ControlRequest::JoinNccl(NcclJoinRequest {
        test: NcclTestRequest {
            peer_node: cfg.peer.node.clone(),
            peer_addr: String::new(),
            ..req.clone()
        },
        unique_id,
        nranks,
        first_rank: local_ranks,
    });
    let peer_node = req.peer_node.clone();
    let peer = async {
        let answer = request(
            &req.peer_addr,
            &cfg.token,
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
        RdmaError::PeerGone { .. }
        | RdmaError::PeerIo { .. }
        | RdmaError::PeerAuth { .. }
        | RdmaError::PeerProtocol { .. }
        | RdmaError::PeerRefused { .. }
        | RdmaError::Busy { .. }
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

/// The coordinator's side: one authenticated request to the endpoint at `addr`.
pub async fn request(
    addr: &str,
    token: &[u8],
    req: &ControlRequest,
    expect_node: Option<&str>,
    io_timeout: Duration,
    answer_timeout: Duration,
) -> Result<ControlResponse, CampaignError> {
    let token = trim_token(token);
    let stream = tokio::time::timeout(io_timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| CampaignError::Timeout {
            peer: addr.to_string(),
            after_ms: io_timeout.as_millis() as u64,
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
    };
    step(io_timeout, addr, wire::send(&mut ch, &hello, addr)).await?;
    let nonce_e = match step(io_timeout, addr, wire::recv(&mut ch, addr)).await? {
        ControlMessage::Challenge {
            node,
            profile: _,
            nonce,
            proof,
        } => {
            let nonce_e = decode_nonce(&nonce).map_err(|reason| protocol(addr, reason))?;
            if !verify_proof(token, ROLE_ENDPOINT, &nonce_c, &nonce_e, &proof) {
                return Err(CampaignError::Auth {
                    peer: addr.to_string(),
                    reason: "endpoint's proof does not match the shared token".into(),
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
            nonce_e
        }
        other => return Err(unexpected(addr, "challenge", &other)),
    };
    let msg = ControlMessage::Request {
        proof: proof_hex(token, ROLE_COORDINATOR, &nonce_c, &nonce_e),
        request: req.clone(),
    };
    step(io_timeout, addr, wire::send(&mut ch, &msg, addr)).await?;
    match step(answer_timeout, addr, wire::recv(&mut ch, addr)).await? {
        ControlMessage::Response { response } => Ok(response),
        ControlMessage::Error { reason } if reason.contains("authentication") => {
            Err(CampaignError::Auth {
                peer: addr.to_string(),
                reason,
            })
        }
        other => Err(unexpected(addr, "response", &other)),
    }
}
