//! Native RDMA benchmarks: RDMA WRITE bandwidth and latency per rail.
//!
//! Everything above this module talks to [`RdmaEngine`] (one node: loopback on one HCA) and
//! [`PeerRdmaEngine`] (two nodes: an RC QP pair between HCA *i* of node A and HCA *i* of node B,
//! connected through the authenticated TCP side channel in [`peer`]). Two engines implement
//! them: [`verbs::VerbsEngine`] (real ibverbs; the only `unsafe` code of the crate) and the
//! simulated engine of `railguard-sim` (plain-data rail models with injected faults), so the
//! rest of the pipeline runs unchanged on machines without HCAs.

pub mod gpu_memory;
pub mod peer;
pub mod verbs;

use serde::{Deserialize, Serialize};

pub use gpu_memory::{GpuMemory, GpuRegistrationReport, RegistrationAttempt, RegistrationPath};
pub use peer::{
    run_write_test_initiator, run_write_test_responder, PeerConfig, PeerTestOutcome,
    PeerTestRequest, RailLocks,
};
pub use verbs::VerbsEngine;

/// Where the benchmark buffers live. GPU memory exercises the GPU↔HCA path (GPUDirect RDMA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum MemoryKind {
    Host,
    Gpu { gpu: u32 },
}

impl std::fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemoryKind::Host => write!(f, "host"),
            MemoryKind::Gpu { gpu } => write!(f, "gpu{gpu}"),
        }
    }
}

/// The class an RDMA test sends in: the InfiniBand service level and the RoCE GRH traffic
/// class on the QP's address vector, as NCCL sets them (`src/transport/net_ib/connect.cc`:
/// `ah_attr.sl` and `ah_attr.grh.traffic_class` from `NCCL_IB_SL`/`NCCL_IB_TC`, default 0,
/// and the accepting side takes the connecting side's values). A test in class 0 on a fabric
/// whose lossless class is another never sees that class's PFC/ECN behaviour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrafficClass {
    #[serde(default)]
    pub service_level: u8,
    #[serde(default)]
    pub traffic_class: u8,
}

impl TrafficClass {
    /// The profile's `rdma.serviceLevel` and `rdma.trafficClass` (0 where unset).
    pub fn of_profile(spec: &railguard_api::FabricProfileSpec) -> TrafficClass {
        let rdma = spec.rdma.as_ref();
        TrafficClass {
            service_level: rdma.and_then(|r| r.service_level).unwrap_or(0),
            traffic_class: rdma.and_then(|r| r.traffic_class).unwrap_or(0),
        }
    }

    pub fn is_default(&self) -> bool {
        *self == TrafficClass::default()
    }
}

/// One rail benchmark: RDMA WRITE over an RC QP for each message size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RailBenchRequest {
    pub hca: String,
    pub port: u32,
    pub memory: MemoryKind,
    /// Message sizes in bytes, each measured separately.
    pub sizes: Vec<usize>,
    /// Writes per size for the bandwidth run. The loopback's latency ping-pong makes
    /// [`LATENCY_ITERATIONS`] round trips regardless, as `ib_write_lat` and `ib_write_bw` are
    /// separate runs with their own defaults.
    pub iterations: u32,
    /// Service level and traffic class of the QPs.
    #[serde(default, skip_serializing_if = "TrafficClass::is_default")]
    pub class: TrafficClass,
}

/// Largest message a request may ask for; bigger buffers are never needed to reach line rate.
pub const MAX_MESSAGE_BYTES: usize = 1 << 30;
/// Upper bound for `iterations`, so a typo cannot keep a node pending for hours.
pub const MAX_ITERATIONS: u32 = 1_000_000;

impl RailBenchRequest {
    /// A host-memory request with the default sweep.
    pub fn host(hca: impl Into<String>, port: u32) -> Self {
        RailBenchRequest {
            hca: hca.into(),
            port,
            memory: MemoryKind::Host,
            sizes: default_sizes(),
            // perftest's DEF_ITERS_WB: ib_write_bw's iterations (src/perftest_parameters.h).
            iterations: 5000,
            class: TrafficClass::default(),
        }
    }

