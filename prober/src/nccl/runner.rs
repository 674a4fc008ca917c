//! Runs `all_reduce_perf` (nccl-tests) as a child process with NCCL debug logging into a
//! per-run log, and parses what it printed.

use super::tail;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use super::{NcclObservation, PerfParseError};

/// Why an NCCL run produced no usable evidence.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    #[error("cannot start {binary}")]
    Spawn {
        binary: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot prepare the NCCL log directory {dir}")]
    LogDir {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{binary} did not finish within {timeout_secs}s and was killed")]
    Timeout { binary: String, timeout_secs: u64 },
    #[error("{binary} exited with {status}: {stderr_tail}")]
    Failed {
        binary: String,
        status: String,
        stderr_tail: String,
    },
    #[error("cannot read the output of {binary}")]
    Io {
        binary: String,
        #[source]
        source: std::io::Error,
    },
    #[error("output of {binary} is unusable")]
    Parse {
        binary: String,
        #[source]
        source: PerfParseError,
    },
    #[error("{binary} printed no nccl-tests result table")]
    NoTable { binary: String },
}

/// One invocation of an nccl-tests binary.
#[derive(Clone, Debug)]
pub struct NcclRunSpec {
    /// Short name of the run (`main`, `gdr-off`, `socket`); also names the log files.
    pub label: String,
    pub binary: PathBuf,
    pub args: Vec<String>,
    /// Extra environment (`NCCL_IB_HCA`, `NCCL_ALGO`, `NCCL_NET_GDR_LEVEL`, ...).
    pub env: Vec<(String, String)>,
    /// Where `NCCL_DEBUG_FILE` logs go; created if missing.
    pub log_dir: PathBuf,
    pub timeout: Duration,
}

/// A finished run and what it showed.
#[derive(Clone, Debug)]
pub struct NcclRun {
    pub label: String,
    pub observation: NcclObservation,
    /// The NCCL debug logs the run wrote.
    pub log_files: Vec<PathBuf>,
    pub duration: Duration,
    /// SHA-256 of the binary, for the software baseline.
    pub binary_sha256: Option<String>,
    /// Environment the run was given (for the comparison matrix notes).
    pub env: Vec<(String, String)>,
}

const STDERR_TAIL: usize = 600;

/// Runs the binary, waits for it (killing it at the timeout), then parses stdout and the
/// debug logs together: a run that exits non-zero, prints no table or stops mid-table is an
/// error.
pub async fn run_nccl_test(spec: &NcclRunSpec) -> Result<NcclRun, NcclError> {
    let binary = spec.binary.display().to_string();
    std::fs::create_dir_all(&spec.log_dir).map_err(|source| NcclError::LogDir {
        dir: spec.log_dir.display().to_string(),
        source,
    })?;
    let prefix = format!("nccl-{}.", spec.label);
    remove_old_logs(&spec.log_dir, &prefix);
    let debug_file = spec.log_dir.join(format!("{prefix}%h.%p.log"));

    let started = Instant::now();
    let mut cmd = tokio::process::Command::new(&spec.binary);
    cmd.args(&spec.args)
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT,NET")
        .env("NCCL_DEBUG_FILE", &debug_file)
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|source| NcclError::Spawn {
        binary: binary.clone(),
        source,
    })?;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let io = |source| NcclError::Io {
        binary: binary.clone(),
        source,
    };
    let collect = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            if let Some(s) = stdout.as_mut() {
                s.read_to_end(&mut out).await?;
            }
            Ok::<_, std::io::Error>(())
        };
        let read_err = async {
            if let Some(s) = stderr.as_mut() {
                s.read_to_end(&mut err).await?;
            }
            Ok::<_, std::io::Error>(())
        };
        let (a, b) = tokio::join!(read_out, read_err);
        a?;
        b?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, out, err))
    };
    let (status, out, err) = match tokio::time::timeout(spec.timeout, collect).await {
        Ok(r) => r.map_err(io)?,
        Err(_) => {
            return Err(NcclError::Timeout {
                binary,
                timeout_secs: spec.timeout.as_secs(),
            })
        }
    };
    let duration = started.elapsed();
    let stdout = String::from_utf8_lossy(&out).into_owned();
    let stderr = String::from_utf8_lossy(&err).into_owned();
    if !status.success() {
        return Err(NcclError::Failed {
            binary,
            status: status.to_string(),
            stderr_tail: tail(&stderr, STDERR_TAIL),
        });
    }
    let log_files = find_logs(&spec.log_dir, &prefix);
    let mut logs = Vec::new();
    for f in &log_files {
        logs.push(std::fs::read_to_string(f).map_err(io)?);
    }
    let mut texts: Vec<&str> = vec![stdout.as_str(), stderr.as_str()];
    texts.extend(logs.iter().map(String::as_str));
    let observation = NcclObservation::from_texts(texts).map_err(|source| NcclError::Parse {
        binary: binary.clone(),
        source,
    })?;
    if observation.perf.is_none() {
        return Err(NcclError::NoTable { binary });
    }
    Ok(NcclRun {
        label: spec.label.clone(),
        observation,
        log_files,
        duration,
        binary_sha256: file_sha256(&spec.binary),
        env: spec.env.clone(),
    })
}

fn remove_old_logs(dir: &Path, prefix: &str) {
    for f in find_logs(dir, prefix) {
        // A stale log from an earlier run would be read as this run's evidence.
        let _ = std::fs::remove_file(f);
    }
}

fn find_logs(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".log"))
        })
        .collect();
    out.sort();
    out
}

/// SHA-256 of a file, hex; `None` when it cannot be read.
pub fn file_sha256(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    Some(hex::encode(Sha256::digest(&bytes)))
}
