//! The side channel's messages and how they travel: [`channel`](super::channel) frames tagged
//! [`MAGIC`], and the mapping of framing and socket errors to [`RdmaError`].

use std::io::{ErrorKind, Read, Write};

use serde::{Deserialize, Serialize};
use tokio_util::bytes::BytesMut;
use tokio_util::codec::Encoder;

use super::channel::{FrameCodec, FrameError, FrameFormat};
use crate::rdma::{MemoryKind, QpInfo, RdmaError, TrafficClass};

pub const MAGIC: &[u8; 4] = b"RGRP";
/// 2: every frame after hello and challenge is sealed ([`channel::Session`](super::channel::Session)).
pub const PROTOCOL_VERSION: u16 = 2;
pub const MAX_FRAME_BYTES: u32 = 64 * 1024;

/// The side channel's frames.
pub const FORMAT: FrameFormat = FrameFormat {
    tag: *MAGIC,
    version: PROTOCOL_VERSION,
    max_payload_bytes: MAX_FRAME_BYTES as usize,
};

/// A side-channel message. Byte strings travel as lowercase hex.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Message {
    Hello {
        node: String,
        profile: String,
        nonce: String,
    },
    Challenge {
        node: String,
        profile: String,
        nonce: String,
        proof: String,
    },
    Auth {
        proof: String,
    },
    TestRequest {
        hca: String,
        port: u32,
        /// Memory of the responder's buffer (the initiator's is its own business).
        memory: MemoryKind,
        sizes: Vec<usize>,
        iterations: u32,
        initiator: QpInfo,
        /// Service level and traffic class of both QPs (absent: 0, from older initiators).
        #[serde(default)]
        class: TrafficClass,
    },
    Accept {
        responder: QpInfo,
    },
    Refuse {
        reason: String,
    },
    Done {
        ok: bool,
        #[serde(default)]
        note: String,
    },
    Bye,
    Error {
        reason: String,
    },
}

impl Message {
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Challenge { .. } => "challenge",
            Message::Auth { .. } => "auth",
            Message::TestRequest { .. } => "testRequest",
            Message::Accept { .. } => "accept",
            Message::Refuse { .. } => "refuse",
            Message::Done { .. } => "done",
            Message::Bye => "bye",
            Message::Error { .. } => "error",
        }
    }
}

/// Encodes one frame.
pub fn encode_frame(msg: &Message) -> Result<Vec<u8>, RdmaError> {
    let mut frame = BytesMut::new();
    FrameCodec::new(FORMAT)
        .encode(msg, &mut frame)
        .map_err(|e| RdmaError::InvalidRequest {
            reason: format!("cannot send side-channel message: {e}"),
        })?;
    Ok(frame.to_vec())
}

/// Decodes one plain frame from `r`, reading no further. `peer` and `stage` only label
/// errors.
pub fn read_message(
    r: &mut impl Read,
    peer: &str,
    stage: &'static str,
) -> Result<Message, RdmaError> {
    FrameCodec::new(FORMAT)
        .read_blocking(r)
        .map_err(|e| read_error(peer, stage, e))
}

/// Writes one plain frame to `w`.
pub fn write_message(
    w: &mut impl Write,
    msg: &Message,
    peer: &str,
    stage: &'static str,
) -> Result<(), RdmaError> {
    FrameCodec::new(FORMAT)
        .write_blocking(w, msg)
        .map_err(|e| write_error(peer, stage, e))
}

/// A frame that could not be read, as an [`RdmaError`].
pub fn read_error(peer: &str, stage: &'static str, e: FrameError) -> RdmaError {
    match e {
        FrameError::Tag => protocol(peer, "not a railguard peer (bad frame magic)".into()),
        FrameError::Malformed { source } => {
            protocol(peer, format!("malformed message during {stage}: {source}"))
        }
        e => frame_error(peer, stage, e),
    }
}

/// A frame that could not be written, as an [`RdmaError`].
pub fn write_error(peer: &str, stage: &'static str, e: FrameError) -> RdmaError {
    match e {
        e @ (FrameError::TooLarge { .. } | FrameError::Encode { .. }) => {
            RdmaError::InvalidRequest {
                reason: format!("cannot send side-channel message: {e}"),
            }
        }
        e => frame_error(peer, stage, e),
    }
}

