//! The one way every railguard listener serves HTTP (webhook, extender, their metrics ports,
//! the prober's metrics): HTTP/1.1 through hyper with a timer, so the header-read timeout
//! fires, a bounded TLS handshake, a connection cap, and graceful shutdown.
//!
//! A slow client holds neither a socket nor a task for long: the TLS handshake and the
//! request head (from its first byte) each get `header_read_timeout`; a connection waiting
//! for its next request gets `idle_timeout`, longer than the Go clients' 90 s, so the client
//! is the one that closes an idle connection (a server closing it races the next request the
//! client writes there); the body and the handler get the request timeout
//! ([`limit_requests`]). At `max_connections` the longest-idle connection (no request in
//! flight: handshaking, sending a head slowly, or kept alive) is closed to make room, so a
//! flood of idle or slow connections cannot lock a legitimate client out. Only when every
//! connection has a request in flight does a new one wait (up to [`ADMISSION_WAIT`]) and is
//! then refused.
//!
//! HTTP/2 is not served: a TLS config handed here must offer ALPN `http/1.1` (or none).
//!
//! Draining loses no request. kube-apiserver and kube-scheduler are Go clients: they keep
//! pooled keep-alive connections (which conntrack keeps pinned to this pod after its
//! endpoint is gone), and Go's transport does not replay a POST it has written
//! (`Request.isReplayable`, `persistConn.shouldRetryRequest` in net/http/transport.go). A
//! server that closes a kept-alive connection between two requests therefore races the
//! next request written on it, and the loser is an admission refused with `EOF`. So from
//! [`Served::drain`] on, every response carries `Connection: close` and its connection ends
//! right after it (the client then dials again, reaching a ready replica); new connections
//! are still accepted (kube-proxy may route here until the endpoint update reaches it) and
//! each serves one request. At [`Served::stop`] the listener closes; a connection with a
//! request in flight finishes it (its answer says close); one accepted within the last
//! second and not used yet stays open until it is a second old, for the request its client
//! dialed it for; any other idle connection is closed at once (with a drain delay of a few
//! seconds under load, the connections a client still uses have all ended by then; what is
//! left is what Go's transport parked unused, as it does with a connection it dialed for a
//! request another connection took). The task returns when no connection is left, or after
//! `shutdown_grace`.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long a new connection waits for a slot when every connection is busy with a request.
pub const ADMISSION_WAIT: Duration = Duration::from_secs(1);
/// At stop, how long a connection not used yet may stay open from when it was accepted,
/// for the request its client opened it for.
const FRESH_CONNECTION_WINDOW: Duration = Duration::from_secs(1);
/// How long an evicted idle connection gets to close on its own before it is dropped.
const EVICT_GRACE: Duration = Duration::from_millis(200);

/// Connection-level limits of one listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// Bound on the TLS handshake and on reading a request head, from its first byte.
    pub header_read_timeout: Duration,
    /// How long a connection may wait for its next request (its first one included)
    /// before it is closed. Longer than the clients' own idle timeout, so that the client
    /// closes first and never writes a request on a connection the server is closing.
    pub idle_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// How long shutdown lets requests in flight finish.
    pub shutdown_grace: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(DEFAULT_IDLE_TIMEOUT_SECONDS),
            max_connections: 512,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// The server's idle timeout by default: above the 90 s `IdleConnTimeout` that
/// kube-apiserver's webhook client and kube-scheduler's extender client get from
/// `http.DefaultTransport` (through `SetTransportDefaults` in
/// k8s.io/apimachinery/pkg/util/net/http.go).
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: u64 = 120;

/// Request-level limits, applied as tower layers by [`limit_requests`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Whole request (body read, handler, queueing for a slot): 408 beyond.
    pub timeout: Duration,
    /// Most requests handled at once on this listener; more wait (within `timeout`).
    pub max_in_flight: usize,
}

