//! `railguard-prober preflight`: the in-pod check the webhook adds as an init container.

use std::path::PathBuf;

use anyhow::Context;
use railguard_prober::preflight::{check, env_of, gather, passed, render};

use crate::{Outcome, Status};

/// `railguard-prober preflight`.
#[derive(clap::Args, Debug)]
pub struct PreflightArgs {
    /// Root of the container's filesystem view (tests use a fake tree).
    #[arg(long, env = "RAILGUARD_PREFLIGHT_ROOT", default_value = "/")]
    pub root: PathBuf,
    /// Print the checks as JSON on stdout, passed or not (keys: docs/reference.md, "JSON output").
    #[arg(long, env = "RAILGUARD_JSON")]
    pub json: bool,
}

impl PreflightArgs {
    /// Runs every check. A failed one is exit status 1; its text report goes to stderr (the
    /// init container's log ends with the reason), JSON always to stdout.
    pub fn run(&self) -> anyhow::Result<Outcome> {
        let checks = check(&gather(&self.root, env_of(std::env::vars())));
        let text = render(&checks, self.json).context("cannot encode JSON")?;
        let status = Status::fail_if(!passed(&checks));
        Ok(Outcome {
            text,
            status,
            on_stderr: status == Status::Fail && !self.json,
        })
    }
}
