//! The one way every railguard listener serves HTTP (webhook, extender, their metrics ports,
//! the prober's metrics): HTTP/1.1 through hyper with a timer, so the header-read timeout
//! fires, a bounded TLS handshake, a connection cap, and graceful shutdown.
//!
//! A slow client holds neither a socket nor a task for long: the TLS handshake and the
//! request head (also the wait for the next request on a kept-alive connection) each get
//! `header_read_timeout`; the body and the handler get the request timeout
//! ([`limit_requests`]). At `max_connections` the longest-idle connection (no request in
//! flight: handshaking, sending a head slowly, or kept alive) is closed to make room, so a
//! flood of idle or slow connections cannot lock a legitimate client out. Only when every
//! connection has a request in flight does a new one wait (up to [`ADMISSION_WAIT`]) and is
//! then refused.
//!
//! HTTP/2 is not served: a TLS config handed here must offer ALPN `http/1.1` (or none).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
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
/// How long an evicted idle connection gets to close on its own before it is dropped.
const EVICT_GRACE: Duration = Duration::from_millis(200);

/// Connection-level limits of one listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// Bound on the TLS handshake, on reading a request head, and on a kept-alive
    /// connection's wait for its next request.
    pub header_read_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// How long shutdown lets requests in flight finish.
    pub shutdown_grace: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 512,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

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
    /// Seconds a client gets for the TLS handshake and each request head (and a kept-alive
    /// connection to send its next request) before the connection is closed.
    #[arg(
        long,
        env = "RAILGUARD_HEADER_READ_TIMEOUT_SECONDS",
        default_value_t = 10
    )]
    pub header_read_timeout_seconds: u64,
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

/// A started [`serve`]: its address, and the token that stops it.
#[derive(Debug)]
pub struct Served {
    pub addr: SocketAddr,
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
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        serve(listener, router, tls, limits, stopped.cancelled_owned()).await
    });
    Ok(Served { addr, stop, task })
}

/// Serves `router` on `listener` (TLS when `tls` is given) until `shutdown` resolves, then
/// stops accepting, lets requests in flight finish within `limits.shutdown_grace` and
/// returns. Errors only when the listener cannot be used; a failed connection is logged.
pub async fn serve(
    listener: std::net::TcpListener,
    router: Router,
    tls: Option<TlsConfigSource>,
    limits: ServeLimits,
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
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
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
        tokio::spawn(async move {
            connection(tcp, peer, tls, router, &limits, &conn, &stop).await;
            registry.remove(conn.id);
            drop(permit);
        });
    }
    drop(listener);
    stop.cancel();
    // Every connection gives its slot back once it has closed (each is bounded by the grace).
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let grace = limits.shutdown_grace + EVICT_GRACE + Duration::from_millis(100);
    let _ = tokio::time::timeout(grace, slots.acquire_many(all)).await;
    Ok(())
}

/// One connection: the TLS handshake (bounded), then HTTP/1.1 until it closes, is evicted
/// or the server stops.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsConfigSource>,
    router: Router,
    limits: &ServeLimits,
    conn: &Arc<Conn>,
    stop: &CancellationToken,
) {
    let _ = tcp.set_nodelay(true);
    match tls {
        None => http(tcp, peer, router, limits, conn, stop).await,
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
                _ = stop.cancelled() => return,
            };
            http(stream, peer, router, limits, conn, stop).await
        }
    }
}

async fn http<I>(
    io: I,
    peer: SocketAddr,
    router: Router,
    limits: &ServeLimits,
    conn: &Arc<Conn>,
    stop: &CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tracked = conn.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let busy = Busy::new(tracked.clone());
        let router = router.clone();
        async move {
            let response = router.oneshot(req.map(axum::body::Body::new)).await;
            drop(busy);
            response
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let served = builder.serve_connection(TokioIo::new(io), service);
    let mut served = std::pin::pin!(served);
    let mut deadline: Option<Instant> = None;
    loop {
        tokio::select! {
            r = served.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection closed with an error");
                }
                return;
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
            _ = stop.cancelled(), if deadline.is_none() => {
                served.as_mut().graceful_shutdown();
                deadline = Some(Instant::now() + limits.shutdown_grace);
            }
            _ = sleep_until(deadline), if deadline.is_some() => return,
        }
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
    /// Since when no request has been in flight.
    idle_since: Mutex<Instant>,
    evict: Notify,
}

impl Registry {
    fn register(&self) -> Arc<Conn> {
        let conn = Arc::new(Conn {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
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
