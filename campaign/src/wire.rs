//! The coordinator's control channel to a peer endpoint.
//!
//! It shares the endpoint's TCP port with the RDMA side channel ([`railguard_prober::rdma::peer`]) and
//! speaks the same authenticated framing ([`railguard_prober::rdma::peer::channel`]); the frame tag tells them apart
//! (`RGCT` here, `RGRP` there). Each frame carries a JSON [`ControlMessage`] of at most
//! [`MAX_FRAME_BYTES`].
//!
//! Authentication never sends the key: the two sides exchange nonces and prove knowledge of
//! it with HMAC-SHA256 over both nonces and their role
//! ([`railguard_prober::rdma::peer::channel::proof`]); proofs are checked in constant time. Version 2
//! seals every frame after the challenge with the connection's session key
//! ([`railguard_prober::rdma::peer::channel::Session`]): in version 1 the proof covered the nonces but
//! not the request travelling next to it, so anyone on the path could swap the request.
//!
//! Sealed frames are authenticated, not encrypted; the secrets they carry (pair keys, tokens)
//! are wrapped under the session key ([`ControlRequest::map_secrets`]).
//!
//! The key is the shared token when the coordinator speaks. When one endpoint speaks to
//! another (the NCCL unique id of a pair test), the hello names the sending node (`from`) and
//! the key is the pair key the coordinator gave both for that test, so a node holding the
//! shared token cannot pose as another to its peer.
//!
//! ```text
//! coordinator (or endpoint)           endpoint
//!   Hello{nonce_c, from?}          ->
//!                                  <- Challenge{node, profile, nonce_e, proof_e}
//!   (sealed from here on, both ways)
//!   Request{proof_c, request}      ->
//!                                  <- Response{...}
//! ```

use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::Framed;

use super::CampaignError;
use railguard_prober::rdma::peer::channel::{FrameCodec, FrameError, FrameFormat};
use railguard_prober::rdma::{MemoryKind, TrafficClass};

pub const CONTROL_MAGIC: &[u8; 4] = b"RGCT";
/// 2: frames after the challenge are sealed; pair keys and node identity.
pub const CONTROL_VERSION: u16 = 2;
pub const MAX_FRAME_BYTES: u32 = 256 * 1024;
/// The control channel's frames.
pub const FORMAT: FrameFormat = FrameFormat {
    tag: *CONTROL_MAGIC,
    version: CONTROL_VERSION,
    max_payload_bytes: MAX_FRAME_BYTES as usize,
};
/// Roles bound into the proofs, so a proof cannot be reflected back.
pub const ROLE_COORDINATOR: &str = "campaign-coordinator";
pub const ROLE_ENDPOINT: &str = "campaign-endpoint";
/// The control channel's name in its session keys.
pub const SESSION_PROTOCOL: &str = "campaign-control";

/// A rail, `hca`:`port`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RailRef {
    pub hca: String,
    pub port: u32,
}

impl RailRef {
    pub fn id(&self) -> String {
        format!("{}:{}", self.hca, self.port)
    }
}

/// Ask the endpoint to run the two-node write test from its node to `peer_node`, every rail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunTestRequest {
    /// The profile the campaign runs for; an endpoint on another profile refuses.
    pub profile: String,
    pub peer_node: String,
    /// The peer endpoint's address (`host:port`), where its RDMA side channel listens.
    pub peer_addr: String,
    pub rails: Vec<RailRef>,
    pub memory: MemoryKind,
    pub sizes: Vec<usize>,
    pub iterations: u32,
    /// Service level and traffic class of the tests (the profile's; absent: 0).
    #[serde(default, skip_serializing_if = "TrafficClass::is_default")]
    pub class: TrafficClass,
    /// Run even while GPU pods are on the node.
    #[serde(default)]
    pub allow_gpu_pods: bool,
    /// The endpoint gives up waiting for a rail after this long.
    pub timeout_ms: u64,
    /// The pair key (hex) this test authenticates with on the peer's side channel; without
    /// it the endpoint proves the shared token (no node identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair_key: Option<String>,
}

/// Ask the endpoint to run an NCCL all-reduce pair test with `peer_node`: its own ranks
/// first (ranks 0..n), the peer's after them; the endpoint sends the unique id to the peer's
/// endpoint over this same authenticated control channel ([`NcclJoinRequest`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclTestRequest {
    pub profile: String,
    pub peer_node: String,
    /// The peer endpoint's address (`host:port`).
    pub peer_addr: String,
    /// The rails the collective may use (`NCCL_IB_HCA` in exact-match form): one rail, or
    /// every rail of the profile for the full-node test. The test holds all of them.
    pub rails: Vec<RailRef>,
    /// GPU indices (the node's GPUs in index order) that run a rank each, the same on both
    /// nodes; empty: every GPU.
    #[serde(default)]
    pub gpus: Vec<u32>,
    pub sizes: Vec<usize>,
    pub warmup: u32,
    pub iterations: u32,
    #[serde(default)]
    pub allow_gpu_pods: bool,
    pub timeout_ms: u64,
    /// The pair key (hex) the unique id travels under to the peer's endpoint; never sent
    /// on to the peer (it has its own copy from the coordinator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair_key: Option<String>,
}

