//! Runs the native RDMA engine inside the Soft-RoCE test VM (see prober/vm/ and
//! tests/rdma_vm.rs). Each step prints one line `RG-RESULT <label> <json>` on stdout, where the
//! JSON is the result or `{"error": "...", "kind": "..."}`; the host test parses these lines
//! from the VM's serial log. Not meant for production nodes (the daemon embeds the engine).

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use railguard_api::profile::GpuRegistration;
use railguard_prober::rdma::peer::{authenticate_initiator, Message, SideChannel};
use railguard_prober::rdma::{
    run_write_test_initiator, run_write_test_responder, GpuMemory, MemoryKind, PeerConfig,
    PeerRdmaEngine, PeerTestRequest, RailBenchRequest, RailLocks, RdmaEngine, RdmaError,
    TrafficClass, VerbsEngine,
};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "railguard-rdma-vmtest",
    about = "RDMA engine checks for the Soft-RoCE VM test"
)]
struct Cli {
    #[command(subcommand)]
    step: Step,
    #[command(flatten)]
    gpu: GpuArgs,
}

/// Where GPU memory comes from (the CUDA test double inside the VM).
#[derive(clap::Args, Clone)]
struct GpuArgs {
    /// The CUDA driver library to load.
    #[arg(long, global = true, env = "RAILGUARD_CUDA_LIBRARY")]
    cuda_library: Option<std::path::PathBuf>,
    /// `auto`, `dma-buf` or `peer-mem`.
    #[arg(long, global = true, env = "RAILGUARD_GPU_REGISTRATION", default_value = "auto", value_parser = parse_registration)]
    gpu_registration: GpuRegistration,
    /// PCI bus ids of GPU 0, 1, ...
    #[arg(
        long,
        global = true,
        env = "RAILGUARD_GPU_BUS_IDS",
        value_delimiter = ','
    )]
    gpu_bus_ids: Vec<String>,
}

fn parse_registration(s: &str) -> Result<GpuRegistration, String> {
    match s {
        "auto" => Ok(GpuRegistration::Auto),
        "dma-buf" => Ok(GpuRegistration::DmaBuf),
        "peer-mem" => Ok(GpuRegistration::PeerMem),
        other => Err(format!("{other:?} is not auto, dma-buf or peer-mem")),
    }
}

#[derive(clap::Args, Clone)]
struct Sweep {
    #[arg(long, env = "RAILGUARD_HCA", default_value = "rxe0")]
    hca: String,
    #[arg(long, env = "RAILGUARD_PORT", default_value_t = 1)]
    port: u32,
    /// Comma-separated message sizes in bytes.
    #[arg(
        long,
        env = "RAILGUARD_SIZES",
        value_delimiter = ',',
        default_value = "8,4096,65536,1048576,8388608"
    )]
    sizes: Vec<usize>,
    #[arg(long, env = "RAILGUARD_ITERATIONS", default_value_t = 10)]
    iterations: u32,
    /// GRH traffic class of the QPs (a profile's `rdma.trafficClass`).
    #[arg(long, env = "RAILGUARD_TRAFFIC_CLASS", default_value_t = 0)]
    traffic_class: u8,
    /// Service level of the QPs (a profile's `rdma.serviceLevel`).
    #[arg(long, env = "RAILGUARD_SERVICE_LEVEL", default_value_t = 0)]
    service_level: u8,
    /// How long one completion may take before the test gives up, milliseconds.
    #[arg(
        long,
        env = "RAILGUARD_COMPLETION_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    completion_timeout_ms: u64,
}

#[derive(clap::Args, Clone)]
struct Peer {
    #[arg(long, env = "RAILGUARD_NODE")]
    node: String,
    #[arg(long, env = "RAILGUARD_PROFILE", default_value = "vm")]
    profile: String,
    #[arg(long, env = "RAILGUARD_PEER_TOKEN", hide_env_values = true)]
    token: String,
}

