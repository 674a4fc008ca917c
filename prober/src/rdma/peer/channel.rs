//! The authenticated framing both peer protocols speak: the RDMA side channel ([`super`]) and
//! the campaign control channel ([`crate::campaign::wire`]).
//!
//! Frame: a 4-byte protocol tag, a big-endian `u16` protocol version, then a length-delimited
//! JSON payload (big-endian `u32` length, [`LengthDelimitedCodec`]) of at most the protocol's
//! maximum. The tag comes first so both protocols can share one TCP port: the endpoint peeks
//! at it to pick the protocol.
//!
//! Authentication never sends the secret: each side sends a random nonce and proves
//! knowledge of the secret with an HMAC-SHA256 over both nonces and its role, so a proof can be
//! neither replayed (fresh nonces) nor reflected (the role). Proofs are checked with
//! [`Mac::verify_slice`], in constant time. Nonces and proofs travel as lowercase hex.
//!
//! The channel is plaintext, so proving the secret once is not enough: whatever follows the
//! proofs could be rewritten in flight. Version 2 therefore seals every frame after the two
//! opening ones ([`Session`]): a session key derived from the secret, both nonces and the
//! protocol, and an HMAC per frame over the sender's role, a sequence number and the payload.
//! A frame altered, replayed, reordered, reflected or carried over from another connection
//! fails its check ([`FrameError::Mac`]) and ends the connection.

use std::io::{ErrorKind, Read, Write};
use std::marker::PhantomData;

use hmac::{Hmac, Mac};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::Sha256;
use tokio_util::bytes::{Buf, BufMut, BytesMut};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec, LengthDelimitedCodecError};

/// Bytes of the protocol tag.
pub const TAG_BYTES: usize = 4;
/// Bytes before the length field: the tag and the version.
const PREFIX_BYTES: usize = TAG_BYTES + 2;
/// Width of the length field.
const LENGTH_BYTES: usize = 4;
/// Bytes before the payload.
pub const HEAD_BYTES: usize = PREFIX_BYTES + LENGTH_BYTES;
/// Shortest nonce accepted from a peer.
pub const MIN_NONCE_BYTES: usize = 16;
/// Domain separation of the proofs (both protocols; their roles differ).
const PROOF_CONTEXT: &str = "railguard-peer-v2";
/// Domain separation of the session keys.
const SESSION_CONTEXT: &str = "railguard-peer-v2 session";
/// Domain separation of the keystream that hides secrets inside sealed frames.
const WRAP_CONTEXT: &str = "railguard-peer-v2 wrap";
/// Bytes of the random nonce in front of a wrapped secret.
const WRAP_NONCE_BYTES: usize = 16;
/// Bytes of the HMAC that ends a sealed frame's payload.
pub const MAC_BYTES: usize = 32;

/// What one protocol's frames look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameFormat {
    pub tag: [u8; TAG_BYTES],
    pub version: u16,
    /// Largest payload accepted or sent.
    pub max_payload_bytes: usize,
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("bad frame magic")]
    Tag,
    #[error("protocol version {got}, this prober speaks {speaks}")]
    Version { got: u16, speaks: u16 },
    #[error("frame exceeds {max} bytes")]
    TooLarge { max: usize },
    #[error("malformed message: {source}")]
    Malformed { source: serde_json::Error },
    #[error("cannot encode message: {source}")]
    Encode { source: serde_json::Error },
    #[error("frame {seq} failed its integrity check (altered, replayed, reordered or reflected); connection closed")]
    Mac { seq: u64 },
    #[error("connection closed")]
    Closed,
    #[error("i/o failed")]
    Io(#[source] std::io::Error),
}

impl From<std::io::Error> for FrameError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            ErrorKind::UnexpectedEof => FrameError::Closed,
            _ => FrameError::Io(e),
        }
    }
}

