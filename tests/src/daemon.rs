//! Child processes of the end-to-end tests: railguard's real binaries, logging to a file,
//! stopped when the test ends.

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
