//! The side channel's messages and how they travel: [`channel`](super::channel) frames tagged
//! [`MAGIC`], and the mapping of framing and socket errors to [`RdmaError`].

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::bytes::BytesMut;
use tokio_util::codec::Encoder;

use super::channel::{FrameCodec, FrameError, FrameFormat};
use crate::rdma::{MemoryKind, QpInfo, RdmaError};

pub const MAGIC: &[u8; 4] = b"RGRP";
pub const PROTOCOL_VERSION: u16 = 1;
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
    fn kind(&self) -> &'static str {
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

/// Decodes one frame from `r`, reading no further. `peer` and `stage` only label errors.
pub fn read_message(
    r: &mut impl Read,
    peer: &str,
    stage: &'static str,
) -> Result<Message, RdmaError> {
    FrameCodec::new(FORMAT)
        .read_blocking(r)
        .map_err(|e| match e {
            FrameError::Tag => protocol(peer, "not a railguard peer (bad frame magic)".into()),
            FrameError::Malformed { source } => {
                protocol(peer, format!("malformed message during {stage}: {source}"))
            }
            e => frame_error(peer, stage, e),
        })
}

/// Writes one frame to `w`.
pub fn write_message(
    w: &mut impl Write,
    msg: &Message,
    peer: &str,
    stage: &'static str,
) -> Result<(), RdmaError> {
    FrameCodec::new(FORMAT)
        .write_blocking(w, msg)
        .map_err(|e| match e {
            e @ (FrameError::TooLarge { .. } | FrameError::Encode { .. }) => {
                RdmaError::InvalidRequest {
                    reason: format!("cannot send side-channel message: {e}"),
                }
            }
            e => frame_error(peer, stage, e),
        })
}

fn frame_error(peer: &str, stage: &'static str, e: FrameError) -> RdmaError {
    match e {
        FrameError::Closed => RdmaError::PeerGone {
            peer: peer.to_string(),
            stage,
        },
        FrameError::Io(e) => io_error(peer, stage, e),
        e => protocol(peer, e.to_string()),
    }
}

/// `read_message` on a socket, with its read timeout in a timeout error.
pub(super) fn recv(
    stream: &mut TcpStream,
    peer: &str,
    stage: &'static str,
) -> Result<Message, RdmaError> {
    read_message(stream, peer, stage).map_err(|e| with_timeout(e, stream.read_timeout()))
}

/// `write_message` on a socket, with its write timeout in a timeout error.
pub(super) fn send(
    stream: &mut TcpStream,
    msg: &Message,
    peer: &str,
    stage: &'static str,
) -> Result<(), RdmaError> {
    write_message(stream, msg, peer, stage).map_err(|e| with_timeout(e, stream.write_timeout()))
}

fn with_timeout(e: RdmaError, limit: std::io::Result<Option<Duration>>) -> RdmaError {
    match (e, limit) {
        (RdmaError::Timeout { op, after_ms: 0 }, Ok(Some(limit))) => RdmaError::Timeout {
            op,
            after_ms: limit.as_millis() as u64,
        },
        (e, _) => e,
    }
}

pub(super) fn set_timeout(stream: &TcpStream, peer: &str, t: Duration) -> Result<(), RdmaError> {
    stream
        .set_read_timeout(Some(t))
        .and_then(|()| stream.set_write_timeout(Some(t)))
        .map_err(|e| io_error(peer, "socket setup", e))
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
        ErrorKind::WouldBlock | ErrorKind::TimedOut => RdmaError::Timeout {
            op: format!("{stage} with peer {peer}"),
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
        let mut v2 = frame.clone();
        v2[5] = 2;
        assert!(read_message(&mut &v2[..], "p", "t")
            .unwrap_err()
            .to_string()
            .contains("version 2"));
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
