//! The node's NCCL loopback without nccl-tests: the prober's own `nccl-ranks --single-node`
//! child ([`super::ranks`]), one rank per GPU in one communicator through `libnccl.so.2`,
//! started like `all_reduce_perf` (a child process: NCCL reads its environment once per
//! process) and read into the same [`NcclRun`] evidence: its result line becomes the table
//! ([`PerfReport::from_native`]), its stderr is NCCL's debug log.

use super::tail;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use super::perf::PerfReport;
use super::ranks::{FailureKind, RanksLine, RANKS_SUBCOMMAND};
use super::runner::{file_sha256, NcclError};
use super::{parse_debug_log, NcclObservation, NcclRun};

/// How the prober runs its native loopback on this node.
#[derive(Clone, Debug, PartialEq)]
pub struct NativeNccl {
    /// The prober executable (its `nccl-ranks` subcommand).
    pub exe: PathBuf,
    pub cuda_library: Option<PathBuf>,
    pub nccl_library: Option<PathBuf>,
    /// The node's GPUs by PCI bus id, in railguard's index order (empty: CUDA's, in PCI bus
    /// order).
    pub node_gpus: Vec<String>,
    /// The largest message swept, whatever the profile asks: `None` on a node. A simulated
    /// node sets it, since its CUDA double's "GPU memory" is host memory.
    pub max_message_bytes: Option<u64>,
}

/// One native run.
#[derive(Clone, Debug)]
pub struct NativeRunSpec {
    /// `main`, `gdr-off`, `socket`, `nvlink`: names the log file.
    pub label: String,
    pub sizes: Vec<u64>,
    pub warmup: u32,
    pub iterations: u32,
    pub env: Vec<(String, String)>,
    pub log_dir: PathBuf,
    pub timeout: Duration,
}

const STDERR_TAIL: usize = 600;

impl NativeNccl {
    /// `exe`'s ranks with the libraries the loader finds and CUDA's GPU order.
    pub fn new(exe: PathBuf) -> NativeNccl {
        NativeNccl {
            exe,
            cuda_library: None,
            nccl_library: None,
            node_gpus: Vec::new(),
            max_message_bytes: None,
        }
    }

    /// The sizes of `run` this node sweeps: all of them, or those up to
    /// [`NativeNccl::max_message_bytes`] (that size itself when the profile's smallest is
    /// larger).
    pub fn sizes(&self, run: &NativeRunSpec) -> Vec<u64> {
        match self.max_message_bytes {
            None => run.sizes.clone(),
            Some(max) => {
                let kept: Vec<u64> = run.sizes.iter().copied().filter(|&s| s <= max).collect();
                if kept.is_empty() {
                    vec![max]
                } else {
                    kept
                }
            }
        }
    }

    /// The library the ranks load: the one named, else the image's
    /// ([`railguard_gpu::bundled_nccl_library`]); `None`: the loader's path decides.
    pub fn library(&self) -> Option<PathBuf> {
        self.nccl_library
            .clone()
            .or_else(railguard_gpu::bundled_nccl_library)
    }

    /// The child's arguments for `run`.
    pub fn args(&self, run: &NativeRunSpec) -> Vec<String> {
        let mut args = vec![RANKS_SUBCOMMAND.to_string(), "--single-node".into()];
        if let Some(p) = &self.cuda_library {
            args.extend(["--cuda-library".into(), p.display().to_string()]);
        }
        if let Some(p) = &self.nccl_library {
            args.extend(["--nccl-library".into(), p.display().to_string()]);
        }
        if !self.node_gpus.is_empty() {
            args.extend(["--node-gpus".into(), self.node_gpus.join(",")]);
        }
        let sizes: Vec<String> = self.sizes(run).iter().map(u64::to_string).collect();
        args.extend([
            "--sizes".into(),
            sizes.join(","),
            "--warmup".into(),
            run.warmup.to_string(),
            "--iterations".into(),
            run.iterations.to_string(),
        ]);
        args
    }

    /// Runs the ranks, waits for them (killing the child at the timeout) and reads their
    /// result and NCCL's log: a child that reports an error, exits without a result or is
    /// killed is an error, never a measurement.
    pub async fn run(&self, run: &NativeRunSpec) -> Result<NcclRun, NcclError> {
        let binary = format!("{} {RANKS_SUBCOMMAND}", self.exe.display());
        std::fs::create_dir_all(&run.log_dir).map_err(|source| NcclError::LogDir {
            dir: run.log_dir.display().to_string(),
            source,
        })?;
        let log_path = run.log_dir.join(format!("nccl-{}.native.log", run.label));
        let log = std::fs::File::create(&log_path).map_err(|source| NcclError::LogDir {
            dir: run.log_dir.display().to_string(),
            source,
        })?;
        let started = Instant::now();
        let mut child = tokio::process::Command::new(&self.exe)
            .args(self.args(run))
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "INIT,NET")
            .env_remove("NCCL_DEBUG_FILE")
            .envs(run.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| NcclError::Spawn {
                binary: binary.clone(),
                source,
            })?;
        let mut stdout = child.stdout.take();
        let collect = async {
            let mut out = Vec::new();
            if let Some(s) = stdout.as_mut() {
                s.read_to_end(&mut out).await?;
            }
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, out))
        };
        let (status, out) = match tokio::time::timeout(run.timeout, collect).await {
            Ok(r) => r.map_err(|source| NcclError::Io {
                binary: binary.clone(),
                source,
            })?,
            Err(_) => {
                return Err(NcclError::Timeout {
                    binary,
                    timeout_secs: run.timeout.as_secs(),
                })
            }
        };
        let duration = started.elapsed();
        let log_text = std::fs::read_to_string(&log_path).map_err(|source| NcclError::Io {
            binary: binary.clone(),
            source,
        })?;
        let stdout = String::from_utf8_lossy(&out);
        let observation = observe(&stdout, &log_text).map_err(|reason| NcclError::Failed {
            binary: binary.clone(),
            status: status.to_string(),
            stderr_tail: tail(&format!("{reason}\n{log_text}"), STDERR_TAIL),
        })?;
        Ok(NcclRun {
            label: run.label.clone(),
            observation,
            log_files: vec![log_path],
            duration,
            binary_sha256: self.library().as_deref().and_then(file_sha256),
            env: run.env.clone(),
        })
    }
}