/// The keys of one authenticated connection, from one side's point of view: frames it sends
/// are sealed under its own role, frames it receives must be sealed under the peer's, each
/// direction numbered from 0.
pub struct Session {
    key: [u8; 32],
    send_role: &'static str,
    recv_role: &'static str,
    send_seq: u64,
    recv_seq: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("key", &"<redacted>")
            .field("send_role", &self.send_role)
            .field("recv_role", &self.recv_role)
            .field("send_seq", &self.send_seq)
            .field("recv_seq", &self.recv_seq)
            .finish()
    }
}

impl Session {
    /// The session of a connection authenticated with `secret` and the nonces (the
    /// initiating side's first), for `protocol`, seen by the side playing `own_role`.
    pub fn new(
        secret: &[u8],
        protocol: &str,
        nonce_a: &[u8],
        nonce_b: &[u8],
        own_role: &'static str,
        peer_role: &'static str,
    ) -> Self {
        let mut key = [0u8; 32];
        if let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(secret) {
            for part in [
                SESSION_CONTEXT.as_bytes(),
                b"\0",
                protocol.as_bytes(),
                b"\0",
                nonce_a,
                nonce_b,
            ] {
                mac.update(part);
            }
            key.copy_from_slice(&mac.finalize().into_bytes());
        }
        Session {
            key,
            send_role: own_role,
            recv_role: peer_role,
            send_seq: 0,
            recv_seq: 0,
        }
    }

    fn frame_mac(
        &self,
        format: &FrameFormat,
        role: &str,
        seq: u64,
        payload: &[u8],
    ) -> Option<Hmac<Sha256>> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).ok()?;
        mac.update(&format.tag);
        mac.update(&format.version.to_be_bytes());
        mac.update(role.as_bytes());
        mac.update(b"\0");
        mac.update(&seq.to_be_bytes());
        mac.update(payload);
        Some(mac)
    }

    /// `secret` hidden for the peer of this session (lowercase hex: a random nonce, then
    /// the secret XORed with a keystream of HMAC-SHA256 blocks under the session key). Sealed
    /// frames are authenticated, not encrypted: keys and tokens they carry travel wrapped, so
    /// only someone holding the connection's key can read them.
    pub fn wrap(&self, secret: &str) -> String {
        let nonce: [u8; WRAP_NONCE_BYTES] = rand::random();
        let mut out = nonce.to_vec();
        out.extend(self.keystream_xor(&nonce, secret.as_bytes()));
        hex::encode(out)
    }

    /// The secret of [`Session::wrap`]'s output.
    pub fn unwrap(&self, wrapped: &str) -> Result<String, &'static str> {
        let bytes = hex::decode(wrapped).map_err(|_| "wrapped secret is not hex")?;
        if bytes.len() < WRAP_NONCE_BYTES {
            return Err("wrapped secret is too short");
        }
        let (nonce, body) = bytes.split_at(WRAP_NONCE_BYTES);
        String::from_utf8(self.keystream_xor(nonce, body)).map_err(|_| "wrapped secret is not text")
    }

    fn keystream_xor(&self, nonce: &[u8], data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len());
        for (i, chunk) in data.chunks(32).enumerate() {
            let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(&self.key) else {
                return Vec::new();
            };
            mac.update(WRAP_CONTEXT.as_bytes());
            mac.update(b"\0");
            mac.update(nonce);
            mac.update(&(i as u64).to_be_bytes());
            let block = mac.finalize().into_bytes();
            out.extend(chunk.iter().zip(block.iter()).map(|(a, b)| a ^ b));
        }
        out
    }

    /// The tag that ends the next frame sent.
    fn seal(&mut self, format: &FrameFormat, payload: &[u8]) -> Vec<u8> {
        let seq = self.send_seq;
        self.send_seq += 1;
        self.frame_mac(format, self.send_role, seq, payload)
            .map(|m| m.finalize().into_bytes().to_vec())
            .unwrap_or_default()
    }

    /// Checks the next frame received; its payload without the tag.
    fn open<'a>(&mut self, format: &FrameFormat, sealed: &'a [u8]) -> Result<&'a [u8], FrameError> {
        let seq = self.recv_seq;
        let split = sealed
            .len()
            .checked_sub(MAC_BYTES)
            .ok_or(FrameError::Mac { seq })?;
        let (payload, tag) = sealed.split_at(split);
        let mac = self
            .frame_mac(format, self.recv_role, seq, payload)
            .ok_or(FrameError::Mac { seq })?;
        mac.verify_slice(tag).map_err(|_| FrameError::Mac { seq })?;
        self.recv_seq += 1;
        Ok(payload)
    }
}

