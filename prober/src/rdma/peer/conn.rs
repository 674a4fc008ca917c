//! One side-channel connection in blocking code: a socket, its framing state (plain, then
//! sealed) and what was read past the last frame. Every read and write has a deadline for the
//! whole message, not for each `read()`: a peer trickling one byte at a time cannot stretch a
//! step beyond its limit.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

use super::channel::{FrameCodec, FrameError, Session};
use super::wire::{frame_error, io_error, Message, FORMAT};
use crate::rdma::RdmaError;

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 8 * 1024;

/// A side-channel connection.
#[derive(Debug)]
pub struct SideChannel {
    stream: TcpStream,
    codec: FrameCodec<Message>,
    /// Bytes received and not yet decoded.
    buf: BytesMut,
    peer: String,
}

impl SideChannel {
    /// A fresh connection (plain frames) to or from `peer` (which only labels errors).
    pub fn new(stream: TcpStream, peer: impl Into<String>) -> Result<Self, RdmaError> {
        Self::resume(stream, FrameCodec::new(FORMAT), BytesMut::new(), peer)
    }

    /// A connection whose handshake ran elsewhere (the endpoint's async half): its codec
    /// (sealed) and the bytes already read past the handshake.
    pub fn resume(
        stream: TcpStream,
        codec: FrameCodec<Message>,
        buf: BytesMut,
        peer: impl Into<String>,
    ) -> Result<Self, RdmaError> {
        let peer = peer.into();
        // A stream handed over from an async runtime may still be non-blocking.
        stream
            .set_nonblocking(false)
            .map_err(|e| io_error(&peer, "socket setup", e))?;
        let _ = stream.set_nodelay(true);
        Ok(SideChannel {
            stream,
            codec,
            buf,
            peer,
        })
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Seals every frame from now on (after the handshake).
    pub fn seal_with(&mut self, session: Session) {
        self.codec.seal_with(session);
    }

    /// Receives one message within `limit`, however the bytes arrive.
    pub fn recv(&mut self, stage: &'static str, limit: Duration) -> Result<Message, RdmaError> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(msg) = self.decode(stage, false)? {
                return Ok(msg);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.timeout(stage, limit));
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| io_error(&self.peer, stage, e))?;
            let start = self.buf.len();
            self.buf.resize(start + READ_CHUNK, 0);
            let read = self.stream.read(&mut self.buf[start..]);
            self.buf.truncate(start + *read.as_ref().unwrap_or(&0));
            match read {
                Ok(0) => {
                    return self
                        .decode(stage, true)?
                        .ok_or_else(|| frame_error(&self.peer, stage, FrameError::Closed))
                }
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(&self.peer, stage, e)),
            }
        }
    }

    fn decode(&mut self, stage: &'static str, eof: bool) -> Result<Option<Message>, RdmaError> {
        let step = if eof {
            self.codec.decode_eof(&mut self.buf)
        } else {
            self.codec.decode(&mut self.buf)
        };
        step.map_err(|e| super::wire::read_error(&self.peer, stage, e))
    }

    /// Sends one message within `limit`.
    pub fn send(
        &mut self,
        msg: &Message,
        stage: &'static str,
        limit: Duration,
    ) -> Result<(), RdmaError> {
        let mut frame = BytesMut::new();
        self.codec
            .encode(msg, &mut frame)
            .map_err(|e| super::wire::write_error(&self.peer, stage, e))?;
        let deadline = Instant::now() + limit;
        let mut rest = &frame[..];
        while !rest.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.timeout(stage, limit));
            }
            self.stream
                .set_write_timeout(Some(left))
                .map_err(|e| io_error(&self.peer, stage, e))?;
            match self.stream.write(rest) {
                Ok(0) => return Err(frame_error(&self.peer, stage, FrameError::Closed)),
                Ok(n) => rest = &rest[n..],
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(io_error(&self.peer, stage, e)),
            }
        }
        self.stream
            .flush()
            .map_err(|e| io_error(&self.peer, stage, e))
    }

    fn timeout(&self, stage: &'static str, limit: Duration) -> RdmaError {
        RdmaError::PeerTimeout {
            peer: self.peer.clone(),
            stage,
            after_ms: limit.as_millis() as u64,
        }
    }
}
