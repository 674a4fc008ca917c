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
    /// Writes per size for the bandwidth run (the latency run uses up to as many).
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
    /// Average time from posting one signaled write to its completion, microseconds.
    pub lat_us: f64,
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
    /// Latency of the smallest message of the sweep, microseconds.
    pub small_msg_latency_us: f64,
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
            registration: None,
        }
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

/// One side of an RC QP with a registered buffer, before and after connection.
pub trait RdmaEndpoint: Send {
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
    receiver.connect(&sender.info(), req.class)?;
    let r_info = receiver.info();
    sender.connect(&r_info, req.class)?;
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
    let mut result = RailBenchResult::from_points(&req.hca, req.port, req.memory, points);
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