    /// Rejects requests no engine should try: empty sweep, zero or absurd sizes/iterations.
    pub fn validate(&self) -> Result<(), RdmaError> {
        let invalid = |reason: String| Err(RdmaError::InvalidRequest { reason });
        if self.class.service_level > railguard_api::profile::MAX_SERVICE_LEVEL {
            return invalid(format!(
                "service level {} is not 0-{}",
                self.class.service_level,
                railguard_api::profile::MAX_SERVICE_LEVEL
            ));
        }
        if self.hca.trim().is_empty() {
            return invalid("hca name is empty".into());
        }
        if self.port == 0 || self.port > 255 {
            return invalid(format!("port {} is out of range 1..=255", self.port));
        }
        if self.sizes.is_empty() {
            return invalid("no message sizes".into());
        }
        if let Some(bad) = self
            .sizes
            .iter()
            .find(|&&s| s == 0 || s > MAX_MESSAGE_BYTES)
        {
            return invalid(format!(
                "message size {bad} is out of range 1..={MAX_MESSAGE_BYTES}"
            ));
        }
        if self.iterations == 0 || self.iterations > MAX_ITERATIONS {
            return invalid(format!(
                "iterations {} is out of range 1..={MAX_ITERATIONS}",
                self.iterations
            ));
        }
        Ok(())
    }

    /// The buffer each side needs: the largest message.
    pub fn buffer_bytes(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(0)
    }
}

/// The default sweep: one small message for latency, then 4 KiB .. 8 MiB in powers of two.
pub fn default_sizes() -> Vec<usize> {
    let mut sizes = vec![8];
    sizes.extend((12..=23).map(|p| 1usize << p));
    sizes
}

/// One message size of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizePoint {
    pub bytes: usize,
    /// RDMA WRITE bandwidth, Gb/s (10^9 bits per second, as link rates are quoted).
    pub bw_gbps: f64,
    /// Average time from posting one signaled write to its completion, microseconds: about a
    /// round trip (the write and its ACK), not `ib_write_lat`'s figure (see [`PingPongLatency`]).
    pub lat_us: f64,
}

/// Message size of the latency ping-pong: perftest's `DEF_SIZE_LAT` (`ib_write_lat`'s default,
/// linux-rdma/perftest `src/perftest_parameters.h`).
pub const LATENCY_BYTES: usize = 2;
/// Round trips of the latency ping-pong: perftest's `DEF_ITERS` (`src/perftest_parameters.h`).
pub const LATENCY_ITERATIONS: u32 = 1000;
/// The slowest samples perftest leaves out of its latency statistics (`LAT_MEASURE_TAIL`,
/// `src/perftest_parameters.c`).
const LAT_MEASURE_TAIL: usize = 2;

/// How the waiting side of the ping-pong learns that a write arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PingPongWait {
    /// It polls the last byte of its own receive buffer for the new value (`ib_write_lat`).
    LastByte,
    /// The write carries an immediate and the waiting side polls its receive completion
    /// (`ib_write_lat --write_with_imm`): perftest's only write latency test for device
    /// memory, which the CPU cannot poll (`src/perftest_parameters.c`).
    Immediate,
}

/// The loopback's latency as perftest's `ib_write_lat` measures it (`src/write_lat.c`,
/// `run_iter_lat_write` in `src/perftest_resources.c`): QP A writes into B's buffer, B waits
/// for it to land and writes back into A's buffer, A waits for that, and so on; each sample is
/// the time between two consecutive posts of A (one round trip) and every figure is half of
/// one (`print_report_lat`: `rtt_factor` 2 for WRITE).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingPongLatency {
    pub bytes: usize,
    /// Round trips made (`ib_write_lat`'s `#iterations`).
    pub iterations: u32,
    /// Round trips the statistics are over: the intervals between posts, less perftest's
    /// tail of the 2 slowest.
    pub samples: u32,
    /// Median half round trip, microseconds: `ib_write_lat`'s `t_typical`.
    pub typical_us: f64,
    pub min_us: f64,
    pub avg_us: f64,
    /// The slowest sample kept.
    pub max_us: f64,
    /// The writes went inline (perftest inlines up to the device's cap, never device memory).
    pub inline: bool,
    pub wait: PingPongWait,
    /// Writes the waiting side saw land with the value it waited for: the last byte of the
    /// message, or the immediate (two per round trip when nothing was lost).
    pub delivered: u32,
}

