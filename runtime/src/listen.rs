//! Listeners bound with a [`StartupError`] that names the address, what it is for and its
//! flag.

use std::fmt::Display;
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};

use crate::error::{describe_io, StartupError};

/// Binds `addr` for `purpose` (`admission requests`, `metrics`), set by `flag`. The listener
/// is non-blocking, ready for `tokio::net::TcpListener::from_std` or axum-server. Logs the
/// bound address (`listening`, with `purpose`, `flag` and `addr`): with port 0 the kernel
/// chooses the port, and that line is how an operator or a test learns it.
pub fn bind<A: ToSocketAddrs + Display>(
    addr: A,
    purpose: &str,
    flag: &str,
) -> Result<TcpListener, StartupError> {
    let failed = |e: &io::Error| listen_error(&addr, purpose, flag, e);
    let listener = TcpListener::bind(&addr).map_err(|e| failed(&e))?;
    listener.set_nonblocking(true).map_err(|e| failed(&e))?;
    let bound = listener.local_addr().map_err(|e| failed(&e))?;
    tracing::info!(purpose, flag, addr = %bound, "listening");
    Ok(listener)
}

/// The address that the `listening` line of [`bind`] gives for `flag`, found in `log` (the
/// lines a railguard binary wrote, text or JSON format); `None` while there is none. How a
/// supervisor or a test learns the port the kernel chose for port 0.
pub fn logged_listen_addr(log: &str, flag: &str) -> Option<SocketAddr> {
    log.lines().find_map(|line| {
        let line = line.trim();
        if line.starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(line).ok()?;
            let fields = &v["fields"];
            (fields["message"] == "listening" && fields["flag"] == flag)
                .then(|| fields["addr"].as_str()?.parse().ok())
                .flatten()
        } else if line.contains(" listening ") && line.contains(&format!("flag=\"{flag}\"")) {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix("addr="))
                .and_then(|a| a.trim_matches('"').parse().ok())
        } else {
            None
        }
    })
}

fn listen_error(addr: &dyn Display, purpose: &str, flag: &str, e: &io::Error) -> StartupError {
    let fix = match e.kind() {
        io::ErrorKind::AddrInUse => {
            "free the port (another process, or a second copy of this one, holds it) or choose another"
                .to_string()
        }
        io::ErrorKind::PermissionDenied => {
            "use a port above 1023 or grant CAP_NET_BIND_SERVICE".to_string()
        }
        io::ErrorKind::AddrNotAvailable => {
            "use an address of this host, or 0.0.0.0 for all of them".to_string()
        }
        _ => format!("check {flag} (HOST:PORT)"),
    };
    StartupError::new(
        format!("cannot listen on {addr} for {purpose} ({flag})"),
        describe_io(e),
        fix,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_in_use_names_address_purpose_and_flag() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = bind(addr, "metrics", "--metrics-listen").err();
        let line = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            line.starts_with(&format!(
                "cannot listen on {addr} for metrics (--metrics-listen): address already in use — free the port"
            )),
            "{line}"
        );
        assert!(bind("127.0.0.1:0", "metrics", "--metrics-listen").is_ok());
    }

    /// What `bind` logs, through the subscriber every binary installs, in both formats.
    fn logged_by_bind(json: bool) -> (String, SocketAddr, SocketAddr) {
        #[derive(Clone, Default)]
        struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl io::Write for Buffer {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0
                    .lock()
                    .map_err(|_| io::ErrorKind::Other)?
                    .extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let builder = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false);
        let run = || {
            let a = bind("127.0.0.1:0", "admission requests", "--listen").unwrap();
            let m = bind("127.0.0.1:0", "metrics and health", "--metrics-listen").unwrap();
            (a.local_addr().unwrap(), m.local_addr().unwrap())
        };
        let (a, m) = if json {
            tracing::subscriber::with_default(builder.json().finish(), run)
        } else {
            tracing::subscriber::with_default(builder.finish(), run)
        };
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        (text, a, m)
    }

    #[test]
    fn the_listening_line_gives_back_each_bound_port_in_text_and_json() {
        for json in [false, true] {
            let (log, a, m) = logged_by_bind(json);
            assert_ne!(a.port(), 0);
            assert_eq!(logged_listen_addr(&log, "--listen"), Some(a), "{log}");
            assert_eq!(
                logged_listen_addr(&log, "--metrics-listen"),
                Some(m),
                "{log}"
            );
            assert_eq!(logged_listen_addr(&log, "--peer-listen"), None, "{log}");
        }
        assert_eq!(
            logged_listen_addr("x: listening flag=\"--listen\" addr=junk", "--listen"),
            None
        );
    }

    #[test]
    fn a_malformed_address_is_named() {
        let err = bind("not-an-address", "the peer endpoint", "--listen").err();
        let line = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            line.starts_with("cannot listen on not-an-address for the peer endpoint (--listen): ")
                && line.ends_with("check --listen (HOST:PORT)"),
            "{line}"
        );
    }
}
