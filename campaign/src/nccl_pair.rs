//! The endpoint's half of an NCCL pair test: this node's ranks run in a child process (the
//! prober's hidden [`RANKS_SUBCOMMAND`], see [`railguard_prober::nccl::ranks`]), whose NCCL debug log is
//! captured and judged; the rank-0 endpoint sends the child's unique id to the peer's endpoint
//! over the campaign's authenticated control channel ([`NcclJoinRequest`]) and waits for both
//! sides. Every wait has a time limit, and a child whose test is over is killed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use super::wire::{NcclJoinRequest, NcclLogSummary, NcclSide, NcclTestRequest};
use railguard_prober::nccl::ranks::{FailureKind, RanksLine};

pub use railguard_prober::nccl::ranks::RANKS_SUBCOMMAND;

/// How an endpoint starts its NCCL children.
#[derive(Debug, Clone, PartialEq)]
pub struct NcclRunner {
    /// The prober executable.
    pub exe: PathBuf,
    pub cuda_library: Option<PathBuf>,
    pub nccl_library: Option<PathBuf>,
    /// The node's GPUs by PCI bus id, in index order (empty: CUDA's, in PCI bus order).
    pub node_gpus: Vec<String>,
    /// Where each child's NCCL debug log is kept (the latest per peer, scope and role).
    pub log_dir: PathBuf,
    /// Extra environment of the children.
    pub env: Vec<(String, String)>,
}

/// `NCCL_IB_HCA` limited to `rails`, in the exact-match form the runbook asks for.
pub fn ib_hca(rails: &[super::wire::RailRef]) -> String {
    let ids: Vec<String> = rails.iter().map(|r| r.id()).collect();
    format!("={}", ids.join(","))
}

/// A log file name for one test: peer, scope (`node` or the rail) and role.
fn log_name(req: &NcclTestRequest, role: &str) -> String {
    let scope = match req.rails.as_slice() {
        [one] => format!("{}-{}", one.hca, one.port),
        _ => "node".to_string(),
    };
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!(
        "nccl-pair-{}-{}-{role}.log",
        clean(&req.peer_node),
        clean(&scope)
    )
}

fn join_list<T: ToString>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A started child: its stdout lines and its log.
pub struct RanksChild {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    log: PathBuf,
}

impl NcclRunner {
    /// Starts this node's ranks for `req` (rank 0 side when `join` is `None`).
    pub async fn start(
        &self,
        req: &NcclTestRequest,
        join: Option<&NcclJoinRequest>,
    ) -> Result<RanksChild, NcclSide> {
        let not_started = |what: String| NcclSide::NotMeasured { reason: what };
        std::fs::create_dir_all(&self.log_dir).map_err(|e| {
            not_started(format!(
                "cannot create the NCCL log directory {}: {e}",
                self.log_dir.display()
            ))
        })?;
        let role = if join.is_some() { "join" } else { "root" };
        let log = self.log_dir.join(log_name(req, role));
        let stderr = std::fs::File::create(&log)
            .map_err(|e| not_started(format!("cannot create {}: {e}", log.display())))?;
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.arg(RANKS_SUBCOMMAND);
        if let Some(p) = &self.cuda_library {
            cmd.arg("--cuda-library").arg(p);
        }
        if let Some(p) = &self.nccl_library {
            cmd.arg("--nccl-library").arg(p);
        }
        if !self.node_gpus.is_empty() {
            cmd.arg("--node-gpus").arg(join_list(&self.node_gpus));
        }
        if !req.gpus.is_empty() {
            cmd.arg("--gpus").arg(join_list(&req.gpus));
        }
        cmd.arg("--sizes")
            .arg(join_list(&req.sizes))
            .arg("--warmup")
            .arg(req.warmup.to_string())
            .arg("--iterations")
            .arg(req.iterations.to_string());
        if let Some(j) = join {
            cmd.arg("--nranks")
                .arg(j.nranks.to_string())
                .arg("--first-rank")
                .arg(j.first_rank.to_string());
        }
        cmd.env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "INIT,NET")
            .env("NCCL_IB_HCA", ib_hca(&req.rails))
            .env_remove("NCCL_DEBUG_FILE")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            // The unique id is a secret of the pair's bootstrap: stdin, not the command line.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            not_started(format!(
                "cannot start {} {RANKS_SUBCOMMAND}: {e}",
                self.exe.display()
            ))
        })?;
        let mut stdin = child.stdin.take();
        if let (Some(j), Some(pipe)) = (join, stdin.as_mut()) {
            use tokio::io::AsyncWriteExt as _;
            let line = format!("{}\n", j.unique_id);
            if let Err(e) = pipe.write_all(line.as_bytes()).await {
                return Err(not_started(format!("cannot pass the unique id: {e}")));
            }
        }
        drop(stdin);
        let Some(stdout) = child.stdout.take() else {
            return Err(not_started("the child has no stdout".into()));
        };
        Ok(RanksChild {
            child,
            lines: BufReader::new(stdout).lines(),
            log,
        })
    }
}

