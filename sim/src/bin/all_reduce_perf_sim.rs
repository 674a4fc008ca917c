//! Stand-in for nccl-tests' `all_reduce_perf` on simulated nodes: a real child process that
//! takes the same arguments and NCCL environment, prints nccl-tests output and NCCL INFO
//! lines for the node model found under `RAILGUARD_SIM_ROOT` (a tree written by
//! `railguard-prober sim-sysfs` or `certify --sim`), and grows the model's error counters in
//! that sysfs tree while it "runs".
//!
//! Environment: `RAILGUARD_SIM_ROOT` (required), `RAILGUARD_SIM_HOSTNAME`, and the NCCL
//! variables a real run honours: `NCCL_DEBUG`, `NCCL_DEBUG_FILE` (`%h`, `%p`), `NCCL_IB_HCA`,
//! `NCCL_NET_GDR_LEVEL` (`LOC` disables GPUDirect), `NCCL_IB_DISABLE` (`1` forces sockets),
//! `NCCL_P2P_DISABLE` and `NCCL_SHM_DISABLE` (`1`: the GPUs connect through the NICs).
//!
//! Like the real tool run without MPI it is one process of `-t` threads × `-g` GPUs (both
//! default 1: nccl-tests `src/common.cu`), all on this host; more GPUs than the node has
//! fail as nccl-tests fails (`src/util.cu`, `writeDeviceReport`: "Invalid number of GPUs",
//! exit status 5, `testNotImplemented`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use railguard_api::profile::{parse_ib_hca, rank_request};
use railguard_api::Transport;
use railguard_sim::standin::{
    parse_size, peer_path, PeerPath, StandinRun, NO_GDR_SHARE, SHM_BUSBW_GBPS, SOCKET_BUSBW_GBPS,
};
use railguard_sim::{bump_counters, ModelPortState, NodeModel, SIM_MODEL_PATH};

