//! The two-node RDMA WRITE test and its TCP side channel.
//!
//! Wire format (version 2): [`channel`] frames tagged `b"RGRP"` ([`MAGIC`]) carrying a JSON
//! [`Message`] of at most [`MAX_FRAME_BYTES`]. Authentication is mutual and never sends the
//! key: both sides exchange random nonces and prove knowledge of the key with HMAC-SHA256 over
//! both nonces and their role ([`auth`]). Every frame after the challenge is sealed with a
//! per-connection session key and a sequence number ([`channel::Session`]): version 1 proved
//! the key once and then trusted a plaintext request anyone on the path could rewrite.
//!
//! The key: under a campaign coordinator, a fresh random key per pair test, which the
//! coordinator gives to exactly the two endpoints of the test ([`PairKeys`]); a responder then
//! accepts a hello naming node X only with the key announced for X, so holding the
//! cluster-wide token is not enough to pose as another node. Without a coordinator (the
//! Soft-RoCE VM test, manual runs) both sides use the shared token.
//!
//! Flow (initiator = the side that writes):
//! ```text
//! initiator                         responder
//!   Hello{node, profile, nonce_i} ->
//!                                 <- Challenge{node, profile, nonce_r, proof_r}
//!   (sealed from here on, both ways)
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
//! - [`conn`]: one connection in blocking code, with whole-message deadlines;
//! - [`wire`]: the messages and their errors;
//! - [`auth`]: the handshake, both halves;
//! - [`locks`]: one test per rail at a time;
//! - [`initiator`] and [`responder`]: the two sides of a test.

pub mod auth;
pub mod channel;
pub mod conn;
mod initiator;
mod locks;
mod responder;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{MemoryKind, RailBenchRequest, RailBenchResult, RdmaError, TrafficClass};

pub use auth::{
    answer_hello, authenticate_initiator, proof_with, AuthenticatedPeer, PendingInitiator,
};
pub use conn::SideChannel;
pub use initiator::run_write_test_initiator;
pub use locks::{RailGuard, RailLocks};
pub use responder::{run_write_test_responder, serve_authenticated};
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
    /// The key this side proves when it initiates: the shared token, or a test's pair key.
    token: Vec<u8>,
    /// Set under a coordinator: incoming tests authenticate with the pair key announced for
    /// the initiator's node, never with the shared token.
    pair_keys: Option<PairKeys>,
    /// Limit for each side-channel step (connect, one message).
    pub io_timeout: Duration,
    /// Limit for a responder's whole handshake (hello, challenge, auth).
    pub handshake_timeout: Duration,
    /// Limit for the whole RDMA sweep (the responder waits this long for `Done`).
    pub test_timeout: Duration,
}

impl std::fmt::Debug for PeerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerConfig")
            .field("node", &self.node)
            .field("profile", &self.profile)
            .field("token", &"<redacted>")
            .field("pair_keys", &self.pair_keys.is_some())
            .field("io_timeout", &self.io_timeout)
            .field("handshake_timeout", &self.handshake_timeout)
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
            pair_keys: None,
            io_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(5),
            test_timeout: Duration::from_secs(300),
        })
    }

    /// Incoming tests need the pair keys in `keys` from now on (coordinator mode).
    pub fn with_pair_keys(mut self, keys: PairKeys) -> Self {
        self.pair_keys = Some(keys);
        self
    }

    /// This side initiating one pair test with `key`, the coordinator's pair key.
    pub fn for_pair(&self, key: &PairKey) -> Self {
        let mut cfg = self.clone();
        cfg.token = key.0.to_vec();
        cfg
    }

    /// The key an initiator that says it is `node` must prove.
    pub fn key_for_initiator(&self, node: &str) -> Result<Vec<u8>, String> {
        match &self.pair_keys {
            None => Ok(self.token.clone()),
            Some(keys) => keys.get(node).map(|k| k.0.to_vec()).ok_or_else(|| {
                format!(
                    "no pair key for node {node}: the coordinator announced no test with it \
                     (a node can only speak for itself)"
                )
            }),
        }
    }

    /// The key this side proves when it initiates.
    pub(crate) fn own_key(&self) -> &[u8] {
        &self.token
    }
}