/// Half-round-trip statistics of a ping-pong, microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HalfRoundTrips {
    pub samples: u32,
    pub typical_us: f64,
    pub min_us: f64,
    pub avg_us: f64,
    pub max_us: f64,
}

/// Pure: perftest's `print_report_lat` (`src/perftest_parameters.c`) over the times at which
/// one side posted its writes, microseconds from any origin: the intervals between consecutive
/// posts (round trips) sorted, the `LAT_MEASURE_TAIL` slowest dropped (fewer when that would
/// leave none), the median as its `get_median`, and every figure halved. `None` with fewer
/// than two posts.
pub fn half_round_trips(posted_us: &[f64]) -> Option<HalfRoundTrips> {
    let mut rtts: Vec<f64> = posted_us.windows(2).map(|w| w[1] - w[0]).collect();
    if rtts.is_empty() {
        return None;
    }
    rtts.sort_by(f64::total_cmp);
    let kept = rtts.len().saturating_sub(LAT_MEASURE_TAIL).max(1);
    let rtts = &rtts[..kept];
    let median = if (kept - 1) % 2 == 1 {
        (rtts[kept / 2] + rtts[kept / 2 - 1]) / 2.0
    } else {
        rtts[kept / 2]
    };
    Some(HalfRoundTrips {
        samples: u32::try_from(kept).unwrap_or(u32::MAX),
        typical_us: median / 2.0,
        min_us: rtts[0] / 2.0,
        avg_us: rtts.iter().sum::<f64>() / kept as f64 / 2.0,
        max_us: rtts[kept - 1] / 2.0,
    })
}

/// The result of one rail benchmark.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RailBenchResult {
    pub hca: String,
    pub port: u32,
    pub memory: MemoryKind,
    pub points: Vec<SizePoint>,
    /// Highest bandwidth of the sweep, Gb/s.
    pub peak_bw_gbps: f64,
    /// Small-message latency, microseconds. Loopback: `ib_write_lat`'s typical half round trip
    /// of the ping-pong ([`PingPongLatency::typical_us`]). Two-node tests, which run no
    /// ping-pong: post-to-completion of the sweep's smallest write (about a round trip).
    pub small_msg_latency_us: f64,
    /// The loopback's ping-pong; `None` for two-node tests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<PingPongLatency>,
    /// The GID table index the sending QP used (on RoCE the one NCCL would choose).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u32>,
    /// That GID, 32 lowercase hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<String>,
    /// GPU memory only: the GPU and the registration path that worked (and those that did
    /// not, before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration: Option<GpuRegistrationReport>,
}

impl RailBenchResult {
    /// Builds a result from its points; the summary values are derived, never supplied.
    pub fn from_points(hca: &str, port: u32, memory: MemoryKind, points: Vec<SizePoint>) -> Self {
        let peak_bw_gbps = points.iter().map(|p| p.bw_gbps).fold(0.0, f64::max);
        let small_msg_latency_us = points
            .iter()
            .min_by_key(|p| p.bytes)
            .map(|p| p.lat_us)
            .unwrap_or(0.0);
        RailBenchResult {
            hca: hca.to_string(),
            port,
            memory,
            points,
            peak_bw_gbps,
            small_msg_latency_us,
            latency: None,
            gid_index: None,
            gid: None,
            registration: None,
        }
    }

    /// The ping-pong becomes the result's small-message latency.
    pub fn with_pingpong(mut self, latency: PingPongLatency) -> Self {
        self.small_msg_latency_us = latency.typical_us;
        self.latency = Some(latency);
        self
    }