#[derive(Subcommand)]
enum Step {
    /// List RDMA devices.
    Devices,
    /// Loopback sweep on one device.
    Loopback {
        #[command(flatten)]
        sweep: Sweep,
        #[arg(long, env = "RAILGUARD_LABEL", default_value = "loopback")]
        label: String,
        /// Use GPU memory of this GPU instead of host memory.
        #[arg(long, env = "RAILGUARD_GPU")]
        gpu: Option<u32>,
    },
    /// Loopback with a corrupted remote key: must end in a clean error completion.
    WrongRkey {
        #[command(flatten)]
        sweep: Sweep,
    },
    /// Serve peer tests, one session per entry of --sessions (`normal` or `vanish`: accept the
    /// QP exchange, then drop the QP and the connection as a crashed peer would).
    Serve {
        #[arg(long, env = "RAILGUARD_LISTEN")]
        listen: String,
        #[arg(
            long,
            env = "RAILGUARD_SESSIONS",
            value_delimiter = ',',
            default_value = "normal"
        )]
        sessions: Vec<String>,
        #[command(flatten)]
        peer: Peer,
    },
    /// Run one peer test against a responder.
    Connect {
        #[arg(long, env = "RAILGUARD_PEER")]
        peer_addr: String,
        #[arg(long, env = "RAILGUARD_LABEL", default_value = "peer")]
        label: String,
        #[arg(long, env = "RAILGUARD_EXPECT_NODE")]
        expect_node: Option<String>,
        /// Keep retrying an unreachable peer this long (it may still be booting).
        #[arg(long, env = "RAILGUARD_WAIT_SECS", default_value_t = 120)]
        wait_secs: u64,
        /// Both sides use GPU memory of this GPU instead of host memory.
        #[arg(long, env = "RAILGUARD_GPU")]
        gpu: Option<u32>,
        #[command(flatten)]
        sweep: Sweep,
        #[command(flatten)]
        peer: Peer,
    },
}

fn report(label: &str, value: serde_json::Value) {
    println!("RG-RESULT {label} {value}");
}

fn error_json(e: &RdmaError) -> serde_json::Value {
    json!({"error": e.to_string(), "kind": e.kind()})
}

fn bench(sweep: &Sweep) -> RailBenchRequest {
    RailBenchRequest {
        hca: sweep.hca.clone(),
        port: sweep.port,
        memory: MemoryKind::Host,
        sizes: sweep.sizes.clone(),
        iterations: sweep.iterations,
        class: class(sweep),
    }
}

fn class(sweep: &Sweep) -> TrafficClass {
    TrafficClass {
        service_level: sweep.service_level,
        traffic_class: sweep.traffic_class,
    }
}

fn config(peer: &Peer) -> anyhow::Result<PeerConfig> {
    let mut cfg = PeerConfig::new(&peer.node, &peer.profile, &peer.token)?;
    cfg.test_timeout = Duration::from_secs(240);
    Ok(cfg)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let timeout = match &cli.step {
        Step::Loopback { sweep, .. } | Step::WrongRkey { sweep } | Step::Connect { sweep, .. } => {
            sweep.completion_timeout_ms
        }
        Step::Devices | Step::Serve { .. } => 10_000,
    };
    let engine = VerbsEngine {
        completion_timeout: Duration::from_millis(timeout),
        gpu_memory: GpuMemory::new(
            cli.gpu.cuda_library.clone(),
            cli.gpu.gpu_registration,
            (0u32..).zip(cli.gpu.gpu_bus_ids.iter().cloned()).collect(),
        ),
        ..VerbsEngine::new()
    };
    match cli.step {
        Step::Devices => match engine.devices() {
            Ok(d) => report("devices", json!({ "devices": d })),
            Err(e) => report("devices", error_json(&e)),
        },
        Step::Loopback { sweep, label, gpu } => {
            let mut req = bench(&sweep);
            if let Some(gpu) = gpu {
                req.memory = MemoryKind::Gpu { gpu };
            }
            match engine.loopback(&req) {
                Ok(r) => report(&label, serde_json::to_value(r)?),
                Err(e) => report(&label, error_json(&e)),
            }
        }
        Step::WrongRkey { sweep } => report("wrong-rkey", wrong_rkey(&engine, &sweep)),
        Step::Serve {
            listen,
            sessions,
            peer,
        } => serve(&engine, &listen, &sessions, &config(&peer)?)?,
        Step::Connect {
            peer_addr,
            label,
            expect_node,
            wait_secs,
            gpu,
            sweep,
            peer,
        } => {
            let cfg = config(&peer)?;
            let memory = gpu.map_or(MemoryKind::Host, |gpu| MemoryKind::Gpu { gpu });
            let req = PeerTestRequest {
                expect_node,
                ..PeerTestRequest {
                    hca: sweep.hca.clone(),
                    port: sweep.port,
                    local_memory: memory,
                    remote_memory: memory,
                    sizes: sweep.sizes.clone(),
                    iterations: sweep.iterations,
                    expect_node: None,
                    class: class(&sweep),
                }
            };
            let deadline = Instant::now() + Duration::from_secs(wait_secs);
            let locks = RailLocks::new();
            let outcome = loop {
                match run_write_test_initiator(&peer_addr, &cfg, &engine, &locks, &req) {
                    Err(RdmaError::PeerUnreachable { .. }) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    other => break other,
                }
            };
            match outcome {
                Ok(o) => report(&label, serde_json::to_value(o)?),
                Err(e) => report(&label, error_json(&e)),
            }
        }
    }
    Ok(())
}

