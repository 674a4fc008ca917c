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
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(400)).await;
                "slow"
            }),
        )
        .route("/echo", post(|body: Bytes| async move { body }))
}

fn limits(max_connections: usize) -> ServeLimits {
    ServeLimits {
        header_read_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_millis(1500),
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
    // A connection that never sends a byte is closed at the idle timeout.
    let mut idle = TcpStream::connect(served.addr).await.unwrap();
    let start = Instant::now();
    assert!(read_to_close(&mut idle, Duration::from_secs(4))
        .await
        .is_some());
    assert!(
        start.elapsed() >= Duration::from_millis(1400),
        "{:?}",
        start.elapsed()
    );
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

/// Sends a keep-alive GET on `s` and reads its whole answer (the body ends with `body`).
async fn keep_alive_get(s: &mut TcpStream, path: &str, body: &str) -> String {
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    let answer = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            let n = s.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before the answer: {:?}",
                String::from_utf8_lossy(&out)
            );
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out).into_owned();
            if text.contains("\r\n\r\n") && text.ends_with(body) {
                return text;
            }
        }
    });
    answer.await.unwrap()
}

/// Whether the peer closed `s` within `within` (without sending anything).
async fn closes_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(within, s.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(n)) => panic!("unexpected bytes: {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(_) => false,
    }
}

#[tokio::test]
async fn a_kept_alive_connection_waits_past_the_header_timeout_until_the_idle_timeout() {
    let served = start(router(), limits(8), None);
    let mut s = TcpStream::connect(served.addr).await.unwrap();
    assert!(keep_alive_get(&mut s, "/", "ok")
        .await
        .starts_with("HTTP/1.1 200"));
    // Idle longer than the header timeout: still open, and the next request is answered.
    assert!(!closes_within(&mut s, Duration::from_millis(800)).await);
    let again = keep_alive_get(&mut s, "/", "ok").await;
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    assert!(
        !again.to_ascii_lowercase().contains("connection: close"),
        "{again}"
    );
    // Then the idle timeout closes it.
    assert!(closes_within(&mut s, Duration::from_secs(3)).await);
}

#[tokio::test]
async fn while_draining_each_response_closes_its_connection_and_nothing_closes_between_requests() {
    let served = start(router(), limits(8), None);
    let mut kept = TcpStream::connect(served.addr).await.unwrap();
    let first = keep_alive_get(&mut kept, "/", "ok").await;
    assert!(
        !first.to_ascii_lowercase().contains("connection: close"),
        "{first}"
    );
    served.drain.cancel();
    // The kept-alive connection is not closed under its client between two requests ...
    assert!(!closes_within(&mut kept, Duration::from_millis(300)).await);
    // ... its next request is answered, saying close, and then it ends.
    let last = keep_alive_get(&mut kept, "/", "ok").await;
    assert!(last.starts_with("HTTP/1.1 200"), "{last}");
    assert!(
        last.to_ascii_lowercase().contains("connection: close"),
        "{last}"
    );
    assert!(closes_within(&mut kept, Duration::from_secs(1)).await);
    // New connections are still accepted (the endpoint update may not have arrived) and
    // each serves its request with close.
    let mut late = TcpStream::connect(served.addr).await.unwrap();
    let answer = keep_alive_get(&mut late, "/", "ok").await;
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    assert!(closes_within(&mut late, Duration::from_secs(1)).await);
    // A request in flight when the drain began closes its connection too.
    let served = start(router(), limits(8), None);
    let mut busy = TcpStream::connect(served.addr).await.unwrap();
    let drain = served.drain.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        drain.cancel();
    });
    let slow = keep_alive_get(&mut busy, "/slow", "slow").await;
    assert!(
        slow.to_ascii_lowercase().contains("connection: close"),
        "{slow}"
    );
}

#[tokio::test]
async fn stop_finishes_requests_in_flight_and_serves_connections_opened_for_one() {
    let served = start(
        router(),
        ServeLimits {
            shutdown_grace: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(10),
            ..limits(8)
        },
        None,
    );
    let mut idle = TcpStream::connect(served.addr).await.unwrap();
    assert!(keep_alive_get(&mut idle, "/", "ok")
        .await
        .starts_with("HTTP/1.1 200"));
    let mut fresh = TcpStream::connect(served.addr).await.unwrap();
    let mut silent = TcpStream::connect(served.addr).await.unwrap();
    let mut busy = TcpStream::connect(served.addr).await.unwrap();
    busy.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    served.stop.cancel();
    // Idle since before: closed at once. Busy: answered, with close. Fresh: its request
    // (written after the stop) is answered.
    assert!(closes_within(&mut idle, Duration::from_millis(500)).await);
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), busy.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let slow = String::from_utf8_lossy(&out);
    assert!(
        slow.starts_with("HTTP/1.1 200") && slow.ends_with("slow"),
        "{slow}"
    );
    assert!(
        slow.to_ascii_lowercase().contains("connection: close"),
        "{slow}"
    );
    let answer = keep_alive_get(&mut fresh, "/", "ok").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        TcpStream::connect(served.addr).await.is_err(),
        "still accepting"
    );
    // A fresh connection that sends nothing is closed once it is a second old, well before
    // the 5 s grace ends; then nothing is left and the server returns.
    assert!(closes_within(&mut silent, Duration::from_millis(1500)).await);
    tokio::time::timeout(Duration::from_secs(1), served.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
