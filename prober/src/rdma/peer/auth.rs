//! The side channel's mutual authentication (hello, challenge, auth), both halves, on the
//! proofs of [`channel`](super::channel).

use std::net::TcpStream;

use super::channel::{self, decode_nonce, nonce, proof_hex, verify_proof};
use super::wire::{protocol, recv, send, unexpected, Message};
use super::PeerConfig;
use crate::rdma::RdmaError;

/// Roles bound into the proofs, so a proof cannot be reflected back.
pub const ROLE_INITIATOR: &str = "initiator";
pub const ROLE_RESPONDER: &str = "responder";

/// HMAC-SHA256 proof that the sender knows `token`, bound to both nonces (the initiator's
/// first) and its role (`"initiator"` or `"responder"`), so a proof cannot be replayed or
/// reflected.
pub use channel::proof as proof_with;

impl PeerConfig {
    fn proof_hex(&self, role: &str, nonce_i: &[u8], nonce_r: &[u8]) -> String {
        proof_hex(&self.token, role, nonce_i, nonce_r)
    }

    fn verify(&self, role: &str, nonce_i: &[u8], nonce_r: &[u8], proof_hex: &str) -> bool {
        verify_proof(&self.token, role, nonce_i, nonce_r, proof_hex)
    }
}

/// Who a peer said it is, after it proved knowledge of the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedPeer {
    pub node: String,
    pub profile: String,
}

/// The initiator's half: hello, check the responder's challenge, prove ourselves.
pub(super) fn authenticate_responder(
    stream: &mut TcpStream,
    cfg: &PeerConfig,
    peer: &str,
) -> Result<AuthenticatedPeer, RdmaError> {
    let nonce_i = nonce();
    send(
        stream,
        &Message::Hello {
            node: cfg.node.clone(),
            profile: cfg.profile.clone(),
            nonce: hex::encode(nonce_i),
        },
        peer,
        "hello",
    )?;
    let (responder, nonce_r) = match recv(stream, peer, "challenge")? {
        Message::Challenge {
            node,
            profile,
            nonce,
            proof,
        } => {
            let nonce_r = decode_nonce(&nonce).map_err(|reason| protocol(peer, reason.into()))?;
            if !cfg.verify(ROLE_RESPONDER, &nonce_i, &nonce_r, &proof) {
                return Err(RdmaError::PeerAuth {
                    peer: peer.to_string(),
                    reason: "responder's proof does not match the shared token".into(),
                });
            }
            (AuthenticatedPeer { node, profile }, nonce_r)
        }
        other => return Err(unexpected(peer, "challenge", &other)),
    };
    send(
        stream,
        &Message::Auth {
            proof: cfg.proof_hex(ROLE_INITIATOR, &nonce_i, &nonce_r),
        },
        peer,
        "auth",
    )?;
    Ok(responder)
}

/// The responder's half: answer the hello with a challenge, check the initiator's proof.
/// Public so test tools can script misbehaving peers on top of a correct handshake.
pub fn authenticate_initiator(
    stream: &mut TcpStream,
    cfg: &PeerConfig,
    peer: &str,
) -> Result<AuthenticatedPeer, RdmaError> {
    let (initiator, nonce_i) = match recv(stream, peer, "hello")? {
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
    let nonce_r = nonce();
    send(
        stream,
        &Message::Challenge {
            node: cfg.node.clone(),
            profile: cfg.profile.clone(),
            nonce: hex::encode(nonce_r),
            proof: cfg.proof_hex(ROLE_RESPONDER, &nonce_i, &nonce_r),
        },
        peer,
        "challenge",
    )?;
    match recv(stream, peer, "auth")? {
        Message::Auth { proof } if cfg.verify(ROLE_INITIATOR, &nonce_i, &nonce_r, &proof) => {
            Ok(initiator)
        }
        Message::Auth { .. } => {
            let _ = send(
                stream,
                &Message::Error {
                    reason: "authentication failed".into(),
                },
                peer,
                "auth",
            );
            Err(RdmaError::PeerAuth {
                peer: peer.to_string(),
                reason: "initiator's proof does not match the shared token".into(),
            })
        }
        other => Err(unexpected(peer, "auth", &other)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const TOKEN: &str = "0123456789abcdef-shared";

    #[test]
    fn proofs_bind_role_and_nonces() {
        let c = PeerConfig::new("n", "p", TOKEN).unwrap();
        let p = c.proof_hex(ROLE_INITIATOR, b"aaaa", b"bbbb");
        assert!(c.verify(ROLE_INITIATOR, b"aaaa", b"bbbb", &p));
        assert!(
            !c.verify(ROLE_RESPONDER, b"aaaa", b"bbbb", &p),
            "reflection must fail"
        );
        assert!(!c.verify(ROLE_INITIATOR, b"aaaa", b"bbbc", &p));
        let other = PeerConfig::new("n", "p", "another-token-of-16+").unwrap();
        assert!(!other.verify(ROLE_INITIATOR, b"aaaa", b"bbbb", &p));
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
        assert_eq!(
            a.proof_hex(ROLE_INITIATOR, b"x", b"y"),
            b.proof_hex(ROLE_INITIATOR, b"x", b"y")
        );
    }
}