    /// Records the GID the sending side ran on.
    pub fn with_gid_of(mut self, sender: &QpInfo) -> Self {
        self.gid_index = Some(sender.gid_index);
        self.gid = Some(sender.gid.clone());
        self
    }
}

/// Everything that can go wrong in an RDMA benchmark, local or with a peer.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    #[error("no RDMA devices")]
    NoDevices,
    #[error("RDMA device {hca} not found (available: {})", available.join(", "))]
    DeviceNotFound { hca: String, available: Vec<String> },
    #[error("port {port} of {hca} is not active (state {state})")]
    PortNotActive {
        hca: String,
        port: u32,
        state: String,
    },
    #[error("{op} failed: {}", errno_text(*.errno))]
    Verbs { op: &'static str, errno: i32 },
    #[error("{op} completed with status {status} ({status_code}) on {hca}")]
    WorkCompletion {
        hca: String,
        op: &'static str,
        status: String,
        status_code: u32,
    },
    #[error("{op} timed out after {after_ms} ms")]
    Timeout { op: String, after_ms: u64 },
    #[error("GPU memory on gpu {gpu} is unavailable: {reason}")]
    GpuMemoryUnavailable { gpu: u32, reason: String },
    #[error("invalid benchmark request: {reason}")]
    InvalidRequest { reason: String },
    #[error("cannot reach peer {peer}")]
    PeerUnreachable {
        peer: String,
        #[source]
        source: std::io::Error,
    },
    #[error("side channel to peer {peer} failed during {stage}")]
    PeerIo {
        peer: String,
        stage: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("peer {peer} closed the side channel during {stage}")]
    PeerGone { peer: String, stage: &'static str },
    #[error("peer {peer} failed authentication: {reason}")]
    PeerAuth { peer: String, reason: String },
    #[error("peer {peer} violated the side-channel protocol: {reason}")]
    PeerProtocol { peer: String, reason: String },
    #[error("peer {peer} refused the test: {reason}")]
    PeerRefused { peer: String, reason: String },
    /// The side channel (not the RDMA writes) ran past its limit: the peer is saturated,
    /// stalled or slow, which says nothing about the rail.
    #[error("peer {peer} did not answer within {after_ms} ms during {stage}")]
    PeerTimeout {
        peer: String,
        stage: &'static str,
        after_ms: u64,
    },
    #[error("rail {hca}:{port} is busy with another test")]
    Busy { hca: String, port: u32 },
    /// The node is not lending rails to pair tests now (its own invasive run holds it).
    #[error("rail {hca}:{port} is busy: {reason}")]
    NodeBusy {
        hca: String,
        port: u32,
        reason: String,
    },
    #[error(
        "RDMA WRITE on {hca}:{port} completed, but {wrong} of {bytes} bytes at the target differ from the source"
    )]
    DataMismatch {
        hca: String,
        port: u32,
        wrong: usize,
        bytes: usize,
    },
}

impl RdmaError {
    /// A stable short name of the variant, for metrics, JSON and test assertions.
    pub fn kind(&self) -> &'static str {
        match self {
            RdmaError::NoDevices => "no-devices",
            RdmaError::DeviceNotFound { .. } => "device-not-found",
            RdmaError::PortNotActive { .. } => "port-not-active",
            RdmaError::Verbs { .. } => "verbs",
            RdmaError::WorkCompletion { .. } => "work-completion",
            RdmaError::Timeout { .. } => "timeout",
            RdmaError::GpuMemoryUnavailable { .. } => "gpu-memory-unavailable",
            RdmaError::InvalidRequest { .. } => "invalid-request",
            RdmaError::PeerUnreachable { .. } => "peer-unreachable",
            RdmaError::PeerIo { .. } => "peer-io",
            RdmaError::PeerGone { .. } => "peer-gone",
            RdmaError::PeerAuth { .. } => "peer-auth",
            RdmaError::PeerProtocol { .. } => "peer-protocol",
            RdmaError::PeerRefused { .. } => "peer-refused",
            RdmaError::PeerTimeout { .. } => "peer-timeout",
            RdmaError::Busy { .. } => "busy",
            RdmaError::NodeBusy { .. } => "node-busy",
            RdmaError::DataMismatch { .. } => "data-mismatch",
        }
    }
}

