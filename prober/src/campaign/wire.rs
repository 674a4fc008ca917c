//! The coordinator's control channel to a peer endpoint.
//!
//! It shares the endpoint's TCP port with the RDMA side channel ([`crate::rdma::peer`]); the
//! first four bytes tell them apart (`RGCT` here, `RGRP` there). Frame: `b"RGCT"`, a big-endian
//! `u32` payload length (at most [`MAX_FRAME_BYTES`]) and a JSON [`ControlMessage`].
//!
//! Authentication never sends the token: the coordinator and the endpoint exchange nonces and
//! prove knowledge of the shared token with HMAC-SHA256 over both nonces and their role
//! (see [`crate::rdma::peer::proof_with`]); proofs are compared in constant time.
//!
//! ```text
//! coordinator                         endpoint
//!   Hello{nonce_c}                 ->
//!                                  <- Challenge{node, profile, nonce_e, proof_e}
//!   Request{proof_c, request}      ->
//!                                  <- Response{...}
//! ```

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::CampaignError;
use crate::rdma::peer::proof_with;
use crate::rdma::MemoryKind;

pub const CONTROL_MAGIC: &[u8; 4] = b"RGCT";
pub const MAX_FRAME_BYTES: u32 = 256 * 1024;
/// Roles bound into the proofs, so a proof cannot be reflected back.
pub const ROLE_COORDINATOR: &str = "campaign-coordinator";
pub const ROLE_ENDPOINT: &str = "campaign-endpoint";

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
    /// Run even while GPU pods are on the node.
    #[serde(default)]
    pub allow_gpu_pods: bool,
    /// The endpoint gives up waiting for a rail after this long.
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum ControlRequest {
    /// Who the endpoint is and whether it could run a test now.
    Status,
    RunTest(RunTestRequest),
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ControlMessage {
    Hello {
        nonce: String,
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
    },
    Response {
        response: ControlResponse,
    },
    Error {
        reason: String,
    },
}

/// Writes one frame.
pub async fn write_frame(
    w: &mut (impl AsyncWrite + Unpin),
    msg: &ControlMessage,
    peer: &str,
) -> Result<(), CampaignError> {
    let payload = serde_json::to_vec(msg).map_err(|e| CampaignError::Protocol {
        peer: peer.to_string(),
        reason: format!("cannot encode message: {e}"),
    })?;
    if payload.len() > MAX_FRAME_BYTES as usize {
        return Err(CampaignError::Protocol {
            peer: peer.to_string(),
            reason: format!("message of {} bytes is too large", payload.len()),
        });
    }
    let mut frame = Vec::with_capacity(8 + payload.len());
    frame.extend_from_slice(CONTROL_MAGIC);
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    w.write_all(&frame)
        .await
        .map_err(|source| CampaignError::Io {
            peer: peer.to_string(),
            source,
        })?;
    w.flush().await.map_err(|source| CampaignError::Io {
        peer: peer.to_string(),
        source,
    })
}

/// Reads one frame.
pub async fn read_frame(
    r: &mut (impl AsyncRead + Unpin),
    peer: &str,
) -> Result<ControlMessage, CampaignError> {
    let mut header = [0u8; 8];
    read_exact(r, &mut header, peer).await?;
    if &header[..4] != CONTROL_MAGIC {
        return Err(CampaignError::Protocol {
            peer: peer.to_string(),
            reason: "not a railguard campaign endpoint (bad frame magic)".into(),
        });
    }
    let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    if len > MAX_FRAME_BYTES {
        return Err(CampaignError::Protocol {
            peer: peer.to_string(),
            reason: format!("frame of {len} bytes exceeds {MAX_FRAME_BYTES}"),
        });
    }
    let mut payload = vec![0u8; len as usize];
    read_exact(r, &mut payload, peer).await?;
    serde_json::from_slice(&payload).map_err(|e| CampaignError::Protocol {
        peer: peer.to_string(),
        reason: format!("malformed message: {e}"),
    })
}

async fn read_exact(
    r: &mut (impl AsyncRead + Unpin),
    buf: &mut [u8],
    peer: &str,
) -> Result<(), CampaignError> {
    match r.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(CampaignError::Closed {
            peer: peer.to_string(),
        }),
        Err(source) => Err(CampaignError::Io {
            peer: peer.to_string(),
            source,
        }),
    }
}

/// The HMAC proof of `role` over both nonces.
pub fn proof(token: &[u8], role: &str, nonce_c: &[u8], nonce_e: &[u8]) -> Vec<u8> {
    proof_with(token, role, nonce_c, nonce_e)
}

/// Compares two byte strings in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box keeps the optimizer from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

/// Checks that `proof_hex` is `role`'s proof over the nonces with `token`.
pub fn verify_proof(
    token: &[u8],
    role: &str,
    nonce_c: &[u8],
    nonce_e: &[u8],
    proof_hex: &str,
) -> bool {
    let Ok(given) = hex::decode(proof_hex) else {
        return false;
    };
    constant_time_eq(&proof(token, role, nonce_c, nonce_e), &given)
}

/// A random 32-byte nonce.
pub fn nonce() -> [u8; 32] {
    rand::random()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn constant_time_eq_matches_eq() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn proofs_bind_token_role_and_nonces() {
        let t = b"0123456789abcdef";
        let p = hex::encode(proof(t, ROLE_COORDINATOR, b"n1", b"n2"));
        assert!(verify_proof(t, ROLE_COORDINATOR, b"n1", b"n2", &p));
        assert!(!verify_proof(t, ROLE_ENDPOINT, b"n1", b"n2", &p));
        assert!(!verify_proof(t, ROLE_COORDINATOR, b"n1", b"n3", &p));
        assert!(!verify_proof(
            b"another-token-xx",
            ROLE_COORDINATOR,
            b"n1",
            b"n2",
            &p
        ));
        assert!(!verify_proof(t, ROLE_COORDINATOR, b"n1", b"n2", "not hex"));
    }

    #[tokio::test]
    async fn frames_round_trip_and_reject_garbage() {
        let msg = ControlMessage::Request {
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
                allow_gpu_pods: false,
                timeout_ms: 1000,
            }),
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &msg, "x").await.unwrap();
        assert_eq!(read_frame(&mut &buf[..], "x").await.unwrap(), msg);

        let mut bad = buf.clone();
        bad[..4].copy_from_slice(b"RGRP");
        let e = read_frame(&mut &bad[..], "x").await.unwrap_err();
        assert!(e.to_string().contains("bad frame magic"), "{e}");
        let mut huge = buf.clone();
        huge[4..8].copy_from_slice(&(MAX_FRAME_BYTES + 1).to_be_bytes());
        assert!(read_frame(&mut &huge[..], "x")
            .await
            .unwrap_err()
            .to_string()
            .contains("exceeds"));
        let cut = &buf[..buf.len() - 2];
        assert!(matches!(
            read_frame(&mut &cut[..], "x").await,
            Err(CampaignError::Closed { .. })
        ));
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
