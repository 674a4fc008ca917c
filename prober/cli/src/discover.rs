//! The `discover`, `affinity` and `emit-profile` subcommands (argument structs and their
//! runs), kept in the library so `main.rs` stays a thin dispatcher.

use std::path::{Path, PathBuf};

use clap::Args;
use railguard_runtime::StartupError;

use super::{discover, profile_for, AffinityJson, IndexOrder, ProfileDefaults, Severity};
use crate::cli::Outcome;

/// A subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Discover(#[from] super::DiscoverError),
    /// A flag names something unusable (the message names the flag and the fix).
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error("the emitted profile is invalid (no compute rails found?)")]
    Profile(#[from] railguard_api::ProfileError),
    #[error("cannot encode output")]
    Json(#[from] serde_json::Error),
    #[error("cannot encode output")]
    Yaml(#[from] serde_yaml_ng::Error),
}

/// `railguard-prober discover [--sysfs-root DIR] [--json]`
#[derive(Args, Debug, Clone)]
pub struct DiscoverArgs {
    /// Root the sysfs/procfs paths are read under (`/` on a node; a synthetic tree in tests).
    /// NVML is only consulted when this is `/`.
    #[arg(long, env = "RAILGUARD_SYSFS_ROOT", default_value = "/")]
    pub sysfs_root: PathBuf,
    /// Print JSON instead of tables (keys: README, "JSON output").
    #[arg(long, env = "RAILGUARD_JSON")]
    pub json: bool,
}

/// `railguard-prober affinity --topo FILE [--json]`
#[derive(Args, Debug, Clone)]
pub struct AffinityArgs {
    /// A saved `nvidia-smi topo -m` output.
    #[arg(long, env = "RAILGUARD_TOPO")]
    pub topo: PathBuf,
    /// Print JSON instead of a table (keys: README, "JSON output").
    #[arg(long, env = "RAILGUARD_JSON")]
    pub json: bool,
}

/// `railguard-prober emit-profile [--sysfs-root DIR] --profile NAME`
#[derive(Args, Debug, Clone)]
pub struct EmitProfileArgs {
    /// Root the sysfs/procfs paths are read under (`/` on a node; a synthetic tree in tests).
    #[arg(long, env = "RAILGUARD_SYSFS_ROOT", default_value = "/")]
    pub sysfs_root: PathBuf,
    /// metadata.name of the FabricProfile.
    #[arg(long = "profile", visible_alias = "name", env = "RAILGUARD_PROFILE")]
    pub name: String,
}

/// NVML describes the machine we run on, so it only applies when reading the real root.
fn nvml_applies(root: &Path) -> bool {
    std::fs::canonicalize(root).is_ok_and(|p| p == Path::new("/"))
}

/// The sysfs root given with `flag` can be read: a directory holding `sys/bus/pci/devices`.
pub fn check_sysfs_root(root: &Path, flag: &str) -> Result<(), StartupError> {
    let problem = format!("cannot read the sysfs root {} ({flag})", root.display());
    let fix = "point it at the directory holding the host's sys/ and proc/ (/ on a node, /host in the DaemonSet), or write a simulated tree with `railguard-prober sim-sysfs`";
    if !root.is_dir() {
        return Err(StartupError::new(problem, "no such directory", fix));
    }
    if !root.join("sys/bus/pci/devices").is_dir() {
        return Err(StartupError::new(
            problem,
            "it has no sys/bus/pci/devices (not a sysfs root?)",
            fix,
        ));
    }
    Ok(())
}

/// Whether any finding is CRITICAL (exit status 1).
fn has_critical(j: &AffinityJson) -> bool {
    j.findings.iter().any(|f| f.severity == Severity::Critical)
}

impl DiscoverArgs {
    /// Runs discovery; fails (exit 1) with a CRITICAL finding.
    pub fn run(&self) -> Result<Outcome, CliError> {
        check_sysfs_root(&self.sysfs_root, "--sysfs-root")?;
        let d = discover(&self.sysfs_root, nvml_applies(&self.sysfs_root))?;
        let j = AffinityJson::from_discovery(&d);
        let text = if self.json {
            serde_json::to_string_pretty(&j)? + "\n"
        } else {
            super::render_table(&j)
        };
        Ok(Outcome::verdict(text, has_critical(&j)))
    }
}

impl AffinityArgs {
    /// Reads the saved topology; fails (exit 1) with a CRITICAL finding.
    pub fn run(&self) -> Result<Outcome, CliError> {
        let what = "nvidia-smi topo -m output";
        let text = std::fs::read_to_string(&self.topo)
            .map_err(|e| StartupError::unreadable(what, &self.topo, "--topo", &e))?;
        let topo = crate::topo::parse(&text).map_err(|e| {
            StartupError::invalid(
                what,
                &self.topo,
                "--topo",
                &e,
                "save the whole output of `nvidia-smi topo -m` (matrix and legend)",
            )
        })?;
        let (map, findings) = topo.affinity();
        let j = AffinityJson::from_map(&map, IndexOrder::Topo, findings);
        let text = if self.json {
            serde_json::to_string_pretty(&j)? + "\n"
        } else {
            super::render_table(&j)
        };
        Ok(Outcome::verdict(text, has_critical(&j)))
    }
}

impl EmitProfileArgs {
    pub fn run(&self) -> Result<String, CliError> {
        check_sysfs_root(&self.sysfs_root, "--sysfs-root")?;
        let d = discover(&self.sysfs_root, nvml_applies(&self.sysfs_root))?;
        let profile = profile_for(&d, &self.name, &ProfileDefaults::default());
        profile.validate()?;
        Ok(format!(
            "# Emitted by railguard-prober emit-profile; rail-layout signature {}\n{}",
            d.signature(),
            serde_yaml_ng::to_string(&profile)?
        ))
    }
}
