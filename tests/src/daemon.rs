//! Child processes of the end-to-end tests: railguard's real binaries, logging to a file,
//! stopped when the test ends.
// Test harness: a daemon that cannot start or be watched fails the test where it happens.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A child process stopped when the test ends, panicking or not.
pub struct Daemon {
    pub name: &'static str,
    pub child: Child,
}

impl Daemon {
    pub fn spawn(name: &'static str, cmd: &mut Command, log_dir: &Path) -> Daemon {
        let log = std::fs::File::create(log_dir.join(format!("{name}.log"))).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Daemon { name, child }
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
pub async fn wait_ready(url: &str, what: &str, daemon: &mut Daemon, log_dir: &Path) {
    for _ in 0..300 {
        daemon.assert_running(log_dir);
        if let Ok(r) = reqwest::get(url).await {
            if r.status().is_success() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what} not ready at {url}; see {}", log_dir.display());
}

/// `railguard-extender` as the chart runs it: serving TLS with `tls`'s loopback pair and
/// accepting only clients with a certificate from its CA (the scheduler's), against
/// `kubeconfig`, with `extra` arguments. Returns the daemon, its HTTPS URL and the URL of
/// its plain metrics and health port.
pub fn spawn_extender(
    bin: &Path,
    kubeconfig: &Path,
    tls: &crate::ServingCertificate,
    log_dir: &Path,
    extra: &[&str],
) -> anyhow::Result<(Daemon, String, String)> {
    let (cert, key) = tls.write_pair(log_dir)?;
    let (ca, _, _) = tls.write_client(log_dir)?;
    let (port, metrics) = (crate::free_port()?, crate::free_port()?);
    let daemon = Daemon::spawn(
        "railguard-extender",
        Command::new(bin)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg(format!("--listen=127.0.0.1:{port}"))
            .arg(format!("--metrics-listen=127.0.0.1:{metrics}"))
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .arg("--tls-client-ca")
            .arg(ca)
            .args(extra),
        log_dir,
    );
    Ok((
        daemon,
        format!("https://127.0.0.1:{port}"),
        format!("http://127.0.0.1:{metrics}"),
    ))
}
