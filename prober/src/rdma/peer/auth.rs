//! The side channel's mutual authentication (hello, challenge, auth), both halves, on the
//! proofs of [`channel`](super::channel). The responder's half is split into steps without IO
//! ([`answer_hello`], [`PendingInitiator::check_auth`]) so the blocking responder and the
//! endpoint's async one share it. After the challenge both sides seal every frame with the
//! connection's [`Session`].

use std::time::{Duration, Instant};

use super::channel::{self, decode_nonce, nonce, proof_hex, verify_proof, Session};
use super::conn::SideChannel;
use super::wire::{protocol, unexpected, Message};
use super::PeerConfig;
use crate::rdma::RdmaError;

/// Roles bound into the proofs and frame seals, so neither can be reflected back.
pub const ROLE_INITIATOR: &str = "initiator";
pub const ROLE_RESPONDER: &str = "responder";
/// The side channel's name in its session keys.
pub const SESSION_PROTOCOL: &str = "rdma-side-channel";

/// HMAC-SHA256 proof that the sender knows `token`, bound to both nonces (the initiator's
/// first) and its role (`"initiator"` or `"responder"`), so a proof cannot be replayed or
/// reflected.
pub use channel::proof as proof_with;

/// Who a peer said it is, after it proved knowledge of the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedPeer {
    pub node: String,
    pub profile: String,
}

/// A hello answered: what the responder waits for next.
#[derive(Debug)]
pub struct PendingInitiator {
    initiator: AuthenticatedPeer,
    key: Vec<u8>,
    nonce_i: Vec<u8>,
    nonce_r: [u8; 32],
    peer: String,
}

/// The responder's first step: checks the hello, picks the key the initiator must know (the
/// shared token, or the pair key the coordinator announced for the node the hello names) and
/// answers with a challenge.
pub fn answer_hello(
    cfg: &PeerConfig,
    hello: Message,
    peer: &str,
) -> Result<(PendingInitiator, Message), RdmaError> {
    let (initiator, nonce_i) = match hello {
        Message::Hello {
            node,
            profile,
            nonce,
        } => {
            let nonce_i = decode_nonce(&nonce).map_err(|reason| protocol(peer, reason.into()))?;
            (AuthenticatedPeer { node, profile }, nonce_i)
        }
        other => return Err(unexpected(peer, "hello", &other)),
    };
    let key = cfg
        .key_for_initiator(&initiator.node)
        .map_err(|reason| RdmaError::PeerAuth {
            peer: peer.to_string(),
            reason,
        })?;
    let nonce_r = nonce();
    let challenge = Message::Challenge {
        node: cfg.node.clone(),
        profile: cfg.profile.clone(),
        nonce: hex::encode(nonce_r),
        proof: proof_hex(&key, ROLE_RESPONDER, &nonce_i, &nonce_r),
    };
    let pending = PendingInitiator {
        initiator,
        key,
        nonce_i,
        nonce_r,
        peer: peer.to_string(),
    };
    Ok((pending, challenge))
}

impl PendingInitiator {
    /// The responder's session: sealing starts right after the challenge.
    pub fn session(&self) -> Session {
        Session::new(
            &self.key,
            SESSION_PROTOCOL,
            &self.nonce_i,
            &self.nonce_r,
            ROLE_RESPONDER,
            ROLE_INITIATOR,
        )
    }

