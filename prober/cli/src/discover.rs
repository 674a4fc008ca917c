//! The `discover`, `affinity` and `emit-profile` subcommands.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use railguard_prober::discover::{
    discover, profile_for, render_table, AffinityJson, IndexOrder, ProfileDefaults, Severity,
};
use railguard_runtime::StartupError;

use crate::{Outcome, Status};

/// `railguard-prober discover [--sysfs-root DIR] [--json]`
#[derive(Args, Debug, Clone)]
pub struct DiscoverArgs {
    /// Root the sysfs/procfs paths are read under (`/` on a node; a synthetic tree in tests).
    /// NVML is only consulted when this is `/`.
    #[arg(long, env = "RAILGUARD_SYSFS_ROOT", default_value = "/")]
    pub sysfs_root: PathBuf,
    /// Print JSON instead of tables (keys: docs/reference.md, "JSON output").
    #[arg(long, env = "RAILGUARD_JSON")]
    pub json: bool,
}

/// `railguard-prober affinity --topo FILE [--json]`
#[derive(Args, Debug, Clone)]
pub struct AffinityArgs {
    /// A saved `nvidia-smi topo -m` output.
    #[arg(long, env = "RAILGUARD_TOPO")]
    pub topo: PathBuf,
    /// Print JSON instead of a table (keys: docs/reference.md, "JSON output").
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
pub fn nvml_applies(root: &Path) -> bool {
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

/// A CRITICAL finding fails the command (exit status 1).
fn status_of(j: &AffinityJson) -> Status {
    Status::fail_if(j.findings.iter().any(|f| f.severity == Severity::Critical))
}

/// The report as JSON or a table.
fn render(j: &AffinityJson, json: bool) -> anyhow::Result<String> {
    Ok(if json {
        serde_json::to_string_pretty(j).context("cannot encode output")? + "\n"
    } else {
        render_table(j)
    })
}

impl DiscoverArgs {
    /// Runs discovery; fails (exit 1) with a CRITICAL finding.
    pub fn run(&self) -> anyhow::Result<Outcome> {
        check_sysfs_root(&self.sysfs_root, "--sysfs-root")?;
        let d = discover(&self.sysfs_root, nvml_applies(&self.sysfs_root))?;
        let j = AffinityJson::from_discovery(&d);
        Ok(Outcome::new(render(&j, self.json)?, status_of(&j)))
    }
}

impl AffinityArgs {
    /// Reads the saved topology; fails (exit 1) with a CRITICAL finding.
    pub fn run(&self) -> anyhow::Result<Outcome> {
        let what = "nvidia-smi topo -m output";
        let text = std::fs::read_to_string(&self.topo)
            .map_err(|e| StartupError::unreadable(what, &self.topo, "--topo", &e))?;
        let topo = railguard_prober::topo::parse(&text).map_err(|e| {
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
        Ok(Outcome::new(render(&j, self.json)?, status_of(&j)))
    }
}

impl EmitProfileArgs {
    pub fn run(&self) -> anyhow::Result<String> {
        check_sysfs_root(&self.sysfs_root, "--sysfs-root")?;
        let d = discover(&self.sysfs_root, nvml_applies(&self.sysfs_root))?;
        let profile = profile_for(&d, &self.name, &ProfileDefaults::default());
        profile
            .validate()
            .context("the emitted profile is invalid (no compute rails found?)")?;
        Ok(format!(
            "# Emitted by railguard-prober emit-profile; rail-layout signature {}\n{}",
            d.signature(),
            serde_yaml_ng::to_string(&profile).context("cannot encode output")?
        ))
    }
}