/// A coordinator's key for one pair test: 32 random bytes, known to the two endpoints only.
#[derive(Clone, PartialEq, Eq)]
pub struct PairKey(pub [u8; 32]);

impl PairKey {
    pub fn random() -> Self {
        PairKey(rand::random())
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(text: &str) -> Result<Self, &'static str> {
        let bytes = hex::decode(text).map_err(|_| "pair key is not hex")?;
        let key: [u8; 32] = bytes.try_into().map_err(|_| "pair key is not 32 bytes")?;
        Ok(PairKey(key))
    }
}

impl std::fmt::Debug for PairKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PairKey(<redacted>)")
    }
}

/// Most pair keys an endpoint keeps (one per peer node; a campaign announces one per test).
pub const MAX_PAIR_KEYS: usize = 4096;

/// The pair keys announced to this endpoint: peer node → key, each until it expires.
#[derive(Debug, Clone, Default)]
pub struct PairKeys {
    keys: Arc<Mutex<HashMap<String, (PairKey, Instant)>>>,
}

impl PairKeys {
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts `node`'s tests with `key` for `ttl` (replacing an earlier key of `node`).
    pub fn insert(&self, node: &str, key: PairKey, ttl: Duration) {
        let now = Instant::now();
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.retain(|_, (_, until)| *until > now);
        if keys.len() >= MAX_PAIR_KEYS && !keys.contains_key(node) {
            // The soonest to expire goes first.
            if let Some(oldest) = keys
                .iter()
                .min_by_key(|(_, (_, until))| *until)
                .map(|(n, _)| n.clone())
            {
                keys.remove(&oldest);
            }
        }
        keys.insert(node.to_string(), (key, now + ttl));
    }

    /// `node`'s key, if one was announced and has not expired.
    pub fn get(&self, node: &str) -> Option<PairKey> {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(node)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(k, _)| k.clone())
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
    /// Class of both QPs: the responder takes the initiator's, as NCCL's accepting side does.
    #[serde(default)]
    pub class: TrafficClass,
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
            class: TrafficClass::default(),
        }
    }

    fn as_bench(&self, memory: MemoryKind) -> RailBenchRequest {
        RailBenchRequest {
            hca: self.hca.clone(),
            port: self.port,
            memory,
            sizes: self.sizes.clone(),
            iterations: self.iterations,
            class: self.class,
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

    #[test]
    fn under_pair_keys_an_initiator_needs_the_key_announced_for_its_node() {
        let keys = PairKeys::new();
        let c = PeerConfig::new("b", "p", TOKEN)
            .unwrap()
            .with_pair_keys(keys.clone());
        let e = c.key_for_initiator("a").unwrap_err();
        assert!(e.contains("no pair key for node a"), "{e}");
        let k = PairKey::random();
        keys.insert("a", k.clone(), Duration::from_secs(60));
        assert_eq!(c.key_for_initiator("a").unwrap(), k.0.to_vec());
        assert!(
            c.key_for_initiator("c").is_err(),
            "a key is for one node only"
        );
        keys.insert("c", PairKey::random(), Duration::ZERO);
        assert!(c.key_for_initiator("c").is_err(), "expired");
        assert_eq!(PairKey::from_hex(&k.to_hex()).unwrap(), k);
        assert!(!format!("{k:?}").contains(&k.to_hex()));
        // Shared mode: the token, whoever asks.
        let shared = PeerConfig::new("b", "p", TOKEN).unwrap();
        assert_eq!(shared.key_for_initiator("x").unwrap(), TOKEN.as_bytes());
        assert_eq!(shared.for_pair(&k).own_key(), &k.0);
    }
}
