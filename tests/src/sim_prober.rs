//! The real `railguard-prober` binary on simulated nodes (synthetic sysfs, the simulated
//! RDMA engine, the `all_reduce_perf_sim` child process), as the end-to-end tests run it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::workspace_root;

/// Builds the prober binaries (no-op when fresh) and returns the directory holding them.
pub fn prober_bin_dir() -> Result<PathBuf> {
    // tests/scripts/test-all.sh builds every binary first; a nested `cargo build -p` would
    // resolve features differently and rebuild half the dependency tree.
    if let Ok(dir) = std::env::var("RAILGUARD_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "-p",
            "railguard-prober-cli",
            "-p",
            "railguard-sim",
            "--bins",
        ])
        .current_dir(workspace_root())
        .status()
        .context("building railguard-prober and all_reduce_perf_sim")?;
    if !status.success() {
        bail!("cargo build -p railguard-prober-cli -p railguard-sim failed");
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("target"));
    Ok(target.join("debug"))
}

/// Sends SIGTERM to `child`, as the kubelet stops a pod, and waits up to `within` for it to
/// exit; its exit status.
pub async fn terminate(
    child: &mut tokio::process::Child,
    within: std::time::Duration,
) -> Result<std::process::ExitStatus> {
    let pid = child.id().context("the child has exited")?;
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    Ok(tokio::time::timeout(within, child.wait()).await??)
}

/// The DGX H100 NDR fixture profile the simulated `dgx-h100` model certifies against.
pub fn h100_profile_file() -> PathBuf {
    workspace_root().join("api/fixtures/profiles/dgx-h100-ndr.yaml")
}

/// Runs the real `railguard-prober` on simulated nodes: `--sim MODEL`, a sysfs tree per node
/// under `work`, the profile from `profile_file`, publishing through `kubeconfig`.
pub struct Prober<'a> {
    pub bin: PathBuf,
    pub kubeconfig: &'a Path,
    pub work: &'a Path,
    pub profile_file: PathBuf,
}

impl Prober<'_> {
    /// `railguard-prober SUB` for `node` simulated as `model`, through the prober's kubeconfig.
    pub fn command(&self, sub: &str, node: &str, model: &str) -> tokio::process::Command {
        self.command_with(sub, node, model, self.kubeconfig)
    }

    /// `railguard-prober daemon` on `node` that checks passively every second (700 ms
    /// windows), leaves invasive runs to its first step (an hour apart), polls every 200 ms
    /// without jitter and serves metrics on a port of its own choosing (read back from its
    /// log).
    pub fn passive_daemon(&self, node: &str, model: &str) -> tokio::process::Command {
        let mut c = self.command("daemon", node, model);
        c.args([
            "--passive-interval-secs",
            "1",
            "--interval-secs",
            "3600",
            "--window-ms",
            "700",
            "--poll-ms",
            "200",
            "--jitter-percent",
            "0",
        ])
        .arg("--metrics-listen")
        .arg(crate::daemon::ANY_LOOPBACK_PORT);
        c
    }

    /// [`Prober::command`] through `kubeconfig` instead: the same node under another identity
    /// (one RBAC forbids something, say).
    pub fn command_with(
        &self,
        sub: &str,
        node: &str,
        model: &str,
        kubeconfig: &Path,
    ) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(self.bin.join("railguard-prober"));
        c.arg(sub)
            .args(["--node", node, "--sim", model])
            .arg("--profile-file")
            .arg(&self.profile_file)
            .arg("--models-dir")
            .arg(workspace_root().join("prober/models"))
            .arg("--sysfs-root")
            .arg(self.work.join(format!("sysfs-{node}")))
            .arg("--log-dir")
            .arg(self.work.join("logs"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("RAILGUARD_LOG", "info")
            .kill_on_drop(true);
        c
    }

    /// `certify --publish` through `kubeconfig`, whatever it exits with: for tests of the
    /// errors (exit 2) themselves.
    pub async fn certify_output(
        &self,
        node: &str,
        model: &str,
        kubeconfig: &Path,
    ) -> Result<std::process::Output> {
        self.command_with("certify", node, model, kubeconfig)
            .arg("--publish")
            .output()
            .await
            .context("running railguard-prober certify")
    }

    /// `certify --publish`; returns the exit code and the printed matrix.
    pub async fn certify(&self, node: &str, model: &str) -> Result<(i32, String)> {
        let out = self.certify_output(node, model, self.kubeconfig).await?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.code() == Some(2) {
            bail!(
                "certify {node} errored: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok((out.status.code().unwrap_or(-1), stdout))
    }
}
