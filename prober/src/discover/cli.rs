//! The `discover`, `affinity` and `emit-profile` subcommands (argument structs and their
//! runs), kept in the library so `main.rs` stays a thin dispatcher.

use std::path::{Path, PathBuf};

use clap::Args;

use super::{discover, profile_for, AffinityJson, IndexOrder, ProfileDefaults};

/// A subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Discover(#[from] super::DiscoverError),
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a usable nvidia-smi topo -m output")]
    Topo {
        path: String,
        #[source]
        source: crate::topo::TopoError,
    },
    #[error("the emitted profile is invalid (no compute rails found?)")]
    Profile(#[from] railguard_api::ProfileError),
    #[error("cannot encode output")]
    Json(#[from] serde_json::Error),
    #[error("cannot encode output")]
    Yaml(#[from] serde_yaml::Error),
}

/// `railguard-prober discover [--sysfs-root DIR] [--json]`
#[derive(Args, Debug, Clone)]
pub struct DiscoverArgs {
    /// Root the sysfs/procfs paths are read under (`/` on a node; a synthetic tree in tests).
    /// NVML is only consulted when this is `/`.
    #[arg(long, env = "RAILGUARD_SYSFS_ROOT", default_value = "/")]
    pub sysfs_root: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long, env = "RAILGUARD_JSON")]
    pub json: bool,
}

/// `railguard-prober affinity --topo FILE [--json]`
#[derive(Args, Debug, Clone)]
pub struct AffinityArgs {
    /// A saved `nvidia-smi topo -m` output.
    #[arg(long, env = "RAILGUARD_TOPO")]
    pub topo: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long, env = "RAILGUARD_JSON")]
    pub json: bool,
}

/// `railguard-prober emit-profile [--sysfs-root DIR] --profile NAME`
#[derive(Args, Debug, Clone)]
pub struct EmitProfileArgs {
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

impl DiscoverArgs {
    /// Runs discovery; returns what to print.
    pub fn run(&self) -> Result<String, CliError> {
        let d = discover(&self.sysfs_root, nvml_applies(&self.sysfs_root))?;
        let j = AffinityJson::from_discovery(&d);
        Ok(if self.json {
            serde_json::to_string_pretty(&j)? + "\n"
        } else {
            super::render_table(&j)
        })
    }
}

impl AffinityArgs {
    pub fn run(&self) -> Result<String, CliError> {
        let text = std::fs::read_to_string(&self.topo).map_err(|source| CliError::Read {
            path: self.topo.display().to_string(),
            source,
        })?;
        let topo = crate::topo::parse(&text).map_err(|source| CliError::Topo {
            path: self.topo.display().to_string(),
            source,
        })?;
        let (map, findings) = topo.affinity();
        let j = AffinityJson::from_map(&map, IndexOrder::Topo, findings);
        Ok(if self.json {
            serde_json::to_string_pretty(&j)? + "\n"
        } else {
            super::render_table(&j)
        })
    }
}

impl EmitProfileArgs {
    pub fn run(&self) -> Result<String, CliError> {
        let d = discover(&self.sysfs_root, nvml_applies(&self.sysfs_root))?;
        let profile = profile_for(&d, &self.name, &ProfileDefaults::default());
        profile.validate()?;
        Ok(format!(
            "# Emitted by railguard-prober emit-profile; rail-layout signature {}\n{}",
            d.signature(),
            serde_yaml::to_string(&profile)?
        ))
    }
}