/// Frames of JSON messages `M` in a [`FrameFormat`]: a [`Decoder`] and [`Encoder`] for
/// `tokio_util::codec::Framed`, and a blocking reader and writer for `std::net` code. Frames
/// are plain until [`FrameCodec::seal_with`] starts a [`Session`].
#[derive(Debug)]
pub struct FrameCodec<M> {
    format: FrameFormat,
    lengths: LengthDelimitedCodec,
    /// The length codec has taken this frame's head and waits for its payload.
    in_payload: bool,
    session: Option<Session>,
    message: PhantomData<fn() -> M>,
}

impl<M> FrameCodec<M> {
    pub fn new(format: FrameFormat) -> Self {
        let lengths = LengthDelimitedCodec::builder()
            .length_field_offset(PREFIX_BYTES)
            .length_field_length(LENGTH_BYTES)
            .max_frame_length(format.max_payload_bytes)
            .new_codec();
        FrameCodec {
            format,
            lengths,
            in_payload: false,
            session: None,
            message: PhantomData,
        }
    }

    /// Seals every frame from now on, both ways.
    pub fn seal_with(&mut self, session: Session) {
        self.session = Some(session);
    }

    pub fn is_sealed(&self) -> bool {
        self.session.is_some()
    }

    /// The session, once sealed.
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// Checks the tag and version as soon as they arrive, before waiting for the payload.
    fn check_prefix(&self, src: &[u8]) -> Result<(), FrameError> {
        if src.len() >= TAG_BYTES && src[..TAG_BYTES] != self.format.tag {
            return Err(FrameError::Tag);
        }
        if src.len() >= PREFIX_BYTES {
            let got = (&src[TAG_BYTES..PREFIX_BYTES]).get_u16();
            if got != self.format.version {
                return Err(FrameError::Version {
                    got,
                    speaks: self.format.version,
                });
            }
        }
        Ok(())
    }

    fn length_error(&self, e: std::io::Error) -> FrameError {
        match e.get_ref() {
            Some(inner) if inner.is::<LengthDelimitedCodecError>() => FrameError::TooLarge {
                max: self.format.max_payload_bytes,
            },
            _ => FrameError::from(e),
        }
    }
}

impl<M: DeserializeOwned> FrameCodec<M> {
    /// Reads exactly one frame, never past its end: blocking callers hand the same socket
    /// from step to step (and to test tools), so nothing may stay behind in a buffer here.
    pub fn read_blocking(&mut self, r: &mut impl Read) -> Result<M, FrameError> {
        let mut buf = BytesMut::zeroed(HEAD_BYTES);
        r.read_exact(&mut buf)?;
        // The length field tells how much to read next; the codec still checks the bound.
        let payload = (&buf[PREFIX_BYTES..]).get_uint(LENGTH_BYTES) as usize;
        if let Some(msg) = self.decode(&mut buf)? {
            return Ok(msg);
        }
        let start = buf.len();
        buf.resize(start + payload, 0);
        r.read_exact(&mut buf[start..])?;
        self.decode(&mut buf)?.ok_or(FrameError::Closed)
    }
}

impl<M: Serialize> FrameCodec<M> {
    /// Writes one frame and flushes it.
    pub fn write_blocking(&mut self, w: &mut impl Write, msg: &M) -> Result<(), FrameError> {
        let mut buf = BytesMut::new();
        self.encode(msg, &mut buf)?;
        w.write_all(&buf)?;
        w.flush()?;
        Ok(())
    }
}

