#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use axum::body::Bytes;
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

fn router() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/echo", post(|body: Bytes| async move { body }))
}

fn limits(max_connections: usize) -> ServeLimits {
    ServeLimits {
        header_read_timeout: Duration::from_millis(500),
        max_connections,
        shutdown_grace: Duration::from_secs(1),
    }
}

fn start(router: Router, limits: ServeLimits, tls: Option<TlsConfigSource>) -> Served {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    spawn_serve(listener, router, tls, limits).unwrap()
}

/// Reads until the peer closes; the bytes read.
async fn read_to_close(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    tokio::time::timeout(within, s.read_to_end(&mut out))
        .await
        .ok()
        .map(|r| {
            r.ok();
            out
        })
}

async fn get_ok(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let out = read_to_close(&mut s, Duration::from_secs(2)).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_slow_head_is_cut_off_by_the_header_timeout() {
    let served = start(router(), limits(8), None);
    let mut s = TcpStream::connect(served.addr).await.unwrap();
    s.write_all(b"GET / HT").await.unwrap();
    let start = Instant::now();
    let out = read_to_close(&mut s, Duration::from_secs(3)).await;
    assert!(out.is_some(), "the connection stayed open");
    assert!(start.elapsed() < Duration::from_secs(2));
    // An idle connection that never sends a byte is closed the same way.
    let mut idle = TcpStream::connect(served.addr).await.unwrap();
    assert!(read_to_close(&mut idle, Duration::from_secs(3))
        .await
        .is_some());
    assert!(get_ok(served.addr).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn at_the_cap_the_longest_idle_connection_makes_room() {
    let served = start(router(), limits(4), None);
    let mut idle = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(served.addr).await.unwrap();
        s.write_all(b"G").await.unwrap();
        idle.push(s);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let start = Instant::now();
    let answer = get_ok(served.addr).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        start.elapsed() < Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_slow_body_is_cut_off_by_the_request_timeout() {
    let app = limit_requests(
        router(),
        &RequestLimits {
            timeout: Duration::from_millis(300),
            max_in_flight: 4,
        },
    );
    let served = start(app, limits(8), None);
    let mut s = TcpStream::connect(served.addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nab")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
}

#[tokio::test]
async fn a_silent_tls_client_is_dropped_after_the_handshake_timeout() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.key_pair.serialize_der()).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap(),
    );
    let tls: TlsConfigSource = Arc::new(move || config.clone());
    let served = start(router(), limits(8), Some(tls));
    let mut s = TcpStream::connect(served.addr).await.unwrap();
    let start = Instant::now();
    assert!(read_to_close(&mut s, Duration::from_secs(3))
        .await
        .is_some());
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn shutdown_finishes_and_returns() {
    let served = start(router(), limits(8), None);
    assert!(get_ok(served.addr).await.starts_with("HTTP/1.1 200"));
    let _idle = TcpStream::connect(served.addr).await.unwrap();
    served.stop.cancel();
    tokio::time::timeout(Duration::from_secs(3), served.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