/// What the child's stdout and NCCL log show: its result as a table and the log's report, or
/// why there is no measurement (its error line, or no result line at all).
pub fn observe(stdout: &str, log: &str) -> Result<NcclObservation, String> {
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or("the ranks printed no result")?;
    match serde_json::from_str::<RanksLine>(last) {
        Ok(RanksLine::Result(r)) => Ok(NcclObservation {
            perf: Some(PerfReport::from_native(
                &r.points,
                r.nranks,
                &r.nccl_version,
            )),
            log: parse_debug_log(log),
        }),
        Ok(RanksLine::Error(f)) => Err(match f.kind {
            FailureKind::NotInstalled => format!("NCCL cannot run on this node: {}", f.reason),
            FailureKind::Collective => format!("the all-reduce failed: {}", f.reason),
            FailureKind::Invalid => format!("the run does not fit this node: {}", f.reason),
        }),
        Ok(RanksLine::UniqueId { .. }) => Err("the ranks stopped after their unique id".into()),
        Err(e) => Err(format!("unreadable result line {last:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const LOG: &str = "n:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n\
n:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [RO]; OOB lo:127.0.0.1<0>\n\
n:1:1 [0] NCCL INFO Using network IB\n\
n:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n\
n:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA\n\
n:1:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [send] via NET/IB/1/GDRDMA\n";

    fn result(points: &str) -> String {
        format!(
            r#"{{"type":"result","nranks":2,"firstRank":0,"gpus":["0000:18:00.0","0000:2a:00.0"],"ncclVersion":"2.21.5","points":[{points}]}}"#
        )
    }

    #[test]
    fn a_result_reads_as_the_loopback_table_and_log() {
        let points = (0..4)
            .map(|i| {
                format!(
                    r#"{{"bytes":{},"timeUs":100.0,"algbwGBps":{},"busbwGBps":{},"wrong":0}}"#,
                    (8u64 << 20) << i,
                    20.0 + f64::from(i),
                    20.0 + f64::from(i)
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        let o = observe(&result(&points), LOG).unwrap();
        assert_eq!(o.ranks(), Some(2));
        assert_eq!(o.nodes(), Some(1));
        assert_eq!(o.wrong(), Some(0));
        assert_eq!(o.nccl_version().as_deref(), Some("2.21.5"));
        let plateau = o.busbw_plateau_gbps().unwrap();
        assert!((21.0..=23.0).contains(&plateau), "{plateau}");
        assert_eq!(o.log.hcas, vec!["mlx5_0:1", "mlx5_3:1"]);
        assert_eq!(o.log.gdr, Some(true));
        let r = o.to_result();
        assert_eq!(r.ranks, Some(2));
        assert_eq!(r.transport, Some(railguard_api::Transport::Ib));
    }

    #[test]
    fn a_simulated_node_sweeps_up_to_its_largest_message() {
        let run = NativeRunSpec {
            label: "main".into(),
            sizes: vec![8 << 20, 16 << 20, 32 << 20],
            warmup: 5,
            iterations: 20,
            env: Vec::new(),
            log_dir: PathBuf::from("/tmp"),
            timeout: Duration::from_secs(1),
        };
        let node = NativeNccl::new(PathBuf::from("railguard-prober"));
        assert_eq!(node.sizes(&run), run.sizes);
        let sim = NativeNccl {
            max_message_bytes: Some(16 << 20),
            ..node.clone()
        };
        assert_eq!(sim.sizes(&run), vec![8 << 20, 16 << 20]);
        let args = sim.args(&run);
        let at = args.iter().position(|a| a == "--sizes").unwrap();
        assert_eq!(args[at + 1], "8388608,16777216");
        let tiny = NativeNccl {
            max_message_bytes: Some(4096),
            ..node
        };
        assert_eq!(tiny.sizes(&run), vec![4096]);
    }

    #[test]
    fn wrong_elements_errors_and_missing_results_are_not_measurements() {
        let bad = r#"{"bytes":8388608,"timeUs":100.0,"algbwGBps":20.0,"busbwGBps":20.0,"wrong":3}"#;
        assert_eq!(observe(&result(bad), LOG).unwrap().wrong(), Some(3));
        let e = observe(
            r#"{"type":"error","kind":"notInstalled","reason":"cannot load libnccl.so.2"}"#,
            "",
        )
        .unwrap_err();
        assert_eq!(e, "NCCL cannot run on this node: cannot load libnccl.so.2");
        assert_eq!(observe("", LOG).unwrap_err(), "the ranks printed no result");
        let cut = &result(bad)[..40];
        assert!(observe(cut, LOG)
            .unwrap_err()
            .starts_with("unreadable result line"));
    }
}