/// Sent by the rank-0 endpoint to its peer's: join the communicator of `unique_id` as ranks
/// `first_rank..nranks`. `test.peer_node` names the rank-0 node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclJoinRequest {
    pub test: NcclTestRequest,
    /// `ncclUniqueId`, lowercase hex.
    pub unique_id: String,
    pub nranks: u32,
    pub first_rank: u32,
}

/// The coordinator's announcement of a pair test to its responder: accept tests from
/// `peer_node` that prove `pair_key` (hex), for `ttl_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcceptPeerRequest {
    pub peer_node: String,
    pub pair_key: String,
    pub ttl_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum ControlRequest {
    /// Who the endpoint is and whether it could run a test now.
    Status,
    RunTest(RunTestRequest),
    RunNccl(NcclTestRequest),
    JoinNccl(NcclJoinRequest),
    /// The endpoint's proof of which node it runs on: its pod's bound service-account token.
    Identify,
    AcceptPeer(AcceptPeerRequest),
}

impl ControlRequest {
    /// The request with every secret it carries (pair keys) passed through `f`: wrapped for
    /// the connection before it is sent, unwrapped when it arrives
    /// ([`railguard_prober::rdma::peer::channel::Session::wrap`]).
    pub fn map_secrets<E>(self, f: impl Fn(String) -> Result<String, E>) -> Result<Self, E> {
        Ok(match self {
            ControlRequest::RunTest(mut r) => {
                r.pair_key = r.pair_key.map(&f).transpose()?;
                ControlRequest::RunTest(r)
            }
            ControlRequest::RunNccl(mut r) => {
                r.pair_key = r.pair_key.map(&f).transpose()?;
                ControlRequest::RunNccl(r)
            }
            ControlRequest::JoinNccl(mut r) => {
                r.test.pair_key = r.test.pair_key.map(&f).transpose()?;
                ControlRequest::JoinNccl(r)
            }
            ControlRequest::AcceptPeer(mut r) => {
                r.pair_key = f(r.pair_key)?;
                ControlRequest::AcceptPeer(r)
            }
            other @ (ControlRequest::Status | ControlRequest::Identify) => other,
        })
    }
}

/// What NCCL's debug log of one side showed (the judgement of
/// [`railguard_prober::nccl::parse_debug_log`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclLogSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_version: Option<String>,
    /// The inter-node network NCCL chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<railguard_api::Transport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdr: Option<bool>,
    /// HCA ports NCCL used.
    #[serde(default)]
    pub hcas: Vec<String>,
    /// NCCL's warnings and errors.
    #[serde(default)]
    pub errors: Vec<String>,
    pub nccl_lines: usize,
}

/// One node's side of an NCCL pair test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum NcclSide {
    /// The ranks ran the sweep.
    #[serde(rename_all = "camelCase")]
    Measured {
        points: Vec<railguard_prober::nccl::ranks::PairPoint>,
        nranks: u32,
        gpus: Vec<String>,
        log: NcclLogSummary,
    },
    /// The node cannot take the test (no libnccl, no CUDA driver, no GPU): no evidence, the
    /// profile decides what that means.
    NotMeasured { reason: String },
    /// NCCL or CUDA failed while the collective was set up or ran: evidence against.
    Failed {
        reason: String,
        #[serde(default)]
        log: NcclLogSummary,
    },
    /// No evidence either way (refused, busy, timed out, peer gone).
    Inconclusive { reason: String },
}

/// One node's side, named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclSideReport {
    pub node: String,
    #[serde(flatten)]
    pub side: NcclSide,
}