/// nccl-tests' `testNotImplemented`, its status for more GPUs than the node has.
const EXIT_TOO_MANY_GPUS: u8 = 5;

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("all_reduce_perf_sim: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    let root = PathBuf::from(
        std::env::var("RAILGUARD_SIM_ROOT").context("RAILGUARD_SIM_ROOT is not set")?,
    );
    let model_path = root.join(SIM_MODEL_PATH);
    let text = std::fs::read_to_string(&model_path)
        .with_context(|| format!("cannot read {}", model_path.display()))?;
    let model = NodeModel::from_yaml(&text)
        .with_context(|| format!("cannot parse {}", model_path.display()))?;

    let mut min_bytes = 32 << 20;
    let mut max_bytes = 32 << 20;
    let mut factor = 2u64;
    let mut warmup = 5u32;
    let mut iters = 20u32;
    let all: Vec<String> = std::env::args().skip(1).collect();
    let ranks_asked = rank_request(&all).map_err(anyhow::Error::msg)?;
    let mut args = all.into_iter();
    while let Some(flag) = args.next() {
        // `-g8`, `--ngpus=8`: read by rank_request above.
        let inline = ["-g", "-t"]
            .iter()
            .any(|f| flag.starts_with(f) && flag.len() > 2)
            || flag.starts_with("--ngpus=")
            || flag.starts_with("--nthreads=");
        if inline {
            continue;
        }
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-b" | "--minbytes" => {
                let v = value()?;
                min_bytes = parse_size(&v).with_context(|| format!("bad size {v:?}"))?;
            }
            "-e" | "--maxbytes" => {
                let v = value()?;
                max_bytes = parse_size(&v).with_context(|| format!("bad size {v:?}"))?;
            }
            "-f" | "--stepfactor" => factor = value()?.parse().context("bad -f")?,
            "-w" | "--warmup_iters" => warmup = value()?.parse().context("bad -w")?,
            "-n" | "--iters" => iters = value()?.parse().context("bad -n")?,
            "-g" | "--ngpus" | "-c" | "--check" | "-t" | "--nthreads" | "-o" | "--op" | "-d"
            | "--datatype" | "-a" | "--average" | "-z" | "--blocking" | "-G" | "--cudagraph" => {
                value()?;
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    if min_bytes == 0 || max_bytes < min_bytes || factor < 2 {
        bail!("invalid size sweep -b {min_bytes} -e {max_bytes} -f {factor}");
    }

    // The rails NCCL may open: NCCL_IB_HCA, or every port of the node.
    let wanted: Vec<(String, Option<u32>)> = match std::env::var("NCCL_IB_HCA") {
        Ok(v) if !v.trim().is_empty() => {
            let list = parse_ib_hca(&v).map_err(anyhow::Error::msg)?;
            list.entries.into_iter().map(|e| (e.hca, e.port)).collect()
        }
        _ => model
            .hcas()
            .iter()
            .map(|h| (h.name.clone(), None))
            .collect(),
    };
    let mut hcas = Vec::new();
    for (hca, port) in &wanted {
        let Some(h) = model.hcas().into_iter().find(|h| &h.name == hca) else {
            continue;
        };
        for p in &h.ports {
            if port.is_some_and(|want| want != p.port) || p.state != ModelPortState::Active {
                continue;
            }
            hcas.push((format!("{}:{}", h.name, p.port), p.link_layer.to_string()));
        }
    }
    let requested = wanted.len().max(1) as f64;
    let behaviour = &model.nccl;
    let ib_disabled = std::env::var("NCCL_IB_DISABLE").is_ok_and(|v| v.trim() == "1");
    let gdr_off = std::env::var("NCCL_NET_GDR_LEVEL").is_ok_and(|v| v.trim() == "LOC");
    let transport = if ib_disabled || hcas.is_empty() {
        Transport::Socket
    } else {
        behaviour.transport
    };
    let platform_gdr = model.platform.nvidia_peermem || model.platform.open_kernel_module;
    let gdr = behaviour.gdr && platform_gdr && !gdr_off && transport != Transport::Socket;
    // Loopback: each GPU's ring hop goes out of its own NIC, so the plateau is one rail's
    // (the model's busbw_gbps); a missing rail puts two GPUs on one NIC.
    let mut busbw = behaviour.busbw_gbps * (hcas.len() as f64 / requested).min(1.0);
    if transport == Transport::Socket {
        busbw = busbw.min(SOCKET_BUSBW_GBPS);
    } else if !gdr {
        busbw *= NO_GDR_SHARE;
    }
    let host = std::env::var("RAILGUARD_SIM_HOSTNAME").unwrap_or_else(|_| model.name.clone());
    let threads = ranks_asked.threads;
    let gpus_per_thread = ranks_asked.gpus.unwrap_or(1);
    let ranks = threads * gpus_per_thread;
    let available = u32::try_from(model.gpus().len()).unwrap_or(u32::MAX);
    if ranks > available {
        eprintln!("Invalid number of GPUs: {ranks} requested but only {available} were found.");
        eprintln!("Please check the number of processes and GPUs per process.");
        return Ok(ExitCode::from(EXIT_TOO_MANY_GPUS));
    }
    let set = |k: &str| std::env::var(k).is_ok_and(|v| v.trim() == "1");
    let path = peer_path(ranks, set("NCCL_P2P_DISABLE"), set("NCCL_SHM_DISABLE"));
    let busbw = match path {
        PeerPath::Alone => 0.0,
        PeerPath::P2p => behaviour.nvlink_busbw_gbps,
        PeerPath::Shm => SHM_BUSBW_GBPS,
        PeerPath::Net => busbw,
    };
    let pid = std::process::id();
    let run = StandinRun {
        host: host.clone(),
        threads,
        gpus_per_thread,
        path,
        busbw_gbps: busbw.max(0.01),
        transport,
        gdr,
        wrong: behaviour.wrong,
        nccl_version: behaviour.nccl_version.clone(),
        cuda_version: model.software.cuda.clone(),
        hcas,
        ifname: "eth0".into(),
        min_bytes,
        max_bytes,
        factor,
        warmup_iters: warmup,
        iters,
        pid,
    };

    let debug = std::env::var("NCCL_DEBUG").is_ok_and(|v| v.eq_ignore_ascii_case("INFO"));
    let log = run.debug_log();
    if debug {
        match std::env::var("NCCL_DEBUG_FILE") {
            Ok(pattern) if !pattern.is_empty() => {
                let path = pattern.replace("%h", &host).replace("%p", &pid.to_string());
                std::fs::write(&path, &log).with_context(|| format!("cannot write {path}"))?;
            }
            _ => print!("{log}"),
        }
    }
    // The traffic of the run is what makes a bad port's error counters grow.
    if path == PeerPath::Net {
        bump_counters(&model, &root).context("cannot grow counters in the simulated sysfs")?;
    }
    print!("{}", run.stdout());
    Ok(ExitCode::SUCCESS)
}
