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
use super::wire::{
    self, ControlMessage, ControlRequest, ControlResponse, RailReport, RailTestReport,
    RunTestRequest, CONTROL_MAGIC, ROLE_COORDINATOR, ROLE_ENDPOINT,
};
use super::CampaignError;
use crate::rdma::peer::channel::{decode_nonce, nonce, proof_hex, trim_token, verify_proof};
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
    };
    step(
        t,
        peer,
        wire::send(&mut ch, &ControlMessage::Response { response }, peer),
    )
    .await
}

/// Checks a test request against this node, then runs every rail at once.
async fn run_test(cfg: &EndpointConfig, req: RunTestRequest) -> ControlResponse {
    let refuse = |reason: String| {
        info!(node = %cfg.peer.node, peer_node = %req.peer_node, reason = %reason, "refused test");
        ControlResponse::Refused { reason }
    };
    if req.profile != cfg.peer.profile {
        return refuse(format!(
            "this node is on profile {}, the campaign runs {}",
            cfg.peer.profile, req.profile
        ));
    }
    if req.peer_node == cfg.peer.node {
        return refuse("a node cannot test against itself".into());
    }
    if req.rails.is_empty() || req.rails.len() > MAX_RAILS_PER_REQUEST {
        return refuse(format!(
            "a test names 1..={MAX_RAILS_PER_REQUEST} rails, got {}",
            req.rails.len()
        ));
    }
    if !req.allow_gpu_pods {
        match cfg.gpu_pods.gpu_pods().await {
            Ok(pods) if !pods.is_empty() => {
                return refuse(format!("GPU pods run on this node: {}", pods.join(", ")))
            }
            Ok(_) => {}
            Err(e) => return refuse(format!("cannot tell whether GPU pods run here: {e}")),
        }
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