    /// The responder's second step: the initiator's (sealed) proof.
    pub fn check_auth(self, auth: Message) -> Result<AuthenticatedPeer, RdmaError> {
        match auth {
            Message::Auth { proof }
                if verify_proof(
                    &self.key,
                    ROLE_INITIATOR,
                    &self.nonce_i,
                    &self.nonce_r,
                    &proof,
                ) =>
            {
                Ok(self.initiator)
            }
            Message::Auth { .. } => Err(RdmaError::PeerAuth {
                peer: self.peer,
                reason: "initiator's proof does not match the key".into(),
            }),
            other => Err(unexpected(&self.peer, "auth", &other)),
        }
    }
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// A step's timeout names the whole handshake's limit, not what was left of it.
fn whole(limit: Duration) -> impl Fn(RdmaError) -> RdmaError {
    move |e| match e {
        RdmaError::PeerTimeout { peer, stage, .. } => RdmaError::PeerTimeout {
            peer,
            stage,
            after_ms: limit.as_millis() as u64,
        },
        e => e,
    }
}

/// The initiator's half: hello, check the responder's challenge against `key`, prove
/// ourselves; everything within `limit`.
pub(super) fn authenticate_responder(
    ch: &mut SideChannel,
    cfg: &PeerConfig,
    key: &[u8],
    limit: Duration,
) -> Result<AuthenticatedPeer, RdmaError> {
    let deadline = Instant::now() + limit;
    let peer = ch.peer().to_string();
    let nonce_i = nonce();
    let hello = Message::Hello {
        node: cfg.node.clone(),
        profile: cfg.profile.clone(),
        nonce: hex::encode(nonce_i),
    };
    ch.send(&hello, "hello", left(deadline))
        .map_err(whole(limit))?;
    let (responder, nonce_r) = match ch.recv("challenge", left(deadline)).map_err(whole(limit))? {
        Message::Challenge {
            node,
            profile,
            nonce,
            proof,
        } => {
            let nonce_r = decode_nonce(&nonce).map_err(|reason| protocol(&peer, reason.into()))?;
            if !verify_proof(key, ROLE_RESPONDER, &nonce_i, &nonce_r, &proof) {
                return Err(RdmaError::PeerAuth {
                    peer,
                    reason: "responder's proof does not match the key".into(),
                });
            }
            (AuthenticatedPeer { node, profile }, nonce_r)
        }
        other => return Err(unexpected(&peer, "challenge", &other)),
    };
    ch.seal_with(Session::new(
        key,
        SESSION_PROTOCOL,
        &nonce_i,
        &nonce_r,
        ROLE_INITIATOR,
        ROLE_RESPONDER,
    ));
    let auth = Message::Auth {
        proof: proof_hex(key, ROLE_INITIATOR, &nonce_i, &nonce_r),
    };
    ch.send(&auth, "auth", left(deadline))
        .map_err(whole(limit))?;
    Ok(responder)
}

/// The responder's half in blocking code: answer the hello with a challenge, check the
/// initiator's proof, all within `cfg.handshake_timeout`. Public so test tools can script
/// misbehaving peers on top of a correct handshake.
pub fn authenticate_initiator(
    ch: &mut SideChannel,
    cfg: &PeerConfig,
) -> Result<AuthenticatedPeer, RdmaError> {
    let limit = cfg.handshake_timeout;
    let deadline = Instant::now() + limit;
    let hello = ch.recv("hello", left(deadline)).map_err(whole(limit))?;
    let (pending, challenge) = answer_hello(cfg, hello, ch.peer())?;
    ch.send(&challenge, "challenge", left(deadline))
        .map_err(whole(limit))?;
    ch.seal_with(pending.session());
    let auth = ch.recv("auth", left(deadline)).map_err(whole(limit))?;
    pending.check_auth(auth)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const TOKEN: &str = "0123456789abcdef-shared";

    #[test]
    fn proofs_bind_role_and_nonces() {
        let c = PeerConfig::new("n", "p", TOKEN).unwrap();
        let key = c.key_for_initiator("m").unwrap();
        let p = proof_hex(&key, ROLE_INITIATOR, b"aaaa", b"bbbb");
        assert!(verify_proof(&key, ROLE_INITIATOR, b"aaaa", b"bbbb", &p));
        assert!(
            !verify_proof(&key, ROLE_RESPONDER, b"aaaa", b"bbbb", &p),
            "reflection must fail"
        );
        assert!(!verify_proof(&key, ROLE_INITIATOR, b"aaaa", b"bbbc", &p));
        assert!(!verify_proof(
            b"another-token-of-16+",
            ROLE_INITIATOR,
            b"aaaa",
            b"bbbb",
            &p
        ));
        assert_eq!(
            p,
            hex::encode(proof_with(
                TOKEN.as_bytes(),
                ROLE_INITIATOR,
                b"aaaa",
                b"bbbb"
            ))
        );
    }

    #[test]
    fn a_newline_after_the_token_is_not_part_of_it() {
        let a = PeerConfig::new("n", "p", format!("{TOKEN}\n")).unwrap();
        let b = PeerConfig::new("n", "p", TOKEN).unwrap();
        assert_eq!(a.key_for_initiator("m"), b.key_for_initiator("m"));
    }
}