/// The serving flags every long-running binary shares (flattened into its `Cli`).
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct ServeArgs {
    /// Seconds a client gets for the TLS handshake, and for each request head from its
    /// first byte, before the connection is closed.
    #[arg(
        long,
        env = "RAILGUARD_HEADER_READ_TIMEOUT_SECONDS",
        default_value_t = 10
    )]
    pub header_read_timeout_seconds: u64,
    /// Seconds a kept-alive connection may wait for its next request before it is closed;
    /// keep it above the clients' idle timeout (90 s for kube-apiserver and kube-scheduler).
    #[arg(
        long,
        env = "RAILGUARD_IDLE_TIMEOUT_SECONDS",
        default_value_t = DEFAULT_IDLE_TIMEOUT_SECONDS
    )]
    pub idle_timeout_seconds: u64,
    /// Most connections open at once per listener; at the cap the longest-idle connection
    /// is closed to make room.
    #[arg(long, env = "RAILGUARD_MAX_CONNECTIONS", default_value_t = 512)]
    pub max_connections: usize,
    /// Most requests handled at once per listener; more wait, within the request timeout.
    #[arg(long, env = "RAILGUARD_MAX_CONCURRENT_REQUESTS", default_value_t = 16)]
    pub max_concurrent_requests: usize,
}

impl ServeArgs {
    /// Connection limits (zero values become one) with `shutdown_grace`.
    pub fn limits(&self, shutdown_grace: Duration) -> ServeLimits {
        ServeLimits {
            header_read_timeout: Duration::from_secs(self.header_read_timeout_seconds.max(1)),
            idle_timeout: Duration::from_secs(self.idle_timeout_seconds.max(1)),
            max_connections: self.max_connections.max(1),
            shutdown_grace,
        }
    }

    /// Request limits with `timeout` (zero becomes one second).
    pub fn request_limits(&self, timeout: Duration) -> RequestLimits {
        RequestLimits {
            timeout: timeout.max(Duration::from_secs(1)),
            max_in_flight: self.max_concurrent_requests.max(1),
        }
    }
}

/// `router` behind a request timeout (408) and a concurrency limit shared by all its routes.
/// The timeout is outermost, so time spent waiting for a slot counts.
pub fn limit_requests(router: Router, limits: &RequestLimits) -> Router {
    router
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
            limits.max_in_flight.max(1),
        ))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.timeout,
        ))
}

/// Where a TLS listener gets its config for each new connection (a reloader swaps it).
pub type TlsConfigSource = Arc<dyn Fn() -> Arc<rustls::ServerConfig> + Send + Sync>;

/// A started [`serve`]: its address, and the tokens that drain and stop it.
#[derive(Debug)]
pub struct Served {
    pub addr: SocketAddr,
    /// Cancel to drain: every response from then on closes its connection.
    pub drain: CancellationToken,
    /// Cancel to stop accepting and finish (implies `drain`).
    pub stop: CancellationToken,
    pub task: tokio::task::JoinHandle<io::Result<()>>,
}

/// Spawns [`serve`] on `listener` and returns at once with its address.
pub fn spawn_serve(
    listener: std::net::TcpListener,
    router: Router,
    tls: Option<TlsConfigSource>,
    limits: ServeLimits,
) -> io::Result<Served> {
    let addr = listener.local_addr()?;
    let drain = CancellationToken::new();
    let stop = CancellationToken::new();
    let (draining, stopped) = (drain.clone(), stop.clone());
    let task = tokio::spawn(async move {
        serve(
            listener,
            router,
            tls,
            limits,
            draining,
            stopped.cancelled_owned(),
        )
        .await
    });
    Ok(Served {
        addr,
        drain,
        stop,
        task,
    })
}

