//! `railguard-prober nccl-ranks` (hidden): this node's ranks of one NCCL pair test, started
//! by the campaign endpoint as a child process (NCCL reads its environment once per process).
//! JSON lines on stdout, NCCL's debug output on stderr (see
//! `railguard_prober::nccl::ranks`).

use std::io::{BufRead, Write};
use std::path::PathBuf;

use clap::{Args, ValueHint};
use railguard_prober::nccl::ranks::{decode_id, run_ranks, JoinSpec, RanksLine, RanksSpec};

use crate::{Outcome, Status};

#[derive(Args, Debug)]
pub struct NcclRanksArgs {
    /// The CUDA driver library (default: libcuda.so.1 where dlopen finds it).
    #[arg(long, env = "RAILGUARD_CUDA_LIBRARY", value_hint = ValueHint::FilePath)]
    pub cuda_library: Option<PathBuf>,
    /// The NCCL library (default: the image's /usr/lib/railguard/nccl/libnccl.so.2 where it
    /// exists, else libnccl.so.2 where dlopen finds it).
    #[arg(long, env = "RAILGUARD_NCCL_LIBRARY", value_hint = ValueHint::FilePath)]
    pub nccl_library: Option<PathBuf>,
    /// The node's GPUs by PCI bus id, in index order (default: CUDA's, in PCI bus order).
    #[arg(long, env = "RAILGUARD_NODE_GPUS", value_delimiter = ',')]
    pub node_gpus: Vec<String>,
    /// Indices of the GPUs that run a rank each (default: all).
    #[arg(long, env = "RAILGUARD_GPUS", value_delimiter = ',')]
    pub gpus: Vec<u32>,
    /// Message sizes of the sweep, bytes.
    #[arg(long, env = "RAILGUARD_SIZES", value_delimiter = ',', required = true)]
    pub sizes: Vec<usize>,
    /// Untimed all-reduces per size.
    #[arg(long, env = "RAILGUARD_WARMUP", default_value_t = 5)]
    pub warmup: u32,
    /// Timed all-reduces per size.
    #[arg(long, env = "RAILGUARD_ITERATIONS", default_value_t = 20)]
    pub iterations: u32,
    /// Join a communicator of this many ranks (the unique id is read from stdin); without
    /// it this side is rank 0 and prints the id.
    #[arg(long, env = "RAILGUARD_NRANKS", requires = "first_rank")]
    pub nranks: Option<u32>,
    /// This node's first rank when joining.
    #[arg(long, env = "RAILGUARD_FIRST_RANK", requires = "nranks")]
    pub first_rank: Option<u32>,
    /// The node's own loopback: a communicator of this process's ranks alone (no id printed,
    /// none read).
    #[arg(long, env = "RAILGUARD_SINGLE_NODE", conflicts_with = "nranks")]
    pub single_node: bool,
}

fn print(line: &RanksLine) {
    if let Ok(text) = serde_json::to_string(line) {
        let mut out = std::io::stdout().lock();
        // The parent waits for this line; a closed pipe means it is gone.
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
}

impl NcclRanksArgs {
    pub fn run(self) -> anyhow::Result<Outcome> {
        let join = match (self.nranks, self.first_rank) {
            (Some(nranks), Some(first_rank)) => {
                let mut line = String::new();
                std::io::stdin().lock().read_line(&mut line)?;
                let unique_id = decode_id(&line).map_err(|e| anyhow::anyhow!("stdin: {e}"))?;
                Some(JoinSpec {
                    unique_id,
                    nranks,
                    first_rank,
                })
            }
            _ => None,
        };
        let spec = RanksSpec {
            cuda_library: self.cuda_library,
            nccl_library: self.nccl_library,
            node_gpus: self.node_gpus,
            gpu_indices: self.gpus,
            join,
            single_node: self.single_node,
            sizes: self.sizes,
            warmup: self.warmup,
            iterations: self.iterations,
        };
        let (line, failed) = match run_ranks(&spec, &mut print) {
            Ok(result) => (RanksLine::Result(result), false),
            Err(failure) => (RanksLine::Error(failure), true),
        };
        print(&line);
        Ok(Outcome::new(String::new(), Status::fail_if(failed)))
    }
}
