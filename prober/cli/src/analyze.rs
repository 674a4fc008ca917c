//! `railguard-prober analyze`: offline analysis of nccl-tests output and NCCL debug logs.

use anyhow::Context;
use railguard_prober::analyze::{analyze_files, render_report, AnalyzeInputs, AnalyzeVerdict};

use crate::{Outcome, Status};

/// `railguard-prober analyze [--nccl-tests FILE] [--nccl-log FILE]... [--profile-file FILE [--profile NAME]] [--json]`
#[derive(clap::Args, Debug, Clone)]
pub struct AnalyzeArgs {
    /// nccl-tests output (may also hold NCCL INFO lines).
    #[arg(long = "nccl-tests", env = "RAILGUARD_NCCL_TESTS", value_hint = clap::ValueHint::FilePath)]
    pub nccl_tests: Option<std::path::PathBuf>,
    /// NCCL debug log (repeatable; may also hold nccl-tests output).
    #[arg(long = "nccl-log", env = "RAILGUARD_NCCL_LOG", value_delimiter = ',', value_hint = clap::ValueHint::FilePath)]
    pub nccl_log: Vec<std::path::PathBuf>,
    /// FabricProfile YAML whose thresholds to judge against.
    #[arg(long, env = "RAILGUARD_PROFILE_FILE", value_hint = clap::ValueHint::FilePath)]
    pub profile_file: Option<std::path::PathBuf>,
    /// Which profile of --profile-file (default: its first).
    #[arg(long, env = "RAILGUARD_PROFILE", requires = "profile_file")]
    pub profile: Option<String>,
    /// Print JSON instead of text (keys: docs/reference.md, "JSON output").
    #[arg(long, env = "RAILGUARD_JSON")]
    pub json: bool,
}

impl AnalyzeArgs {
    /// Analyzes the inputs; a `fail` verdict is exit status 1.
    pub fn run(&self) -> anyhow::Result<Outcome> {
        let inputs = AnalyzeInputs {
            files: self
                .nccl_tests
                .iter()
                .chain(self.nccl_log.iter())
                .cloned()
                .collect(),
            profiles: match &self.profile_file {
                Some(p) => Some((
                    p.clone(),
                    railguard_runtime::read_profiles(p, "--profile-file")?,
                )),
                None => None,
            },
            profile: self.profile.clone(),
        };
        let report = analyze_files(&inputs)?;
        let text = if self.json {
            serde_json::to_string_pretty(&report).context("cannot encode JSON")? + "\n"
        } else {
            render_report(&report)
        };
        Ok(Outcome::new(
            text,
            Status::fail_if(report.verdict == AnalyzeVerdict::Fail),
        ))
    }
}