impl<M: DeserializeOwned> Decoder for FrameCodec<M> {
    type Item = M;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<M>, FrameError> {
        if !self.in_payload {
            self.check_prefix(src)?;
            // With a whole head buffered, the length codec takes it now (or fails).
            self.in_payload = src.len() >= HEAD_BYTES;
        }
        match self.lengths.decode(src) {
            Ok(Some(payload)) => {
                self.in_payload = false;
                let payload = match &mut self.session {
                    Some(session) => session.open(&self.format, &payload)?,
                    None => &payload[..],
                };
                serde_json::from_slice(payload)
                    .map(Some)
                    .map_err(|source| FrameError::Malformed { source })
            }
            Ok(None) => Ok(None),
            Err(e) => Err(self.length_error(e)),
        }
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<M>, FrameError> {
        match self.decode(src)? {
            Some(msg) => Ok(Some(msg)),
            None if src.is_empty() => Ok(None),
            // A frame cut short: the peer hung up in the middle of it.
            None => Err(FrameError::Closed),
        }
    }
}

impl<M: Serialize> Encoder<&M> for FrameCodec<M> {
    type Error = FrameError;

    fn encode(&mut self, msg: &M, dst: &mut BytesMut) -> Result<(), FrameError> {
        let mut payload =
            serde_json::to_vec(msg).map_err(|source| FrameError::Encode { source })?;
        if let Some(session) = &mut self.session {
            if payload.len() + MAC_BYTES > self.format.max_payload_bytes {
                return Err(FrameError::TooLarge {
                    max: self.format.max_payload_bytes,
                });
            }
            let tag = session.seal(&self.format, &payload);
            payload.extend_from_slice(&tag);
        }
        dst.reserve(HEAD_BYTES + payload.len());
        dst.put_slice(&self.format.tag);
        dst.put_u16(self.format.version);
        self.lengths
            .encode(&payload[..], dst)
            .map_err(|e| self.length_error(e))
    }
}

/// A fresh random nonce.
pub fn nonce() -> [u8; 32] {
    rand::random()
}

/// A peer's hex nonce, if it is hex and long enough.
pub fn decode_nonce(hex_nonce: &str) -> Result<Vec<u8>, &'static str> {
    let nonce = hex::decode(hex_nonce).map_err(|_| "nonce is not hex")?;
    if nonce.len() < MIN_NONCE_BYTES {
        return Err("nonce shorter than 16 bytes");
    }
    Ok(nonce)
}

/// A token read from a Secret file often ends in a newline; it is not part of the secret.
pub fn trim_token(token: &[u8]) -> &[u8] {
    token.strip_suffix(b"\n").unwrap_or(token)
}

/// `None` never happens in practice: HMAC takes keys of any length.
fn proof_mac(token: &[u8], role: &str, nonce_a: &[u8], nonce_b: &[u8]) -> Option<Hmac<Sha256>> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(token).ok()?;
    for part in [
        PROOF_CONTEXT.as_bytes(),
        b"\0",
        role.as_bytes(),
        b"\0",
        nonce_a,
        nonce_b,
    ] {
        mac.update(part);
    }
    Some(mac)
}

/// HMAC-SHA256 proof that the sender knows `token`, bound to both nonces (the initiating
/// side's first) and the sender's role.
pub fn proof(token: &[u8], role: &str, nonce_a: &[u8], nonce_b: &[u8]) -> Vec<u8> {
    proof_mac(token, role, nonce_a, nonce_b)
        .map(|mac| mac.finalize().into_bytes().to_vec())
        .unwrap_or_default()
}

/// [`proof`] as it travels: lowercase hex.
pub fn proof_hex(token: &[u8], role: &str, nonce_a: &[u8], nonce_b: &[u8]) -> String {
    hex::encode(proof(token, role, nonce_a, nonce_b))
}