/// Serves `router` on `listener` (TLS when `tls` is given) until `shutdown` resolves, then
/// stops accepting, lets requests in flight finish within `limits.shutdown_grace` and
/// returns. From `drain` on (and from `shutdown`), each response closes its connection
/// (see the module's notes). Errors only when the listener cannot be used; a failed
/// connection is logged.
pub async fn serve(
    listener: std::net::TcpListener,
    router: Router,
    tls: Option<TlsConfigSource>,
    limits: ServeLimits,
    drain: CancellationToken,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let max = limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(max));
    let registry = Arc::new(Registry::default());
    let stop = CancellationToken::new();
    let limits = Arc::new(limits);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut drain_logged = false;
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            _ = drain.cancelled(), if !drain_logged => {
                drain_logged = true;
                tracing::info!(addr = ?listener.local_addr().ok(), "draining: each response closes its connection");
                continue;
            }
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                registry.evict_longest_idle();
                match tokio::time::timeout(ADMISSION_WAIT, slots.clone().acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => {
                        tracing::warn!(%peer, max_connections = max, "connection refused: every connection is busy");
                        continue;
                    }
                }
            }
        };
        let conn = registry.register();
        let router = router.clone();
        let tls = tls.clone();
        let limits = limits.clone();
        let stop = stop.clone();
        let registry = registry.clone();
        let drain = drain.clone();
        tokio::spawn(async move {
            let ends = Ends {
                drain: &drain,
                stop: &stop,
            };
            connection(tcp, peer, tls, router, &limits, &conn, ends).await;
            registry.remove(conn.id);
            drop(permit);
        });
    }
    drop(listener);
    drain.cancel();
    stop.cancel();
    // Every connection gives its slot back once it has closed (each is bounded by the grace).
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let grace = limits.shutdown_grace + EVICT_GRACE + Duration::from_millis(100);
    let _ = tokio::time::timeout(grace, slots.acquire_many(all)).await;
    Ok(())
}

/// The listener's drain and stop, as one connection sees them.
#[derive(Clone, Copy)]
struct Ends<'a> {
    drain: &'a CancellationToken,
    stop: &'a CancellationToken,
}

/// One connection: the TLS handshake (bounded), then HTTP/1.1 until it closes, is evicted
/// or the server stops. A handshake under way when the server stops goes on: its client is
/// about to send a request on it.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsConfigSource>,
    router: Router,
    limits: &ServeLimits,
    conn: &Arc<Conn>,
    ends: Ends<'_>,
) {
    let _ = tcp.set_nodelay(true);
    match tls {
        None => http(tcp, peer, router, limits, conn, ends).await,
        Some(config) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(config());
            let handshake = tokio::time::timeout(limits.header_read_timeout, acceptor.accept(tcp));
            let stream = tokio::select! {
                r = handshake => match r {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                },
                _ = conn.evict.notified() => return,
            };
            http(stream, peer, router, limits, conn, ends).await
        }
    }
}

async fn http<I>(
    io: I,
    peer: SocketAddr,
    router: Router,
    limits: &ServeLimits,
    conn: &Arc<Conn>,
    ends: Ends<'_>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tracked = conn.clone();
    let draining = ends.drain.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let busy = Busy::new(tracked.clone());
        let router = router.clone();
        let draining = draining.clone();
        async move {
            let mut response = router.oneshot(req.map(axum::body::Body::new)).await;
            // Looked at once the answer is ready, so a request that began before the drain
            // closes its connection too; hyper ends the connection after this response.
            if draining.is_cancelled() {
                if let Ok(r) = response.as_mut() {
                    r.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
            }
            drop(busy);
            response
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // hyper's one timer runs from when it waits for a head, so it is the idle timeout; the
    // head's own bound (from its first byte) is kept below, by `Watched`.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout.max(limits.header_read_timeout))
        .keep_alive(true);
    let watched = Watched {
        io,
        conn: conn.clone(),
    };
    let served = builder.serve_connection(TokioIo::new(watched), service);
    let mut served = std::pin::pin!(served);
    let mut deadline: Option<Instant> = None;
    let mut head_deadline: Option<Instant> = None;
    let mut close_idle_at: Option<Instant> = None;
    loop {
        tokio::select! {
            r = served.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection closed with an error");
                }
                return;
            }
            _ = conn.head_begun.notified() => {
                head_deadline = conn.head_since().map(|t| t + limits.header_read_timeout);
            }
            _ = sleep_until(head_deadline), if head_deadline.is_some() => {
                match conn.head_since() {
                    Some(t) if t + limits.header_read_timeout <= Instant::now() => {
                        tracing::debug!(%peer, "request head timed out");
                        return;
                    }
                    since => head_deadline = since.map(|t| t + limits.header_read_timeout),
                }
            }
            _ = conn.evict.notified(), if deadline.is_none() => {
                served.as_mut().graceful_shutdown();
                // A request that arrived since the eviction was chosen may finish.
                let grace = if conn.busy.load(Ordering::Acquire) == 0 {
                    EVICT_GRACE
                } else {
                    limits.shutdown_grace
                };
                deadline = Some(Instant::now() + grace);
            }
            _ = ends.stop.cancelled(), if deadline.is_none() => {
                // A connection with a request in flight (or a head arriving) ends after its
                // `Connection: close` answer. An idle one is closed now, except one opened
                // within FRESH_CONNECTION_WINDOW and not used yet: its client has most likely
                // dialed it for a request it is about to send.
                let fresh_until = conn.opened + FRESH_CONNECTION_WINDOW;
                let used = conn.requests.load(Ordering::Acquire) > 0;
                close_idle_at = Some(if used { Instant::now() } else { fresh_until });
                deadline = Some(Instant::now() + limits.shutdown_grace);
            }
            _ = sleep_until(close_idle_at), if close_idle_at.is_some() => {
                close_idle_at = None;
                if conn.busy.load(Ordering::Acquire) == 0 && conn.head_since().is_none() {
                    served.as_mut().graceful_shutdown();
                }
            }
            _ = sleep_until(deadline), if deadline.is_some() => return,
        }
    }
}

