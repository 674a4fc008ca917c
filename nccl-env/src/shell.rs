//! The plugin's IO around [`answer`]: where the node file and the sysfs are, reading them,
//! turning every failure into pass-through with one warning, and where messages go.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::answer::{answer, Answers, Level};
use crate::node_file::{NodeFile, NodeFileError};
use crate::view::{ContainerView, ViewError};

/// Names the node file (default [`DEFAULT_NODE_FILE`]).
pub const CONFIG_ENV: &str = "RAILGUARD_NCCL_CONFIG";
/// Where the prober writes the node file (a hostPath the webhook mounts read-only).
pub const DEFAULT_NODE_FILE: &str = "/run/railguard/nccl.json";
/// Test/debug knob: read `<root>/sys/class/infiniband` instead of `/sys/class/infiniband`.
pub const SYSFS_ROOT_ENV: &str = "RAILGUARD_NCCL_SYSFS_ROOT";
/// A node file is a few KiB; anything this big is not one (and is not read whole).
const MAX_NODE_FILE_BYTES: u64 = 4 << 20;

/// Why the plugin answers nothing itself.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot read node file {path}")]
    ReadNodeFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("node file {path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("node file {path} is larger than {MAX_NODE_FILE_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("node file {path}")]
    NodeFile {
        path: PathBuf,
        #[source]
        source: NodeFileError,
    },
    #[error("cannot read this container's rdma devices")]
    View(#[source] ViewError),
}

/// The node file path and sysfs root for a process environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub node_file: PathBuf,
    pub sysfs_root: PathBuf,
}

impl Config {
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Config {
        let nonempty = |k| env(k).filter(|v: &String| !v.is_empty());
        Config {
            node_file: PathBuf::from(
                nonempty(CONFIG_ENV).unwrap_or_else(|| DEFAULT_NODE_FILE.into()),
            ),
            sysfs_root: PathBuf::from(nonempty(SYSFS_ROOT_ENV).unwrap_or_else(|| "/".into())),
        }
    }
}

/// Reads the node file at `path` (a regular file: a FIFO there must not block NCCL).
pub fn read_node_file(path: &Path) -> Result<NodeFile, PluginError> {
    let read_err = |source| PluginError::ReadNodeFile {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::metadata(path).map_err(read_err)?;
    if !meta.is_file() {
        return Err(PluginError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let mut text = String::new();
    fs::File::open(path)
        .and_then(|f| f.take(MAX_NODE_FILE_BYTES + 1).read_to_string(&mut text))
        .map_err(read_err)?;
    if text.len() as u64 > MAX_NODE_FILE_BYTES {
        return Err(PluginError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    NodeFile::parse(&text).map_err(|source| PluginError::NodeFile {
        path: path.to_path_buf(),
        source,
    })
}

/// The node file and container view `config` names.
pub fn load(config: &Config) -> Result<(NodeFile, ContainerView), PluginError> {
    let node_file = read_node_file(&config.node_file)?;
    let view = ContainerView::read(&config.sysfs_root).map_err(PluginError::View)?;
    Ok((node_file, view))
}

/// What `init` computes: [`answer`] over what `env` points at, or pass-through with one
/// warning naming the error.
pub fn answers_for_process(env: &dyn Fn(&str) -> Option<String>, now: jiff::Timestamp) -> Answers {
    match load(&Config::from_env(env)) {
        Ok((node_file, view)) => answer(&node_file, &view, env, now),
        Err(e) => Answers::pass_through(format!(
            "railguard: {}; NCCL gets the process environment unchanged",
            error_chain(&e)
        )),
    }
}

/// `e: its source: …`, one line: `railguard_api::error::error_chain`'s rule without its
/// de-duplication. Its own copy because this crate is loaded into NCCL's process and links
/// nothing of railguard's Kubernetes model (Cargo.toml).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        s.push_str(": ");
        s.push_str(&c.to_string());
        next = c.source();
    }
    s
}

/// Where a message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    NcclLogger,
    Stderr,
    Drop,
}

/// A warning always reaches someone: through NCCL's logger where NCCL will print it
/// (`NCCL_DEBUG` at `WARN` or more), else on stderr. Info follows `NCCL_DEBUG=INFO` (or
/// more), through the logger where there is one (v2).
pub fn route(level: Level, has_logger: bool, nccl_debug: Option<&str>) -> Route {
    // NCCL's levels (debug.cc, ncclParamDebugLevel): NONE 0, VERSION 1, WARN 2, INFO 3,
    // ABORT 4, TRACE 5; unset is NONE.
    let configured = match nccl_debug.map(str::trim) {
        Some(v) if v.eq_ignore_ascii_case("VERSION") => 1,
        Some(v) if v.eq_ignore_ascii_case("WARN") => 2,
        Some(v) if v.eq_ignore_ascii_case("INFO") => 3,
        Some(v) if v.eq_ignore_ascii_case("ABORT") => 4,
        Some(v) if v.eq_ignore_ascii_case("TRACE") => 5,
        _ => 0,
    };
    let needed = match level {
        Level::Warn => 2,
        Level::Info => 3,
    };
    match (configured >= needed, has_logger, level) {
        (true, true, _) => Route::NcclLogger,
        (true, false, _) | (false, _, Level::Warn) => Route::Stderr,
        (false, _, Level::Info) => Route::Drop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_overrides() {
        let none = |_: &str| None;
        assert_eq!(
            Config::from_env(&none),
            Config {
                node_file: DEFAULT_NODE_FILE.into(),
                sysfs_root: "/".into()
            }
        );
        let set = |k: &str| match k {
            CONFIG_ENV => Some("/tmp/n.json".to_string()),
            SYSFS_ROOT_ENV => Some("/tmp/root".to_string()),
            _ => None,
        };
        assert_eq!(
            Config::from_env(&set),
            Config {
                node_file: "/tmp/n.json".into(),
                sysfs_root: "/tmp/root".into()
            }
        );
    }

    #[test]
    fn warnings_are_never_dropped() {
        assert_eq!(route(Level::Warn, true, None), Route::Stderr);
        assert_eq!(route(Level::Warn, true, Some("VERSION")), Route::Stderr);
        assert_eq!(route(Level::Warn, true, Some("warn")), Route::NcclLogger);
        assert_eq!(route(Level::Warn, true, Some("INFO")), Route::NcclLogger);
        assert_eq!(route(Level::Warn, false, Some("INFO")), Route::Stderr);
    }

    #[test]
    fn info_follows_nccl_debug() {
        assert_eq!(route(Level::Info, true, None), Route::Drop);
        assert_eq!(route(Level::Info, true, Some("WARN")), Route::Drop);
        assert_eq!(route(Level::Info, true, Some("INFO")), Route::NcclLogger);
        assert_eq!(route(Level::Info, true, Some("TRACE")), Route::NcclLogger);
        assert_eq!(route(Level::Info, false, Some("INFO")), Route::Stderr);
        assert_eq!(route(Level::Info, false, Some("bogus")), Route::Drop);
    }
}