pub(super) fn frame_error(peer: &str, stage: &'static str, e: FrameError) -> RdmaError {
    match e {
        FrameError::Closed => RdmaError::PeerGone {
            peer: peer.to_string(),
            stage,
        },
        FrameError::Io(e) => io_error(peer, stage, e),
        e @ FrameError::Mac { .. } => RdmaError::PeerAuth {
            peer: peer.to_string(),
            reason: format!("during {stage}: {e}"),
        },
        e => protocol(peer, e.to_string()),
    }
}

pub(super) fn io_error(peer: &str, stage: &'static str, e: std::io::Error) -> RdmaError {
    match e.kind() {
        ErrorKind::UnexpectedEof
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe => RdmaError::PeerGone {
            peer: peer.to_string(),
            stage,
        },
        ErrorKind::WouldBlock | ErrorKind::TimedOut => RdmaError::PeerTimeout {
            peer: peer.to_string(),
            stage,
            after_ms: 0,
        },
        _ => RdmaError::PeerIo {
            peer: peer.to_string(),
            stage,
            source: e,
        },
    }
}

pub(super) fn protocol(peer: &str, reason: String) -> RdmaError {
    RdmaError::PeerProtocol {
        peer: peer.to_string(),
        reason,
    }
}

pub(super) fn unexpected(peer: &str, stage: &str, msg: &Message) -> RdmaError {
    match msg {
        Message::Error { reason } => {
            protocol(peer, format!("peer reported during {stage}: {reason}"))
        }
        other => protocol(
            peer,
            format!("unexpected {} message during {stage}", other.kind()),
        ),
    }
}

/// A GID on the wire is 32 hex digits; anything else is rejected before it reaches verbs.
pub(super) fn check_gid(peer: &str, gid: &str) -> Result<(), RdmaError> {
    if gid.len() != 32 || !gid.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(protocol(peer, format!("gid {gid:?} is not 32 hex digits")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::rdma::peer::channel::HEAD_BYTES;

    #[test]
    fn frame_roundtrip_and_rejections() {
        let msg = Message::Done {
            ok: true,
            note: String::new(),
        };
        let frame = encode_frame(&msg).unwrap();
        assert_eq!(&frame[..4], MAGIC);
        assert_eq!(read_message(&mut &frame[..], "p", "t").unwrap(), msg);

        let mut bad = frame.clone();
        bad[0] = b'X';
        assert!(read_message(&mut &bad[..], "p", "t")
            .unwrap_err()
            .to_string()
            .contains("bad frame magic"));
        // Version 1 (before sealed frames) is refused with a clear error.
        let mut v1 = frame.clone();
        v1[5] = 1;
        assert!(read_message(&mut &v1[..], "p", "t")
            .unwrap_err()
            .to_string()
            .contains("protocol version 1, this prober speaks 2"));
        let mut huge = frame.clone();
        huge[HEAD_BYTES - 4..HEAD_BYTES].copy_from_slice(&(MAX_FRAME_BYTES + 1).to_be_bytes());
        assert!(read_message(&mut &huge[..], "p", "t")
            .unwrap_err()
            .to_string()
            .contains("exceeds"));
        let cut = &frame[..frame.len() - 1];
        assert!(matches!(
            read_message(&mut &cut[..], "p", "done"),
            Err(RdmaError::PeerGone { stage: "done", .. })
        ));
        let mut junk = frame[..HEAD_BYTES].to_vec();
        junk[HEAD_BYTES - 4..HEAD_BYTES].copy_from_slice(&3u32.to_be_bytes());
        junk.extend_from_slice(b"{x}");
        assert!(matches!(
            read_message(&mut &junk[..], "p", "t"),
            Err(RdmaError::PeerProtocol { .. })
        ));
        let big = Message::Refuse {
            reason: "x".repeat(MAX_FRAME_BYTES as usize),
        };
        assert!(matches!(
            write_message(&mut Vec::new(), &big, "p", "t"),
            Err(RdmaError::InvalidRequest { .. })
        ));
    }
}