impl RanksChild {
    /// The child's next line, within `limit`. `None` when stdout ended.
    pub async fn next_line(&mut self, limit: Duration) -> Result<Option<RanksLine>, NcclSide> {
        let line = tokio::time::timeout(limit, self.lines.next_line())
            .await
            .map_err(|_| NcclSide::Inconclusive {
                reason: format!(
                    "no answer from the NCCL ranks within {} ms",
                    limit.as_millis()
                ),
            })?
            .map_err(|e| NcclSide::Failed {
                reason: format!("cannot read the NCCL ranks' output: {e}"),
                log: NcclLogSummary::default(),
            })?;
        match line {
            None => Ok(None),
            Some(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| NcclSide::Failed {
                    reason: format!("the NCCL ranks printed {text:?}: {e}"),
                    log: NcclLogSummary::default(),
                }),
        }
    }

    /// Waits for the child's result (within `limit`), then judges its log. A child past the
    /// limit is killed.
    pub async fn finish(mut self, limit: Duration) -> NcclSide {
        let side = match self.next_line(limit).await {
            Ok(Some(line)) => side_of(line),
            Ok(None) => {
                let status = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
                let status = match status {
                    Ok(Ok(s)) => s.to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "no exit".into(),
                };
                NcclSide::Failed {
                    reason: format!("the NCCL ranks exited ({status}) without a result"),
                    log: NcclLogSummary::default(),
                }
            }
            Err(side) => side,
        };
        self.stop().await;
        let log = summarize(&std::fs::read_to_string(&self.log).unwrap_or_default());
        match side {
            NcclSide::Measured {
                points,
                nranks,
                gpus,
                ..
            } => NcclSide::Measured {
                points,
                nranks,
                gpus,
                log,
            },
            NcclSide::Failed { reason, .. } => {
                // NCCL's own warning says more than "unhandled system error".
                let reason = match log.errors.first() {
                    Some(first) if !reason.contains(first.as_str()) => {
                        format!("{reason} (NCCL: {first})")
                    }
                    _ => reason,
                };
                NcclSide::Failed { reason, log }
            }
            other => other,
        }
    }

    /// Kills the child if it still runs.
    pub async fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.start_kill();
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

/// What a child's last line means.
pub fn side_of(line: RanksLine) -> NcclSide {
    match line {
        RanksLine::Result(r) => NcclSide::Measured {
            points: r.points,
            nranks: r.nranks,
            gpus: r.gpus,
            log: NcclLogSummary::default(),
        },
        RanksLine::Error(f) => match f.kind {
            FailureKind::NotInstalled => NcclSide::NotMeasured { reason: f.reason },
            FailureKind::Collective => NcclSide::Failed {
                reason: f.reason,
                log: NcclLogSummary::default(),
            },
            FailureKind::Invalid => NcclSide::Inconclusive { reason: f.reason },
        },
        RanksLine::UniqueId { .. } => NcclSide::Failed {
            reason: "the NCCL ranks printed a second unique id".into(),
            log: NcclLogSummary::default(),
        },
    }
}

/// The judged NCCL debug log of one child.
pub fn summarize(log: &str) -> NcclLogSummary {
    let r = railguard_prober::nccl::parse_debug_log(log);
    NcclLogSummary {
        nccl_version: r.nccl_version,
        net: r.net,
        gdr: r.gdr,
        hcas: r.hcas,
        errors: r.errors,
        nccl_lines: r.nccl_lines,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::wire::RailRef;
    use railguard_prober::nccl::ranks::RanksFailure;

    #[test]
    fn hca_list_is_exact_match_and_logs_are_named_by_scope() {
        let rails = vec![
            RailRef {
                hca: "mlx5_0".into(),
                port: 1,
            },
            RailRef {
                hca: "mlx5_3".into(),
                port: 1,
            },
        ];
        assert_eq!(ib_hca(&rails), "=mlx5_0:1,mlx5_3:1");
        let mut req = NcclTestRequest {
            profile: "p".into(),
            peer_node: "node/b".into(),
            peer_addr: "x".into(),
            rails: rails.clone(),
            gpus: vec![],
            sizes: vec![4096],
            warmup: 1,
            iterations: 1,
            allow_gpu_pods: false,
            timeout_ms: 1,
            pair_key: None,
        };
        assert_eq!(log_name(&req, "root"), "nccl-pair-node_b-node-root.log");
        req.rails.truncate(1);
        assert_eq!(log_name(&req, "join"), "nccl-pair-node_b-mlx5_0-1-join.log");
    }

    #[test]
    fn child_errors_map_to_evidence_kinds() {
        let e = |kind| {
            side_of(RanksLine::Error(RanksFailure {
                kind,
                reason: "r".into(),
            }))
        };
        assert!(matches!(
            e(FailureKind::NotInstalled),
            NcclSide::NotMeasured { .. }
        ));
        assert!(matches!(
            e(FailureKind::Collective),
            NcclSide::Failed { .. }
        ));
        assert!(matches!(
            e(FailureKind::Invalid),
            NcclSide::Inconclusive { .. }
        ));
    }

    #[test]
    fn the_doubles_log_lines_are_judged_by_the_log_analysis() {
        let log = "h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4 (railguard test double)\n\
                   h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB lo:127.0.0.1<0>\n\
                   h:1:1 [0] NCCL INFO Using network IB\n\
                   h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA\n";
        let s = summarize(log);
        assert_eq!(s.net, Some(railguard_api::Transport::Ib));
        assert_eq!(s.gdr, Some(true));
        assert_eq!(s.hcas, vec!["mlx5_0:1"]);
    }
}
