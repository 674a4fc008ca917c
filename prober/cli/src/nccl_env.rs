//! `railguard-prober nccl-env`: what the NCCL environment plugin would answer in this
//! container, computed by the plugin's own rules (`railguard_nccl_env::answer`) from the same
//! node file, this container's `/sys/class/infiniband` and this process' GPU visibility. For
//! `kubectl exec` into a training pod, and for preflight.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueHint};
use railguard_nccl_env::{answer, load, Answers, Config, Level, OnUnhealthy, DEFAULT_NODE_FILE};
use serde::Serialize;

use crate::{Outcome, Status};

/// `railguard-prober nccl-env [--config FILE] [--sysfs-root DIR] [--json]`
#[derive(Args, Debug, Clone)]
pub struct NcclEnvArgs {
    /// The node file the plugin reads (written by the prober daemon's --nccl-config-file).
    #[arg(long, env = "RAILGUARD_NCCL_CONFIG", default_value = DEFAULT_NODE_FILE, value_hint = ValueHint::FilePath)]
    pub config: PathBuf,
    /// Root the container's `sys/class/infiniband` is read under (`/` in a pod; a synthetic
    /// tree in tests).
    #[arg(long, env = "RAILGUARD_SYSFS_ROOT", default_value = "/")]
    pub sysfs_root: PathBuf,
    /// Print `{"variables", "warnings", "info", "unhealthy", "nodeFile"}` as JSON instead of
    /// `NAME=value` lines.
    #[arg(long, env = "RAILGUARD_JSON")]
    pub json: bool,
}

/// `nccl-env --json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclEnvReport {
    /// What the plugin answers itself; every other variable is the process environment's.
    pub variables: std::collections::BTreeMap<String, String>,
    pub warnings: Vec<String>,
    /// The plugin's info lines (rails left out and why, values kept or replaced).
    pub info: Vec<String>,
    /// The certificate is failed, pending or expired, or no rail is usable here: the plugin
    /// answers nothing (`onUnhealthy: Warn`) or fails NCCL's init (`Fail`).
    pub unhealthy: bool,
    pub node_file: PathBuf,
}

/// Pure: the report of the plugin's answers, and whether they are unhealthy.
pub fn report(answers: &Answers, unhealthy: bool, node_file: PathBuf) -> NcclEnvReport {
    let of = |level| {
        answers
            .messages
            .iter()
            .filter(|m| m.level == level)
            .map(|m| m.text.clone())
            .collect()
    };
    NcclEnvReport {
        variables: answers.values.clone(),
        warnings: of(Level::Warn),
        info: of(Level::Info),
        unhealthy,
        node_file,
    }
}

impl NcclEnvArgs {
    /// Exit 0 with the answers, 1 when they are unhealthy, 2 when the node file or the
    /// sysfs cannot be read (the plugin would then answer nothing, with one warning).
    pub fn run(&self) -> anyhow::Result<Outcome> {
        let config = Config {
            node_file: self.config.clone(),
            sysfs_root: self.sysfs_root.clone(),
        };
        let (node_file, view) = load(&config).with_context(|| {
            format!(
                "cannot answer from node file {} (--config) and {} (--sysfs-root)",
                self.config.display(),
                self.sysfs_root.join("sys/class/infiniband").display()
            )
        })?;
        let env = |k: &str| std::env::var(k).ok();
        let now = jiff::Timestamp::now();
        let answers = answer(&node_file, &view, &env, now);
        // Unhealthy is what `onUnhealthy: Fail` fails on: asking the same rules under Fail
        // says so without restating them here.
        let mut strict = node_file.clone();
        strict.nccl.on_unhealthy = OnUnhealthy::Fail;
        let unhealthy = answer(&strict, &view, &env, now).init_error.is_some();
        let r = report(&answers, unhealthy, self.config.clone());
        let text = if self.json {
            let mut s = serde_json::to_string_pretty(&r).context("cannot encode JSON")?;
            s.push('\n');
            s
        } else {
            for w in &r.warnings {
                eprintln!("warning: {w}");
            }
            for i in &r.info {
                eprintln!("info: {i}");
            }
            r.variables
                .iter()
                .map(|(k, v)| format!("{k}={v}\n"))
                .collect()
        };
        Ok(Outcome::new(text, Status::fail_if(unhealthy)))
    }
}