/// A connection's byte stream, noting when the first byte of a request head arrives (a read
/// while no request is in flight), so a head that trickles in is cut off.
struct Watched<I> {
    io: I,
    conn: Arc<Conn>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.conn.head_arrived();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The open connections, so the accept loop can pick the longest-idle one at the cap.
#[derive(Default)]
struct Registry {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
}

struct Conn {
    id: u64,
    /// Requests in flight.
    busy: AtomicUsize,
    /// Requests begun on this connection.
    requests: AtomicU64,
    /// When it was accepted.
    opened: Instant,
    /// Since when no request has been in flight.
    idle_since: Mutex<Instant>,
    /// When the first byte of a request head not yet parsed arrived.
    head_since: Mutex<Option<Instant>>,
    head_begun: Notify,
    evict: Notify,
}

impl Conn {
    fn head_since(&self) -> Option<Instant> {
        self.head_since.lock().ok().and_then(|t| *t)
    }

    /// Bytes arrived: with no request in flight they begin a head, and its clock starts.
    fn head_arrived(&self) {
        if self.busy.load(Ordering::Acquire) > 0 {
            return;
        }
        if let Ok(mut since) = self.head_since.lock() {
            if since.is_none() {
                *since = Some(Instant::now());
                self.head_begun.notify_one();
            }
        }
    }
}

impl Registry {
    fn register(&self) -> Arc<Conn> {
        let conn = Arc::new(Conn {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            busy: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            opened: Instant::now(),
            idle_since: Mutex::new(Instant::now()),
            head_since: Mutex::new(None),
            head_begun: Notify::new(),
            evict: Notify::new(),
        });
        if let Ok(mut open) = self.open.lock() {
            open.insert(conn.id, conn.clone());
        }
        conn
    }

    fn remove(&self, id: u64) {
        if let Ok(mut open) = self.open.lock() {
            open.remove(&id);
        }
    }

    /// Tells the connection idle the longest to close; it leaves the registry at once so the
    /// next eviction picks another. False when every connection has a request in flight.
    fn evict_longest_idle(&self) -> bool {
        let Ok(mut open) = self.open.lock() else {
            return false;
        };
        let oldest = open
            .values()
            .filter(|c| c.busy.load(Ordering::Acquire) == 0)
            .filter_map(|c| c.idle_since.lock().ok().map(|t| (*t, c.id)))
            .min();
        match oldest.and_then(|(_, id)| open.remove(&id)) {
            Some(conn) => {
                conn.evict.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Marks its connection busy while a request is in flight.
struct Busy(Arc<Conn>);

impl Busy {
    fn new(conn: Arc<Conn>) -> Self {
        conn.busy.fetch_add(1, Ordering::AcqRel);
        conn.requests.fetch_add(1, Ordering::AcqRel);
        if let Ok(mut since) = conn.head_since.lock() {
            *since = None;
        }
        Busy(conn)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Ok(mut t) = self.0.idle_since.lock() {
                *t = Instant::now();
            }
        }
    }
}

#[cfg(test)]
#[path = "serve_tests.rs"]
mod tests;
