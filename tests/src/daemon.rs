//! Child processes of the end-to-end tests: railguard's real binaries, logging to a file,
//! stopped when the test ends.
// Test harness: a daemon that cannot start or be watched fails the test where it happens.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub use crate::ports::ANY_LOOPBACK_PORT;

/// How long a daemon may take to bind its listeners (a loaded 2-core machine is slow).
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);

/// A child process stopped when the test ends, panicking or not.
pub struct Daemon {
    pub name: &'static str,
    pub child: Child,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

impl Daemon {
    pub fn spawn(name: &'static str, cmd: &mut Command, log_dir: &Path) -> Daemon {
        let path = log_dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&path).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Daemon {
            name,
            child,
            log: path,
        }
    }

    /// Where the listener set by `flag` (`--listen`, `--metrics-listen`) listens, from the
    /// `listening` line the binary logs when it binds (it was given port 0).
    pub async fn listen_addr(&mut self, flag: &str) -> SocketAddr {
        crate::ports::logged_listen_addr(&mut self.child, &self.log, flag, LISTEN_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", self.name))
    }

    pub fn assert_running(&mut self, log_dir: &Path) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "{} exited with {status}; see {}/{}.log",
                self.name,
                log_dir.display(),
                self.name
            );
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `url` answers 2xx, failing as soon as the daemon exits.
/// On timeout it says what the URL last answered.
pub async fn wait_ready(url: &str, what: &str, daemon: &mut Daemon, log_dir: &Path) {
    const READY_TIMEOUT: Duration = Duration::from_secs(60);
    let start = std::time::Instant::now();
    let mut last = String::from("nothing yet");
    while start.elapsed() < READY_TIMEOUT {
        daemon.assert_running(log_dir);
        match reqwest::get(url).await {
            Ok(r) if r.status().is_success() => return,
            Ok(r) => {
                let status = r.status();
                last = format!("{status}: {}", r.text().await.unwrap_or_default());
            }
            Err(e) => last = format!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "{what} not ready at {url} after {READY_TIMEOUT:?}; it last answered {last}; see {}",
        log_dir.display()
    );
}

/// `railguard-extender` as the chart runs it: serving TLS with `tls`'s loopback pair and
/// accepting only clients with a certificate from its CA (the scheduler's), against
/// `kubeconfig`, with `extra` arguments, once it answers `/readyz`. Returns the daemon, its
/// HTTPS URL and the URL of its plain metrics and health port.
pub async fn spawn_extender(
    bin: &Path,
    kubeconfig: &Path,
    tls: &crate::ServingCertificate,
    log_dir: &Path,
    extra: &[&str],
) -> anyhow::Result<(Daemon, String, String)> {
    let (cert, key) = tls.write_pair(log_dir)?;
    let (ca, _, _) = tls.write_client(log_dir)?;
    let mut daemon = Daemon::spawn(
        "railguard-extender",
        Command::new(bin)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg(format!("--listen={ANY_LOOPBACK_PORT}"))
            .arg(format!("--metrics-listen={ANY_LOOPBACK_PORT}"))
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .arg("--tls-client-ca")
            .arg(ca)
            .args(extra),
        log_dir,
    );
    let port = daemon.listen_addr("--listen").await.port();
    let metrics = format!(
        "http://127.0.0.1:{}",
        daemon.listen_addr("--metrics-listen").await.port()
    );
    wait_ready(
        &format!("{metrics}/readyz"),
        "railguard-extender",
        &mut daemon,
        log_dir,
    )
    .await;
    Ok((daemon, format!("https://127.0.0.1:{port}"), metrics))
}