/// What one rail of a test showed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum RailReport {
    /// The sweep ran: peak bandwidth and small-message latency.
    #[serde(rename_all = "camelCase")]
    Measured { bw_gbps: f64, latency_us: f64 },
    /// The writes did not get through (dead wire, error completions, peer unreachable, rail
    /// absent or down): evidence against this rail or link.
    Failed { reason: String },
    /// No evidence either way (refused, busy, authentication or protocol error, peer gone).
    Inconclusive { reason: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RailTestReport {
    pub rail: RailRef,
    #[serde(flatten)]
    pub report: RailReport,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ControlResponse {
    #[serde(rename_all = "camelCase")]
    Status {
        node: String,
        profile: String,
        devices: Vec<String>,
        gpu_pods: Vec<String>,
    },
    #[serde(rename_all = "camelCase")]
    TestResult {
        node: String,
        peer_node: String,
        rails: Vec<RailTestReport>,
    },
    Refused {
        reason: String,
    },
    /// An NCCL pair test's sides: the asked endpoint's first, then its peer's (a joining
    /// endpoint answers with its own side only).
    #[serde(rename_all = "camelCase")]
    NcclResult {
        node: String,
        peer_node: String,
        sides: Vec<NcclSideReport>,
    },
    /// The answer to `Identify`: the pod's service-account token for the coordinator's
    /// TokenReview.
    #[serde(rename_all = "camelCase")]
    Identity {
        node: String,
        token: String,
    },
    /// The answer to `AcceptPeer`.
    #[serde(rename_all = "camelCase")]
    PeerAccepted {
        peer_node: String,
    },
}

impl ControlResponse {
    /// The response with every secret it carries (the identity token) passed through `f`.
    pub fn map_secrets<E>(self, f: impl Fn(String) -> Result<String, E>) -> Result<Self, E> {
        Ok(match self {
            ControlResponse::Identity { node, token } => ControlResponse::Identity {
                node,
                token: f(token)?,
            },
            other => other,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ControlMessage {
    Hello {
        nonce: String,
        /// Set when an endpoint speaks to its pair-test peer: the sending node.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
    },
    Challenge {
        node: String,
        profile: String,
        nonce: String,
        proof: String,
    },
    Request {
        proof: String,
        request: ControlRequest,
        /// The coordinator's token for this one connection, when endpoints check who the
        /// coordinator is ([`super::identity`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credential: Option<String>,
    },
    Response {
        response: ControlResponse,
    },
    Error {
        reason: String,
    },
}

/// One control connection, framed.
pub type ControlChannel<S> = Framed<S, FrameCodec<ControlMessage>>;

pub fn control_channel<S: AsyncRead + AsyncWrite>(io: S) -> ControlChannel<S> {
    Framed::new(io, FrameCodec::new(FORMAT))
}

/// Sends one message.
pub async fn send<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut ControlChannel<S>,
    msg: &ControlMessage,
    peer: &str,
) -> Result<(), CampaignError> {
    ch.send(msg).await.map_err(|e| frame_error(peer, e))
}

/// Receives one message.
pub async fn recv<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut ControlChannel<S>,
    peer: &str,
) -> Result<ControlMessage, CampaignError> {
    match ch.next().await {
        Some(msg) => msg.map_err(|e| frame_error(peer, e)),
        None => Err(CampaignError::Closed {
            peer: peer.to_string(),
        }),
    }
}

fn frame_error(peer: &str, e: FrameError) -> CampaignError {
    let peer = peer.to_string();
    match e {
        e @ FrameError::Mac { .. } => CampaignError::Auth {
            peer,
            reason: e.to_string(),
        },
        FrameError::Closed => CampaignError::Closed { peer },
        FrameError::Io(source) => CampaignError::Io { peer, source },
        FrameError::Tag => CampaignError::Protocol {
            peer,
            reason: "not a railguard campaign endpoint (bad frame magic)".into(),
        },
        e => CampaignError::Protocol {
            peer,
            reason: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use railguard_prober::rdma::peer::channel::HEAD_BYTES;
    use tokio_util::bytes::BytesMut;
    use tokio_util::codec::Encoder;

    #[tokio::test]
    async fn frames_round_trip_and_reject_garbage() {
        let msg = ControlMessage::Request {
            credential: None,
            proof: "00".into(),
            request: ControlRequest::RunTest(RunTestRequest {
                profile: "p".into(),
                peer_node: "b".into(),
                peer_addr: "127.0.0.2:7000".into(),
                rails: vec![RailRef {
                    hca: "mlx5_0".into(),
                    port: 1,
                }],
                memory: MemoryKind::Host,
                sizes: vec![8, 4096],
                iterations: 10,
                class: Default::default(),
                allow_gpu_pods: false,
                timeout_ms: 1000,
                pair_key: None,
            }),
        };
        let mut buf = BytesMut::new();
        FrameCodec::new(FORMAT).encode(&msg, &mut buf).unwrap();
        let buf = buf.to_vec();
        assert_eq!(read(&buf).await.unwrap(), msg);

        let mut bad = buf.clone();
        bad[..4].copy_from_slice(b"RGRP");
        let e = read(&bad).await.unwrap_err();
        assert!(e.to_string().contains("bad frame magic"), "{e}");
        let mut huge = buf.clone();
        huge[HEAD_BYTES - 4..HEAD_BYTES].copy_from_slice(&(MAX_FRAME_BYTES + 1).to_be_bytes());
        assert!(read(&huge)
            .await
            .unwrap_err()
            .to_string()
            .contains("exceeds"));
        let cut = &buf[..buf.len() - 2];
        assert!(matches!(read(cut).await, Err(CampaignError::Closed { .. })));
    }

    /// One message from `bytes`, as the endpoint reads it.
    async fn read(bytes: &[u8]) -> Result<ControlMessage, CampaignError> {
        let (mut near, mut far) = tokio::io::duplex(1 << 20);
        tokio::io::AsyncWriteExt::write_all(&mut far, bytes)
            .await
            .unwrap();
        drop(far);
        recv(&mut control_channel(&mut near), "x").await
    }

    #[test]
    fn report_json_shape() {
        let r = RailTestReport {
            rail: RailRef {
                hca: "mlx5_0".into(),
                port: 1,
            },
            report: RailReport::Measured {
                bw_gbps: 390.5,
                latency_us: 2.5,
            },
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["outcome"], "measured");
        assert_eq!(v["bwGbps"], 390.5);
        assert_eq!(v["rail"]["hca"], "mlx5_0");
    }
}