fn errno_text(errno: i32) -> String {
    // io::Error's text already ends in "(os error N)".
    std::io::Error::from_raw_os_error(errno).to_string()
}

/// One node's RDMA benchmarks: the certification's view of the native engine.
pub trait RdmaEngine: Send + Sync {
    /// RDMA WRITE between two QPs on the same HCA port (exercises the HCA and the
    /// memory↔HCA path, not the wire).
    fn loopback(&self, req: &RailBenchRequest) -> Result<RailBenchResult, RdmaError>;
    /// Names of the RDMA devices this node has (e.g. `mlx5_0`).
    fn devices(&self) -> Result<Vec<String>, RdmaError>;
}

/// What one side of an RC connection tells the other through the side channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QpInfo {
    pub hca: String,
    pub port: u32,
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    /// GID as 32 lowercase hex digits (RoCE needs it; IB may leave it all zero).
    pub gid: String,
    pub gid_index: u32,
    /// Remote key and address of this side's registered buffer.
    pub rkey: u32,
    pub addr: u64,
    pub len: u64,
    /// Active path MTU as the verbs enum value (1=256 .. 5=4096).
    pub mtu: u32,
    /// Set by the simulated engine only (`railguard-sim`): the rail model behind this
    /// endpoint, opaque to everything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim: Option<serde_json::Value>,
}

/// One side of an RC QP with a registered buffer, before and after connection. `Any` lets an
/// engine recognise its own kind of endpoint in [`RdmaEndpoint::pingpong`].
pub trait RdmaEndpoint: Send + std::any::Any {
    /// What the peer needs to connect to this endpoint and write into its buffer.
    fn info(&self) -> QpInfo;
    /// Moves the QP to ready-to-send against `remote`, sending in `class`.
    fn connect(&mut self, remote: &QpInfo, class: TrafficClass) -> Result<(), RdmaError>;
    /// RDMA WRITE sweep from this endpoint's buffer into `remote`'s buffer (after `connect`).
    fn write_sweep(
        &mut self,
        remote: &QpInfo,
        sizes: &[usize],
        iterations: u32,
    ) -> Result<Vec<SizePoint>, RdmaError>;
    /// `ib_write_lat`'s ping-pong of `bytes`-byte writes, `iterations` round trips, between
    /// this endpoint and `partner`: another endpoint of the same engine, in this process,
    /// connected to this one (the loopback). This endpoint posts first.
    fn pingpong(
        &mut self,
        partner: &mut dyn RdmaEndpoint,
        bytes: usize,
        iterations: u32,
    ) -> Result<PingPongLatency, RdmaError>;
    /// How this endpoint's GPU buffer was registered; `None` for host memory.
    fn registration(&self) -> Option<GpuRegistrationReport> {
        None
    }
    /// The first `len` bytes of a host-memory buffer, to check what a write delivered;
    /// `None` where the engine cannot read its buffer (GPU memory, a simulated endpoint).
    fn host_bytes(&self, _len: usize) -> Option<Vec<u8>> {
        None
    }
}

/// How many of `dst`'s bytes differ from `src` (all of the longer tail when lengths differ).
pub fn differing_bytes(src: &[u8], dst: &[u8]) -> usize {
    let common = src.iter().zip(dst).filter(|(a, b)| a != b).count();
    common + src.len().abs_diff(dst.len())
}

/// An engine that can also open endpoints for a two-node test.
pub trait PeerRdmaEngine: RdmaEngine {
    /// Opens an RC QP and a buffer of `buffer_bytes` on `hca`:`port`.
    fn open_endpoint(
        &self,
        hca: &str,
        port: u32,
        memory: MemoryKind,
        buffer_bytes: usize,
    ) -> Result<Box<dyn RdmaEndpoint>, RdmaError>;
}

