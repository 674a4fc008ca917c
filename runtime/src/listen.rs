//! Listeners bound with a [`StartupError`] that names the address, what it is for and its
//! flag.

use std::fmt::Display;
use std::io;
use std::net::{TcpListener, ToSocketAddrs};

use crate::error::{describe_io, StartupError};

/// Binds `addr` for `purpose` (`admission requests`, `metrics`), set by `flag`. The listener
/// is non-blocking, ready for `tokio::net::TcpListener::from_std` or axum-server.
pub fn bind<A: ToSocketAddrs + Display>(
    addr: A,
    purpose: &str,
    flag: &str,
) -> Result<TcpListener, StartupError> {
    let failed = |e: &io::Error| listen_error(&addr, purpose, flag, e);
    let listener = TcpListener::bind(&addr).map_err(|e| failed(&e))?;
    listener.set_nonblocking(true).map_err(|e| failed(&e))?;
    Ok(listener)
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
