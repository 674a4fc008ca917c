//! The two-node RDMA WRITE test and its TCP side channel.
//!
//! Wire format (version 1): [`channel`] frames tagged `b"RGRP"` ([`MAGIC`]) carrying a JSON
//! [`Message`] of at most [`MAX_FRAME_BYTES`]. Authentication is mutual and never sends the
//! token: both sides exchange random nonces and prove knowledge of the shared token with
//! HMAC-SHA256 over both nonces and their role ([`auth`]).
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
//!
//! - [`channel`]: the authenticated framing (shared with the campaign control channel);
//! - [`wire`]: the messages and their errors;
//! - [`auth`]: the handshake, both halves;
//! - [`locks`]: one test per rail at a time;
//! - [`initiator`] and [`responder`]: the two sides of a test.

pub mod auth;
pub mod channel;
mod initiator;
mod locks;
mod responder;
pub mod wire;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{MemoryKind, RailBenchRequest, RailBenchResult, RdmaError};

pub use auth::{authenticate_initiator, proof_with, AuthenticatedPeer};
pub use initiator::run_write_test_initiator;
pub use locks::{RailGuard, RailLocks};
pub use responder::run_write_test_responder;
pub use wire::{
    encode_frame, read_message, write_message, Message, MAGIC, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};

/// Shortest shared token accepted; shorter secrets are guessable.
pub const MIN_TOKEN_BYTES: usize = 16;

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
        let token = channel::trim_token(token.as_ref());
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const TOKEN: &str = "0123456789abcdef-shared";

    #[test]
    fn short_token_is_rejected_and_not_printed() {
        assert!(PeerConfig::new("n", "p", "short").is_err());
        let c = PeerConfig::new("n", "p", TOKEN).unwrap();
        assert!(
            !format!("{c:?}").contains(TOKEN),
            "token must not be printed"
        );
    }
}