/// Loopback through two endpoints of the same engine; shared by the real and simulated engines
/// so the loopback and the peer test measure the same way.
pub fn loopback_via_endpoints(
    engine: &dyn PeerRdmaEngine,
    req: &RailBenchRequest,
) -> Result<RailBenchResult, RdmaError> {
    req.validate()?;
    let buffer = req.buffer_bytes();
    let mut sender = engine.open_endpoint(&req.hca, req.port, req.memory, buffer)?;
    let mut receiver = engine.open_endpoint(&req.hca, req.port, req.memory, buffer)?;
    // Same order as the peer protocol: the receiving side connects first, then answers.
    let s_info = sender.info();
    receiver.connect(&s_info, req.class)?;
    let r_info = receiver.info();
    sender.connect(&r_info, req.class)?;
    // ib_write_lat before ib_write_bw: the sweep's last write then leaves the bytes checked
    // below, which the ping-pong's would not.
    let latency = sender.pingpong(receiver.as_mut(), LATENCY_BYTES, LATENCY_ITERATIONS)?;
    let points = sender.write_sweep(&r_info, &req.sizes, req.iterations)?;
    // The last size was written last: its bytes must be at the target (perftest reports
    // bandwidth only; a write that completes without delivering is a failed rail).
    if let Some(&last) = req.sizes.last() {
        if let (Some(src), Some(dst)) = (sender.host_bytes(last), receiver.host_bytes(last)) {
            let wrong = differing_bytes(&src, &dst);
            if wrong > 0 {
                return Err(RdmaError::DataMismatch {
                    hca: req.hca.clone(),
                    port: req.port,
                    wrong,
                    bytes: last,
                });
            }
        }
    }
    let mut result = RailBenchResult::from_points(&req.hca, req.port, req.memory, points)
        .with_pingpong(latency)
        .with_gid_of(&s_info);
    result.registration = sender.registration();
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Endpoints whose writes "complete" and whose target holds `target` afterwards.
    struct FakeEngine {
        target: Vec<u8>,
    }
    struct FakeEndpoint {
        bytes: Vec<u8>,
    }
    impl RdmaEndpoint for FakeEndpoint {
        fn info(&self) -> QpInfo {
            QpInfo {
                hca: "mlx5_0".into(),
                port: 1,
                qpn: 1,
                psn: 0,
                lid: 1,
                gid: "0".repeat(32),
                gid_index: 0,
                rkey: 1,
                addr: 0,
                len: 1 << 20,
                mtu: 5,
                sim: None,
            }
        }
        fn connect(&mut self, _: &QpInfo, _: TrafficClass) -> Result<(), RdmaError> {
            Ok(())
        }
        fn write_sweep(
            &mut self,
            _: &QpInfo,
            sizes: &[usize],
            _: u32,
        ) -> Result<Vec<SizePoint>, RdmaError> {
            Ok(sizes
                .iter()
                .map(|&bytes| SizePoint {
                    bytes,
                    bw_gbps: 1.0,
                    lat_us: 1.0,
                })
                .collect())
        }
        fn pingpong(
            &mut self,
            _: &mut dyn RdmaEndpoint,
            bytes: usize,
            iterations: u32,
        ) -> Result<PingPongLatency, RdmaError> {
            Ok(PingPongLatency {
                bytes,
                iterations,
                samples: iterations - 3,
                typical_us: 0.5,
                min_us: 0.5,
                avg_us: 0.5,
                max_us: 0.5,
                inline: true,
                wait: PingPongWait::LastByte,
                delivered: 2 * iterations,
            })
        }
        fn host_bytes(&self, len: usize) -> Option<Vec<u8>> {
            self.bytes.get(..len).map(<[u8]>::to_vec)
        }
    }
    impl RdmaEngine for FakeEngine {
        fn loopback(&self, req: &RailBenchRequest) -> Result<RailBenchResult, RdmaError> {
            loopback_via_endpoints(self, req)
        }
        fn devices(&self) -> Result<Vec<String>, RdmaError> {
            Ok(vec![])
        }
    }
    impl PeerRdmaEngine for FakeEngine {
        fn open_endpoint(
            &self,
            _: &str,
            _: u32,
            _: MemoryKind,
            _: usize,
        ) -> Result<Box<dyn RdmaEndpoint>, RdmaError> {
            // The sender opens first and holds the source pattern.
            static OPENED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = OPENED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Box::new(FakeEndpoint {
                bytes: if n.is_multiple_of(2) {
                    vec![7u8; 1 << 20]
                } else {
                    self.target.clone()
                },
            }))
        }
    }

    #[test]
    fn a_write_that_does_not_deliver_its_bytes_fails_the_rail() {
        let req = RailBenchRequest {
            sizes: vec![4096, 1 << 20],
            iterations: 1,
            ..RailBenchRequest::host("mlx5_0", 1)
        };
        let mut target = vec![7u8; 1 << 20];
        target[100] = 0;
        target[5000] = 1;
        let e = FakeEngine { target }.loopback(&req).unwrap_err();
        assert_eq!(e.kind(), "data-mismatch");
        assert_eq!(
            e.to_string(),
            "RDMA WRITE on mlx5_0:1 completed, but 2 of 1048576 bytes at the target differ from the source"
        );
        assert!(FakeEngine {
            target: vec![7u8; 1 << 20]
        }
        .loopback(&req)
        .is_ok());
        assert_eq!(differing_bytes(&[1, 2, 3], &[1, 2]), 1);
        assert_eq!(
            RailBenchRequest::host("mlx5_0", 1).iterations,
            5000,
            "ib_write_bw's"
        );
    }

    #[test]
    fn the_loopback_latency_is_the_pingpong_and_the_gid_is_the_senders() {
        let req = RailBenchRequest {
            sizes: vec![8, 4096],
            iterations: 1,
            ..RailBenchRequest::host("mlx5_0", 1)
        };
        let r = FakeEngine {
            target: vec![7u8; 1 << 20],
        }
        .loopback(&req)
        .unwrap();
        // The sweep's own 8-byte point says 1.0 us (post to completion); the ping-pong wins.
        assert_eq!(r.points[0].lat_us, 1.0);
        assert_eq!(r.small_msg_latency_us, 0.5);
        let l = r.latency.as_ref().unwrap();
        assert_eq!(
            (l.bytes, l.iterations),
            (2, 1000),
            "ib_write_lat's defaults"
        );
        assert_eq!(r.gid_index, Some(0));
        assert_eq!(r.gid.as_deref(), Some("0".repeat(32).as_str()));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["latency"]["wait"], "last-byte");
        assert_eq!(json["latency"]["typical_us"], 0.5);
        // A result without them (a two-node test, an older prober) reads back.
        let mut old = json.clone();
        for key in ["latency", "gid_index", "gid"] {
            old.as_object_mut().unwrap().remove(key);
        }
        let back: RailBenchResult = serde_json::from_value(old).unwrap();
        assert_eq!((back.latency, back.gid_index), (None, None));
    }

    /// perftest's print_report_lat: intervals between posts are round trips; the 2 slowest
    /// are dropped, the median of the rest halved.
    #[test]
    fn half_round_trips_are_perftests_statistics() {
        // Posts at 0, 10, 14, 17, 27, 29, 129 us: round trips 10, 4, 3, 10, 2, 100.
        let posts = [0.0, 10.0, 14.0, 17.0, 27.0, 29.0, 129.0];
        let s = half_round_trips(&posts).unwrap();
        // Sorted 2, 3, 4, 10, 10, 100; 10 and 100 dropped; 4 kept: median (3 + 4) / 2.
        assert_eq!(s.samples, 4);
        assert_eq!(s.typical_us, 1.75);
        assert_eq!(s.min_us, 1.0);
        assert_eq!(s.max_us, 5.0);
        assert_eq!(s.avg_us, (2.0 + 3.0 + 4.0 + 10.0) / 4.0 / 2.0);
        // Odd count: the middle one. Unsorted input, the tail still the slowest.
        let s = half_round_trips(&[0.0, 6.0, 8.0, 108.0, 111.0, 1111.0]).unwrap();
        // Round trips 6, 2, 100, 3, 1000: kept 2, 3, 6.
        assert_eq!((s.samples, s.typical_us), (3, 1.5));
        // ib_write_lat's 1000 iterations: 999 intervals, 997 kept.
        let posts: Vec<f64> = (0..1000).map(|i| f64::from(i) * 3.0).collect();
        let s = half_round_trips(&posts).unwrap();
        assert_eq!((s.samples, s.typical_us), (997, 1.5));
        // Too few to drop a tail: none is dropped rather than nothing reported.
        assert_eq!(half_round_trips(&[0.0, 4.0]).unwrap().typical_us, 2.0);
        assert_eq!(half_round_trips(&[5.0]), None);
        assert_eq!(half_round_trips(&[]), None);
    }

    #[test]
    fn default_sweep_is_small_message_then_4k_to_8m() {
        let s = default_sizes();
        assert_eq!(s.first(), Some(&8));
        assert_eq!(s[1], 4096);
        assert_eq!(s.last(), Some(&(8 << 20)));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn validate_rejects_bad_requests_with_reason() {
        let ok = RailBenchRequest::host("mlx5_0", 1);
        assert!(ok.validate().is_ok());
        let cases: Vec<(RailBenchRequest, &str)> = vec![
            (
                RailBenchRequest {
                    sizes: vec![],
                    ..ok.clone()
                },
                "no message sizes",
            ),
            (
                RailBenchRequest {
                    sizes: vec![0],
                    ..ok.clone()
                },
                "message size 0",
            ),
            (
                RailBenchRequest {
                    sizes: vec![(1 << 30) + 1],
                    ..ok.clone()
                },
                "out of range",
            ),
            (
                RailBenchRequest {
                    iterations: 0,
                    ..ok.clone()
                },
                "iterations 0",
            ),
            (
                RailBenchRequest {
                    port: 0,
                    ..ok.clone()
                },
                "port 0",
            ),
            (
                RailBenchRequest {
                    hca: " ".into(),
                    ..ok.clone()
                },
                "hca name is empty",
            ),
        ];
        for (req, want) in cases {
            let err = req.validate().expect_err("must be rejected").to_string();
            assert!(err.contains(want), "{err} should mention {want}");
        }
    }

    #[test]
    fn result_summary_is_derived_from_points() {
        let points = vec![
            SizePoint {
                bytes: 4096,
                bw_gbps: 40.0,
                lat_us: 3.0,
            },
            SizePoint {
                bytes: 8,
                bw_gbps: 0.1,
                lat_us: 2.0,
            },
            SizePoint {
                bytes: 1 << 20,
                bw_gbps: 95.0,
                lat_us: 90.0,
            },
        ];
        let r = RailBenchResult::from_points("mlx5_0", 1, MemoryKind::Host, points);
        assert_eq!(r.peak_bw_gbps, 95.0);
        assert_eq!(r.small_msg_latency_us, 2.0);
    }

    #[test]
    fn memory_kind_json_shape() {
        let v = serde_json::to_value(MemoryKind::Gpu { gpu: 3 }).unwrap_or_default();
        assert_eq!(v, serde_json::json!({"kind": "gpu", "gpu": 3}));
        let v = serde_json::to_value(MemoryKind::Host).unwrap_or_default();
        assert_eq!(v, serde_json::json!({"kind": "host"}));
    }

    #[test]
    fn errors_read_cleanly() {
        assert_eq!(RdmaError::NoDevices.to_string(), "no RDMA devices");
        let e = RdmaError::Verbs {
            op: "ibv_reg_mr",
            errno: 12,
        };
        assert!(e.to_string().starts_with("ibv_reg_mr failed: "), "{e}");
        assert!(e.to_string().contains("os error 12"), "{e}");
    }
}