/// Whether `proof_hex` is `role`'s proof over the nonces with `token`, compared in constant
/// time.
pub fn verify_proof(
    token: &[u8],
    role: &str,
    nonce_a: &[u8],
    nonce_b: &[u8],
    proof_hex: &str,
) -> bool {
    let (Ok(given), Some(mac)) = (
        hex::decode(proof_hex),
        proof_mac(token, role, nonce_a, nonce_b),
    ) else {
        return false;
    };
    mac.verify_slice(&given).is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde::Deserialize;

    const FORMAT: FrameFormat = FrameFormat {
        tag: *b"TEST",
        version: 3,
        max_payload_bytes: 64,
    };

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Note {
        text: String,
    }

    fn frame(text: &str) -> Vec<u8> {
        let mut buf = Vec::new();
        FrameCodec::new(FORMAT)
            .write_blocking(&mut buf, &Note { text: text.into() })
            .unwrap();
        buf
    }

    fn read(bytes: &[u8]) -> Result<Note, FrameError> {
        FrameCodec::new(FORMAT).read_blocking(&mut &bytes[..])
    }

    #[test]
    fn frames_round_trip_and_read_no_further_than_one_frame() {
        let mut two = frame("one");
        two.extend(frame("two"));
        let mut r = &two[..];
        let mut codec = FrameCodec::<Note>::new(FORMAT);
        assert_eq!(codec.read_blocking(&mut r).unwrap().text, "one");
        assert_eq!(codec.read_blocking(&mut r).unwrap().text, "two");
        assert!(matches!(
            codec.read_blocking(&mut r),
            Err(FrameError::Closed)
        ));

        let mut buf = BytesMut::from(&two[..]);
        let mut codec = FrameCodec::<Note>::new(FORMAT);
        assert_eq!(codec.decode(&mut buf).unwrap().unwrap().text, "one");
        assert_eq!(codec.decode_eof(&mut buf).unwrap().unwrap().text, "two");
        assert!(codec.decode_eof(&mut buf).unwrap().is_none());
    }

    #[test]
    fn bad_frames_are_rejected() {
        let good = frame("x");
        let mut tag = good.clone();
        tag[0] = b'X';
        assert!(matches!(read(&tag), Err(FrameError::Tag)));
        let mut version = good.clone();
        version[5] = 4;
        let e = read(&version).unwrap_err();
        assert_eq!(e.to_string(), "protocol version 4, this prober speaks 3");
        let mut huge = good.clone();
        huge[PREFIX_BYTES..HEAD_BYTES].copy_from_slice(&65u32.to_be_bytes());
        assert!(matches!(read(&huge), Err(FrameError::TooLarge { max: 64 })));
        assert!(matches!(
            read(&good[..good.len() - 1]),
            Err(FrameError::Closed)
        ));
        let mut cut = BytesMut::from(&good[..good.len() - 1]);
        assert!(matches!(
            FrameCodec::<Note>::new(FORMAT).decode_eof(&mut cut),
            Err(FrameError::Closed)
        ));
        let mut junk = good[..PREFIX_BYTES].to_vec();
        junk.extend(3u32.to_be_bytes());
        junk.extend(b"{x}");
        assert!(matches!(read(&junk), Err(FrameError::Malformed { .. })));
        let too_long = "y".repeat(80);
        assert!(matches!(
            FrameCodec::new(FORMAT).write_blocking(&mut Vec::new(), &Note { text: too_long }),
            Err(FrameError::TooLarge { max: 64 })
        ));
    }

    #[test]
    fn proofs_bind_token_role_and_nonces() {
        let t = b"0123456789abcdef";
        let p = proof_hex(t, "a", b"n1", b"n2");
        assert!(verify_proof(t, "a", b"n1", b"n2", &p));
        assert!(!verify_proof(t, "b", b"n1", b"n2", &p), "reflection");
        assert!(!verify_proof(t, "a", b"n1", b"n3", &p));
        assert!(!verify_proof(t, "a", b"n2", b"n1", &p), "nonce order");
        assert!(!verify_proof(b"another-token-xx", "a", b"n1", b"n2", &p));
        assert!(!verify_proof(t, "a", b"n1", b"n2", "not hex"));
        assert!(!verify_proof(t, "a", b"n1", b"n2", &p[..62]), "truncated");
    }

    /// A sealed pair of codecs, as both ends of one connection see it.
    fn sealed_pair() -> (FrameCodec<Note>, FrameCodec<Note>) {
        let (mut a, mut b) = (FrameCodec::new(FORMAT), FrameCodec::new(FORMAT));
        let s = |own, peer| Session::new(b"0123456789abcdef", "test", b"n1", b"n2", own, peer);
        a.seal_with(s("a", "b"));
        b.seal_with(s("b", "a"));
        (a, b)
    }

    fn sealed(codec: &mut FrameCodec<Note>, text: &str) -> BytesMut {
        let mut buf = BytesMut::new();
        codec.encode(&Note { text: text.into() }, &mut buf).unwrap();
        buf
    }

    #[test]
    fn sealed_frames_round_trip_and_anything_else_fails_the_check() {
        let (mut a, mut b) = sealed_pair();
        let one = sealed(&mut a, "one");
        let two = sealed(&mut a, "two");
        assert_eq!(b.decode(&mut one.clone()).unwrap().unwrap().text, "one");
        assert_eq!(b.decode(&mut two.clone()).unwrap().unwrap().text, "two");
        let e = b.decode(&mut two.clone()).unwrap_err();
        assert!(matches!(e, FrameError::Mac { seq: 2 }), "replay: {e}");
        assert!(e.to_string().contains("integrity check"), "{e}");

        let (mut a, mut b) = sealed_pair();
        let _skipped = sealed(&mut a, "one");
        let two = sealed(&mut a, "two");
        assert!(
            matches!(b.decode(&mut two.clone()), Err(FrameError::Mac { seq: 0 })),
            "reorder"
        );

        let (mut a, mut b) = sealed_pair();
        let mut flipped = sealed(&mut a, "one");
        flipped[HEAD_BYTES + 2] ^= 0x20;
        assert!(
            matches!(b.decode(&mut flipped), Err(FrameError::Mac { .. })),
            "altered"
        );

        let (mut a, _) = sealed_pair();
        let own = sealed(&mut a, "one");
        let (mut a2, _) = sealed_pair();
        assert!(
            matches!(a2.decode(&mut own.clone()), Err(FrameError::Mac { .. })),
            "reflected back to its sender"
        );

        let (_, mut b) = sealed_pair();
        let plain = frame("one");
        assert!(
            matches!(
                b.decode(&mut BytesMut::from(&plain[..])),
                Err(FrameError::Mac { .. })
            ),
            "a plain frame where a sealed one is due"
        );
        // Sealed by a session of another key, or of another connection (other nonces).
        for (key, nonce_b, what) in [
            (&b"another-key-of-16"[..], &b"n2"[..], "other key"),
            (&b"0123456789abcdef"[..], &b"n3"[..], "other connection"),
        ] {
            let mut other = FrameCodec::<Note>::new(FORMAT);
            other.seal_with(Session::new(key, "test", b"n1", nonce_b, "a", "b"));
            let (_, mut b) = sealed_pair();
            assert!(
                matches!(
                    b.decode(&mut sealed(&mut other, "x")),
                    Err(FrameError::Mac { .. })
                ),
                "{what}"
            );
        }
    }

    #[test]
    fn wrapped_secrets_open_only_with_the_session_key() {
        let (a, b) = sealed_pair();
        let (a, b) = (a.session().unwrap(), b.session().unwrap());
        let secret = "0123456789abcdef".repeat(5);
        let w1 = a.wrap(&secret);
        let w2 = a.wrap(&secret);
        assert_ne!(w1, w2, "a fresh nonce each time");
        assert!(!w1.contains(&hex::encode(secret.as_bytes())));
        assert_eq!(b.unwrap(&w1).unwrap(), secret);
        let other = Session::new(b"another-key-of-16", "test", b"n1", b"n2", "a", "b");
        assert_ne!(other.unwrap(&w1).ok(), Some(secret));
        assert!(b.unwrap("zz").is_err() && b.unwrap("00").is_err());
    }

    #[test]
    fn nonces_must_be_hex_and_long_enough() {
        assert_eq!(decode_nonce(&hex::encode(nonce())).unwrap().len(), 32);
        assert!(decode_nonce("zz").is_err());
        assert!(decode_nonce(&hex::encode([1u8; 15])).is_err());
    }
}