/// A loopback pair whose sender is told a wrong rkey: the responder side must NAK and the
/// sender must see an error completion, not a hang or a crash.
fn wrong_rkey(engine: &VerbsEngine, sweep: &Sweep) -> serde_json::Value {
    let run = || -> Result<(), RdmaError> {
        let buffer = sweep.sizes.iter().copied().max().unwrap_or(4096);
        let mut sender = engine.open_endpoint(&sweep.hca, sweep.port, MemoryKind::Host, buffer)?;
        let mut receiver =
            engine.open_endpoint(&sweep.hca, sweep.port, MemoryKind::Host, buffer)?;
        receiver.connect(&sender.info(), TrafficClass::default())?;
        let mut target = receiver.info();
        sender.connect(&target, TrafficClass::default())?;
        target.rkey ^= 0x00ff_ff00;
        sender.write_sweep(&target, &[4096], 4).map(|_| ())
    };
    match run() {
        Ok(()) => json!({"unexpected": "write with a wrong rkey succeeded"}),
        Err(e) => error_json(&e),
    }
}

fn serve(
    engine: &VerbsEngine,
    listen: &str,
    sessions: &[String],
    cfg: &PeerConfig,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    println!("RG-LISTENING {listen}");
    let locks = RailLocks::new();
    for (i, mode) in sessions.iter().enumerate() {
        let (stream, _) = listener.accept().context("accepting a peer")?;
        let label = format!("served-{i}-{mode}");
        match mode.as_str() {
            "normal" => match run_write_test_responder(stream, cfg, engine, &locks) {
                Ok(s) => report(&label, serde_json::to_value(s)?),
                Err(e) => report(&label, error_json(&e)),
            },
            "vanish" => match vanish(stream, cfg, engine) {
                Ok(()) => report(&label, json!({"vanished": true})),
                Err(e) => report(&label, error_json(&e)),
            },
            other => bail!("unknown session mode {other:?}"),
        }
    }
    Ok(())
}

/// Plays a peer that crashes right after the QP exchange: the initiator's writes then have no
/// live QP to land on and its side channel is closed.
fn vanish(stream: TcpStream, cfg: &PeerConfig, engine: &VerbsEngine) -> Result<(), RdmaError> {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut ch = SideChannel::new(stream, peer.clone())?;
    authenticate_initiator(&mut ch, cfg)?;
    let Message::TestRequest {
        hca,
        port,
        sizes,
        initiator,
        class,
        ..
    } = ch.recv("test request", cfg.io_timeout)?
    else {
        return Err(RdmaError::PeerProtocol {
            peer,
            reason: "expected a test request".into(),
        });
    };
    let buffer = sizes.iter().copied().max().unwrap_or(4096);
    let mut endpoint = engine.open_endpoint(&hca, port, MemoryKind::Host, buffer)?;
    endpoint.connect(&initiator, class)?;
    ch.send(
        &Message::Accept {
            responder: endpoint.info(),
        },
        "accept",
        cfg.io_timeout,
    )?;
    drop(endpoint);
    drop(ch);
    Ok(())
}
