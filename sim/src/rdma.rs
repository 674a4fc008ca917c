//! The simulated RDMA engine: rail models as plain data, injected faults, deterministic sweeps.
//!
//! It stands in for [`railguard_prober::rdma::VerbsEngine`] where no HCA exists (simulated nodes,
//! campaign tests). The sweep follows the usual latency/bandwidth model of one message:
//! `lat(s) = lat0 + s / peak` and `bw(s) = s / lat(s)`, so small messages are latency-bound
//! and large ones approach the rail's peak, as on real hardware. Peer tests pair the two
//! nodes' rail models (the slower side and every wire/link fault on the way count).
//!
//! The loopback's latency is the quantity the verbs engine measures, `ib_write_lat`'s half
//! round trip ([`PingPongLatency`]): one way of a small write is `lat0 + s / peak`. Each
//! endpoint runs on the GID the verbs engine would choose, from the rail's GID table as the
//! simulated node's sysfs holds it ([`SimGidTable`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use railguard_prober::discover::gid::{
    nccl_roce_gid_index, parse_sysfs_gid, roce_version_of_type, GidSlot,
};
use railguard_prober::rdma::gpu_memory::{registration_order, GpuBuffer};
use railguard_prober::rdma::{
    half_round_trips, loopback_via_endpoints, GpuMemory, GpuRegistrationReport, MemoryKind,
    PeerRdmaEngine, PingPongLatency, PingPongWait, QpInfo, RailBenchRequest, RailBenchResult,
    RdmaEndpoint, RdmaEngine, RdmaError, RegistrationAttempt, RegistrationPath, SizePoint,
    TrafficClass,
};

/// Status code and text of `IBV_WC_RETRY_EXC_ERR`, what a real HCA reports for a dead wire.
const RETRY_EXCEEDED: (u32, &str) = (12, "transport retry counter exceeded");
/// Extra latency of one switch hop between two nodes, microseconds.
const WIRE_HOP_US: f64 = 0.5;

/// A fault of the rail itself (HCA, memory path): seen by loopback and peer tests alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SimFault {
    /// Bandwidth scaled by `factor` (0 < factor <= 1).
    Degraded { factor: f64 },
    /// Every write ends in an error completion with this status text.
    CompletionError { status: String },
    /// Completions never arrive.
    Timeout,
}

/// A fault on the wire: the cable/switch port behind a rail, or the path to one peer node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimLinkFault {
    /// Bandwidth scale, 1.0 = healthy.
    #[serde(default = "one")]
    pub bw_factor: f64,
    /// No packet gets through (retry counter exceeded).
    #[serde(default)]
    pub dead: bool,
    /// Rails (HCA names) the fault applies to; empty = all rails. Only used for peer links.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hcas: Vec<String>,
}

fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}

/// One simulated rail (`hca:port`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimRailModel {
    /// Peak RDMA WRITE bandwidth from host memory, Gb/s.
    pub bw_host_gbps: f64,
    /// Peak from GPU memory (GPUDirect); `None` = no GPUDirect on this node.
    #[serde(default)]
    pub bw_gpu_gbps: Option<f64>,
    /// One way of a small write on this rail, microseconds: the loopback's `ib_write_lat`
    /// figure (half a round trip) before the message's own serialization time.
    pub latency_us: f64,
    /// Port state ACTIVE.
    #[serde(default = "yes")]
    pub active: bool,
    #[serde(default)]
    pub fault: Option<SimFault>,
    /// A bad cable or switch port behind this rail: affects peer tests only.
    #[serde(default)]
    pub wire: Option<SimLinkFault>,
    /// The port's GID table; `None`: index 0, an all-zero GID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gids: Option<SimGidTable>,
}

/// A rail's GID table as the simulated node's sysfs holds it (`gids/<i>`,
/// `gid_attrs/types/<i>`), for the engine to choose from as the verbs engine does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimGidTable {
    /// An Ethernet (RoCE) port: the GID is the one NCCL chooses. Otherwise InfiniBand.
    pub roce: bool,
    /// Slot `i` at position `i`; `None` for an unused (all-zero) slot.
    pub slots: Vec<Option<SimGidSlot>>,
}

/// One used slot of a GID table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimGidSlot {
    /// As the kernel prints it (`fe80:0000:...`).
    pub gid: String,
    /// `gid_attrs/types/<i>` (`IB/RoCE v1`, `RoCE v2`).
    #[serde(rename = "type")]
    pub gid_type: String,
}

impl SimGidTable {
    /// The index and GID the verbs engine's `choose_gid` takes without an explicit index: on
    /// RoCE NCCL's choice over the table ([`nccl_roce_gid_index`]); on InfiniBand index 0, or
    /// 1 when that GID carries a routable FLID (bytes 4-5, NCCL's
    /// `NCCL_IB_ROUTABLE_FLID_GID_INDEX`).
    pub fn choose(&self) -> (u32, [u8; 16]) {
        let table: Vec<GidSlot> = self
            .slots
            .iter()
            .map(|slot| {
                slot.as_ref()
                    .and_then(|s| {
                        Some(GidSlot {
                            gid: parse_sysfs_gid(&s.gid)?,
                            roce_version: roce_version_of_type(&s.gid_type),
                        })
                    })
                    .unwrap_or(GidSlot::UNUSED)
            })
            .collect();
        let index = if self.roce {
            nccl_roce_gid_index(&table).unwrap_or(0)
        } else if table.get(1).is_some_and(|s| s.gid[4..6] != [0, 0]) {
            1
        } else {
            0
        };
        let gid = table.get(index as usize).map_or([0; 16], |s| s.gid);
        (index, gid)
    }
}

/// The RDMA part of a simulated node model.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimRdmaModel {
    /// The node's name, carried to peers so link faults can be paired.
    pub node: String,
    /// Rails keyed by `hca:port`, e.g. `mlx5_0:1`.
    #[serde(default)]
    pub rails: BTreeMap<String, SimRailModel>,
    /// Faulty paths to peer nodes, keyed by the peer's node name.
    #[serde(default)]
    pub links: BTreeMap<String, SimLinkFault>,
}

/// What a simulated endpoint tells its peer through the side channel (inside [`QpInfo`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimEndpointInfo {
    pub node: String,
    /// Peak bandwidth of this side for the chosen memory, faults of the rail applied.
    pub bw_gbps: f64,
    pub latency_us: f64,
    #[serde(default)]
    pub fault: Option<SimFault>,
    #[serde(default)]
    pub wire: Option<SimLinkFault>,
    /// This side's link faults toward the peer being tested (only the relevant one is sent).
    #[serde(default)]
    pub link: Option<SimLinkFault>,
}

/// The simulated engine. Cheap to clone; holds only the model (and, with
/// [`SimulatedRdmaEngine::with_gpu_memory`], where real GPU buffers come from).
#[derive(Debug, Clone)]
pub struct SimulatedRdmaEngine {
    model: SimRdmaModel,
    gpu_memory: Option<GpuMemory>,
}

impl SimulatedRdmaEngine {
    /// GPU-memory endpoints allocate their buffer through `gpu_memory` (the CUDA driver, or its
    /// test double, loaded by the prober's own code), so a simulated node exercises the
    /// driver path; only the HCA's registration is simulated: it accepts the first path of
    /// the profile's order that the GPU supports (DMA-BUF needs the GPU's DMA-BUF support).
    pub fn with_gpu_memory(mut self, gpu_memory: GpuMemory) -> Self {
        self.gpu_memory = Some(gpu_memory);
        self
    }

    /// Validates the model: rail keys are `hca:port`, rates and latencies positive and finite.
    pub fn new(model: SimRdmaModel) -> Result<Self, RdmaError> {
        let invalid = |reason: String| Err(RdmaError::InvalidRequest { reason });
        for (key, rail) in &model.rails {
            if parse_rail_key(key).is_none() {
                return invalid(format!("simulated rail key {key:?} is not HCA:PORT"));
            }
            let positive = |v: f64| v.is_finite() && v > 0.0;
            if !positive(rail.bw_host_gbps) || !positive(rail.latency_us) {
                return invalid(format!(
                    "simulated rail {key}: bandwidth and latency must be positive"
                ));
            }
            if rail.bw_gpu_gbps.is_some_and(|v| !positive(v)) {
                return invalid(format!(
                    "simulated rail {key}: GPU bandwidth must be positive"
                ));
            }
            if let Some(SimFault::Degraded { factor }) = &rail.fault {
                if !(positive(*factor) && *factor <= 1.0) {
                    return invalid(format!(
                        "simulated rail {key}: degraded factor must be in (0, 1]"
                    ));
                }
            }
        }
        let factors = model
            .links
            .values()
            .chain(model.rails.values().filter_map(|r| r.wire.as_ref()));
        for link in factors {
            if !(link.bw_factor.is_finite() && link.bw_factor > 0.0 && link.bw_factor <= 1.0) {
                return invalid("simulated link bwFactor must be in (0, 1]".into());
            }
        }
        Ok(SimulatedRdmaEngine {
            model,
            gpu_memory: None,
        })
    }

    pub fn model(&self) -> &SimRdmaModel {
        &self.model
    }

    fn rail(&self, hca: &str, port: u32) -> Result<&SimRailModel, RdmaError> {
        let devices = self.devices()?;
        if !devices.iter().any(|d| d == hca) {
            return Err(RdmaError::DeviceNotFound {
                hca: hca.to_string(),
                available: devices,
            });
        }
        let rail = self
            .model
            .rails
            .get(&format!("{hca}:{port}"))
            .ok_or_else(|| RdmaError::PortNotActive {
                hca: hca.to_string(),
                port,
                state: "absent".into(),
            })?;
        if !rail.active {
            return Err(RdmaError::PortNotActive {
                hca: hca.to_string(),
                port,
                state: "DOWN".into(),
            });
        }
        Ok(rail)
    }
}

fn parse_rail_key(key: &str) -> Option<(&str, u32)> {
    let (hca, port) = key.rsplit_once(':')?;
    let port: u32 = port.parse().ok()?;
    (!hca.is_empty() && port > 0).then_some((hca, port))
}

impl RdmaEngine for SimulatedRdmaEngine {
    fn loopback(&self, req: &RailBenchRequest) -> Result<RailBenchResult, RdmaError> {
        loopback_via_endpoints(self, req)
    }

    fn devices(&self) -> Result<Vec<String>, RdmaError> {
        let mut names: Vec<String> = self
            .model
            .rails
            .keys()
            .filter_map(|k| parse_rail_key(k).map(|(h, _)| h.to_string()))
            .collect();
        names.dedup();
        if names.is_empty() {
            return Err(RdmaError::NoDevices);
        }
        Ok(names)
    }
}

impl PeerRdmaEngine for SimulatedRdmaEngine {
    fn open_endpoint(
        &self,
        hca: &str,
        port: u32,
        memory: MemoryKind,
        buffer_bytes: usize,
    ) -> Result<Box<dyn RdmaEndpoint>, RdmaError> {
        let rail = self.rail(hca, port)?;
        let peak = match memory {
            MemoryKind::Host => rail.bw_host_gbps,
            MemoryKind::Gpu { gpu } => {
                rail.bw_gpu_gbps
                    .ok_or_else(|| RdmaError::GpuMemoryUnavailable {
                        gpu,
                        reason: "simulated node has no GPUDirect RDMA".into(),
                    })?
            }
        };
        let peak = match &rail.fault {
            Some(SimFault::Degraded { factor }) => peak * factor,
            _ => peak,
        };
        let gpu = match (memory, &self.gpu_memory) {
            (MemoryKind::Gpu { gpu }, Some(source)) => {
                Some(simulated_registration(source, gpu, buffer_bytes.max(64))?)
            }
            _ => None,
        };
        let (gid_index, gid) = rail.gids.as_ref().map_or((0, [0; 16]), SimGidTable::choose);
        Ok(Box::new(SimEndpoint {
            gpu,
            memory,
            gid_index,
            gid,
            node: self.model.node.clone(),
            links: self.model.links.clone(),
            hca: hca.to_string(),
            port,
            buffer_bytes,
            info: SimEndpointInfo {
                node: self.model.node.clone(),
                bw_gbps: peak,
                latency_us: rail.latency_us,
                fault: rail.fault.clone(),
                wire: rail.wire.clone(),
                link: None,
            },
            connected: None,
        }))
    }
}

struct SimEndpoint {
    /// A real GPU buffer and its (simulated) registration, for GPU memory.
    gpu: Option<(GpuBuffer, GpuRegistrationReport)>,
    memory: MemoryKind,
    gid_index: u32,
    gid: [u8; 16],
    node: String,
    links: BTreeMap<String, SimLinkFault>,
    hca: String,
    port: u32,
    buffer_bytes: usize,
    info: SimEndpointInfo,
    connected: Option<QpInfo>,
}

impl SimEndpoint {
    fn link_toward(&self, peer_node: &str) -> Option<SimLinkFault> {
        self.links
            .get(peer_node)
            .filter(|l| l.hcas.is_empty() || l.hcas.iter().any(|h| h == &self.hca))
            .cloned()
    }
}

impl SimEndpoint {
    /// Peak bandwidth and one-way small-message latency toward `peer` (whose rail is
    /// `remote_hca`), or the error a fault on the way ends every write in.
    fn path_to(&self, peer: &SimEndpointInfo, remote_hca: &str) -> Result<(f64, f64), RdmaError> {
        for fault in [&self.info.fault, &peer.fault].into_iter().flatten() {
            match fault {
                SimFault::CompletionError { status } => {
                    return Err(RdmaError::WorkCompletion {
                        hca: self.hca.clone(),
                        op: "RDMA WRITE",
                        status: status.clone(),
                        status_code: 0,
                    })
                }
                SimFault::Timeout => {
                    return Err(RdmaError::Timeout {
                        op: format!("RDMA WRITE completion on {}", self.hca),
                        after_ms: 10_000,
                    })
                }
                SimFault::Degraded { .. } => {}
            }
        }
        let same_rail = peer.node == self.node && remote_hca == self.hca;
        let (mut peak, mut lat0) = if same_rail {
            (self.info.bw_gbps, self.info.latency_us)
        } else {
            (
                self.info.bw_gbps.min(peer.bw_gbps),
                (self.info.latency_us + peer.latency_us) / 2.0 + WIRE_HOP_US,
            )
        };
        if !same_rail {
            let local_link = self.link_toward(&peer.node);
            let wires = [&self.info.wire, &peer.wire, &local_link, &peer.link];
            for wire in wires.into_iter().flatten() {
                if wire.dead {
                    return Err(RdmaError::WorkCompletion {
                        hca: self.hca.clone(),
                        op: "RDMA WRITE",
                        status: RETRY_EXCEEDED.1.into(),
                        status_code: RETRY_EXCEEDED.0,
                    });
                }
                peak *= wire.bw_factor;
                // A bad cable retransmits: latency suffers along with bandwidth.
                lat0 /= wire.bw_factor.max(0.01).sqrt();
            }
        }
        Ok((peak, lat0))
    }
}

/// The simulated side of an endpoint's info, when it has one.
fn sim_info(info: &QpInfo) -> Option<SimEndpointInfo> {
    serde_json::from_value(info.sim.clone()?).ok()
}

/// A real allocation on GPU `gpu`, registered by the simulated HCA.
fn simulated_registration(
    source: &GpuMemory,
    gpu: u32,
    len: usize,
) -> Result<(GpuBuffer, GpuRegistrationReport), RdmaError> {
    let buffer = source.alloc(gpu, len)?;
    let mut failed = Vec::new();
    for &path in registration_order(source.registration) {
        if path == RegistrationPath::DmaBuf && !buffer.device.dma_buf_supported {
            failed.push(RegistrationAttempt {
                path,
                error: format!(
                    "GPU {} does not support DMA-BUF export",
                    buffer.device.pci_bus_id
                ),
            });
            continue;
        }
        let report = GpuRegistrationReport {
            gpu,
            pci_bus_id: buffer.device.pci_bus_id.clone(),
            path,
            failed,
        };
        return Ok((buffer, report));
    }
    Err(RdmaError::GpuMemoryUnavailable {
        gpu,
        reason: railguard_prober::rdma::gpu_memory::no_path_reason(source.registration, &failed),
    })
}

impl RdmaEndpoint for SimEndpoint {
    fn registration(&self) -> Option<GpuRegistrationReport> {
        self.gpu.as_ref().map(|(_, report)| report.clone())
    }

    fn info(&self) -> QpInfo {
        // Stable fake addressing: enough for the side channel to carry and check.
        QpInfo {
            hca: self.hca.clone(),
            port: self.port,
            qpn: 0x100 + self.port,
            psn: 0,
            lid: 0,
            gid: self.gid.iter().map(|b| format!("{b:02x}")).collect(),
            gid_index: self.gid_index,
            rkey: 0x5151,
            addr: 0x1000_0000,
            len: self.buffer_bytes as u64,
            mtu: 5,
            // Plain data with finite numbers: encoding cannot fail.
            sim: serde_json::to_value(&self.info).ok(),
        }
    }

    fn pingpong(
        &mut self,
        partner: &mut dyn RdmaEndpoint,
        bytes: usize,
        iterations: u32,
    ) -> Result<PingPongLatency, RdmaError> {
        let partner: &mut dyn std::any::Any = partner;
        let Some(partner) = partner.downcast_mut::<SimEndpoint>() else {
            return Err(RdmaError::InvalidRequest {
                reason: "a simulated endpoint can only ping-pong with another simulated one".into(),
            });
        };
        if self.connected.is_none() || partner.connected.is_none() {
            return Err(RdmaError::InvalidRequest {
                reason: "ping-pong before connect".into(),
            });
        }
        let (peak, lat0) = self.path_to(&partner.info, &partner.hca)?;
        // Every round trip alike: one way each direction, as the one-message model has it.
        let half = lat0 + bytes as f64 * 8.0 / (peak * 1e3);
        let posted: Vec<f64> = (0..iterations).map(|k| f64::from(k) * 2.0 * half).collect();
        let stats = half_round_trips(&posted).ok_or_else(|| RdmaError::InvalidRequest {
            reason: format!("a ping-pong needs at least 2 round trips, not {iterations}"),
        })?;
        // The verbs engine's choices: inline and polling a byte in host memory, an
        // immediate with GPU memory.
        let host = self.memory == MemoryKind::Host && partner.memory == MemoryKind::Host;
        Ok(PingPongLatency {
            bytes,
            iterations,
            samples: stats.samples,
            typical_us: stats.typical_us,
            min_us: stats.min_us,
            avg_us: stats.avg_us,
            max_us: stats.max_us,
            inline: host,
            wait: if host {
                PingPongWait::LastByte
            } else {
                PingPongWait::Immediate
            },
            delivered: 2 * iterations,
        })
    }

    fn connect(&mut self, remote: &QpInfo, _class: TrafficClass) -> Result<(), RdmaError> {
        let Some(peer) = sim_info(remote) else {
            return Err(RdmaError::InvalidRequest {
                reason: "a simulated endpoint can only connect to a simulated peer".into(),
            });
        };
        // Our fault toward that peer travels to it in our info (the responder connects first
        // and answers with its info, so the initiator sees both sides' link faults).
        self.info.link = self.link_toward(&peer.node);
        self.connected = Some(remote.clone());
        Ok(())
    }

    fn write_sweep(
        &mut self,
        remote: &QpInfo,
        sizes: &[usize],
        _iterations: u32,
    ) -> Result<Vec<SizePoint>, RdmaError> {
        let Some(connected) = &self.connected else {
            return Err(RdmaError::InvalidRequest {
                reason: "write_sweep before connect".into(),
            });
        };
        let peer = sim_info(remote)
            .or_else(|| sim_info(connected))
            .ok_or_else(|| RdmaError::InvalidRequest {
                reason: "remote endpoint is not simulated".into(),
            })?;
        if let Some(max) = sizes.iter().max() {
            if *max as u64 > remote.len {
                return Err(RdmaError::InvalidRequest {
                    reason: format!(
                        "message of {max} bytes exceeds the remote buffer of {} bytes",
                        remote.len
                    ),
                });
            }
        }
        let (peak, lat0) = self.path_to(&peer, &remote.hca)?;
        Ok(model_sweep(peak, lat0, sizes))
    }
}

/// Points of the one-message model for a rail with `peak_gbps` and `lat0_us`.
pub fn model_sweep(peak_gbps: f64, lat0_us: f64, sizes: &[usize]) -> Vec<SizePoint> {
    sizes
        .iter()
        .map(|&bytes| {
            let bits = bytes as f64 * 8.0;
            // Gb/s = 1e3 bits per microsecond.
            let lat_us = lat0_us + bits / (peak_gbps * 1e3);
            SizePoint {
                bytes,
                bw_gbps: bits / (lat_us * 1e3),
                lat_us,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use railguard_prober::rdma::default_sizes;

    fn rail(bw: f64) -> SimRailModel {
        SimRailModel {
            bw_host_gbps: bw,
            bw_gpu_gbps: Some(bw * 0.9),
            latency_us: 2.0,
            active: true,
            fault: None,
            wire: None,
            gids: None,
        }
    }

    fn engine(node: &str, rails: &[(&str, SimRailModel)]) -> SimulatedRdmaEngine {
        SimulatedRdmaEngine::new(SimRdmaModel {
            node: node.into(),
            rails: rails
                .iter()
                .map(|(k, r)| (k.to_string(), r.clone()))
                .collect(),
            links: BTreeMap::new(),
        })
        .unwrap()
    }

    /// Runs initiator -> responder without the side channel (that is tested in peer.rs).
    fn pair(
        a: &SimulatedRdmaEngine,
        b: &SimulatedRdmaEngine,
        hca: &str,
    ) -> Result<Vec<SizePoint>, RdmaError> {
        let sizes = default_sizes();
        let buf = *sizes.iter().max().unwrap();
        let mut ea = a.open_endpoint(hca, 1, MemoryKind::Host, buf)?;
        let mut eb = b.open_endpoint(hca, 1, MemoryKind::Host, buf)?;
        let ia = ea.info();
        eb.connect(&ia, TrafficClass::default())?;
        let ib = eb.info();
        ea.connect(&ib, TrafficClass::default())?;
        ea.write_sweep(&ib, &sizes, 10)
    }

    #[test]
    fn loopback_sweep_is_consistent_and_approaches_peak() {
        let e = engine("n1", &[("mlx5_0:1", rail(100.0))]);
        let r = e.loopback(&RailBenchRequest::host("mlx5_0", 1)).unwrap();
        assert_eq!(r.points.len(), default_sizes().len());
        // Bandwidth grows, latency grows with size; peak below but near the model's rate.
        assert!(r
            .points
            .windows(2)
            .all(|w| w[0].bw_gbps < w[1].bw_gbps && w[0].lat_us < w[1].lat_us));
        assert!(
            r.peak_bw_gbps > 99.0 && r.peak_bw_gbps < 100.0,
            "{}",
            r.peak_bw_gbps
        );
        assert!((r.small_msg_latency_us - 2.0).abs() < 0.01);
        // ib_write_lat's figure from the model: one way of a 2-byte write, 1000 round trips,
        // 997 kept; the sweep's own smallest point is another quantity.
        let l = r.latency.as_ref().unwrap();
        let half = 2.0 + 16.0 / 100e3;
        for v in [l.typical_us, l.min_us, l.avg_us, l.max_us] {
            assert!((v - half).abs() < 1e-9, "{l:?}");
        }
        assert_eq!(r.small_msg_latency_us, l.typical_us);
        assert_eq!((l.bytes, l.iterations, l.samples), (2, 1000, 997));
        assert_eq!(
            (l.inline, l.wait, l.delivered),
            (true, PingPongWait::LastByte, 2000)
        );
        // No GID table in this model: index 0, as before one was modelled.
        assert_eq!(
            (r.gid_index, r.gid.as_deref()),
            (Some(0), Some("0".repeat(32).as_str()))
        );
        for p in &r.points {
            // bw * lat = bytes: the point is one consistent message, not two unrelated numbers.
            assert!(
                (p.bw_gbps * 1e3 * p.lat_us - p.bytes as f64 * 8.0).abs()
                    < 1e-6 * p.bytes as f64 + 1e-6
            );
        }
    }

    #[test]
    fn gpu_memory_uses_gpu_rate_or_fails_cleanly() {
        let mut no_gdr = rail(100.0);
        no_gdr.bw_gpu_gbps = None;
        let e = engine("n1", &[("mlx5_0:1", rail(100.0)), ("mlx5_1:1", no_gdr)]);
        let mut req = RailBenchRequest::host("mlx5_0", 1);
        req.memory = MemoryKind::Gpu { gpu: 0 };
        let r = e.loopback(&req).unwrap();
        assert!(r.peak_bw_gbps < 90.0 && r.peak_bw_gbps > 89.0);
        // Device memory: perftest's write-with-immediate ping-pong, never inline.
        let l = r.latency.as_ref().unwrap();
        assert_eq!((l.inline, l.wait), (false, PingPongWait::Immediate));
        assert_eq!(r.memory, MemoryKind::Gpu { gpu: 0 });
        req.hca = "mlx5_1".into();
        let err = e.loopback(&req).unwrap_err();
        assert!(
            matches!(err, RdmaError::GpuMemoryUnavailable { gpu: 0, .. }),
            "{err}"
        );
    }

    #[test]
    fn rail_faults_surface_as_their_errors() {
        let mut down = rail(100.0);
        down.active = false;
        let mut degraded = rail(100.0);
        degraded.fault = Some(SimFault::Degraded { factor: 0.5 });
        let mut broken = rail(100.0);
        broken.fault = Some(SimFault::CompletionError {
            status: "local protection error".into(),
        });
        let mut hung = rail(100.0);
        hung.fault = Some(SimFault::Timeout);
        let e = engine(
            "n1",
            &[
                ("a:1", down),
                ("b:1", degraded),
                ("c:1", broken),
                ("d:1", hung),
            ],
        );
        let run = |hca: &str| e.loopback(&RailBenchRequest::host(hca, 1));
        assert!(
            matches!(run("a"), Err(RdmaError::PortNotActive { ref state, .. }) if state == "DOWN")
        );
        let peak = run("b").unwrap().peak_bw_gbps;
        assert!(peak < 50.0 && peak > 49.0, "{peak}");
        assert!(
            matches!(run("c"), Err(RdmaError::WorkCompletion { ref status, .. }) if status == "local protection error")
        );
        assert!(matches!(run("d"), Err(RdmaError::Timeout { .. })));
        assert!(
            matches!(run("zz"), Err(RdmaError::DeviceNotFound { ref available, .. }) if available.len() == 4)
        );
        assert!(
            matches!(e.loopback(&RailBenchRequest::host("a", 2)), Err(RdmaError::PortNotActive { ref state, .. }) if state == "absent")
        );
    }

    #[test]
    fn no_rails_means_no_devices() {
        let e = engine("n1", &[]);
        assert!(matches!(e.devices(), Err(RdmaError::NoDevices)));
        assert!(matches!(
            e.loopback(&RailBenchRequest::host("mlx5_0", 1)),
            Err(RdmaError::NoDevices)
        ));
    }

    #[test]
    fn model_validation_rejects_bad_data() {
        let bad_key = SimRdmaModel {
            node: "n".into(),
            rails: [("mlx5_0".to_string(), rail(1.0))].into(),
            links: BTreeMap::new(),
        };
        assert!(SimulatedRdmaEngine::new(bad_key)
            .unwrap_err()
            .to_string()
            .contains("HCA:PORT"));
        let bad_bw = SimRdmaModel {
            node: "n".into(),
            rails: [("m:1".to_string(), rail(-1.0))].into(),
            links: BTreeMap::new(),
        };
        assert!(SimulatedRdmaEngine::new(bad_bw).is_err());
        let bad_link = SimRdmaModel {
            node: "n".into(),
            rails: BTreeMap::new(),
            links: [(
                "m".to_string(),
                SimLinkFault {
                    bw_factor: 2.0,
                    dead: false,
                    hcas: vec![],
                },
            )]
            .into(),
        };
        assert!(SimulatedRdmaEngine::new(bad_link).is_err());
    }

    #[test]
    fn model_parses_from_json() {
        let json = r#"{"node":"gpu-1","rails":{"mlx5_0:1":{"bwHostGbps":200,"latencyUs":1.8,
            "fault":{"kind":"degraded","factor":0.25}}},"links":{"gpu-2":{"dead":true}}}"#;
        let model: SimRdmaModel = serde_json::from_str(json).unwrap();
        assert!(model.rails["mlx5_0:1"].active);
        assert_eq!(model.links["gpu-2"].bw_factor, 1.0);
        SimulatedRdmaEngine::new(model).unwrap();
    }

    #[test]
    fn peer_pairs_the_slower_side_and_adds_a_hop() {
        let a = engine("a", &[("mlx5_0:1", rail(200.0))]);
        let b = engine("b", &[("mlx5_0:1", rail(100.0))]);
        let points = pair(&a, &b, "mlx5_0").unwrap();
        let last = points.last().unwrap();
        assert!(last.bw_gbps < 100.0 && last.bw_gbps > 99.0);
        assert!(
            (points[0].lat_us - 2.5).abs() < 0.01,
            "{}",
            points[0].lat_us
        );
    }

    #[test]
    fn wire_and_link_faults_only_hit_peer_tests() {
        let mut bad_wire = rail(100.0);
        bad_wire.wire = Some(SimLinkFault {
            bw_factor: 0.3,
            dead: false,
            hcas: vec![],
        });
        let a = engine("a", &[("mlx5_0:1", bad_wire)]);
        let b = engine("b", &[("mlx5_0:1", rail(100.0))]);
        assert!(
            a.loopback(&RailBenchRequest::host("mlx5_0", 1))
                .unwrap()
                .peak_bw_gbps
                > 99.0
        );
        let peak = pair(&b, &a, "mlx5_0").unwrap().last().unwrap().bw_gbps;
        assert!(peak < 31.0, "{peak}");

        // A dead link from c toward d, on mlx5_1 only, seen from either initiator.
        let mut model = SimRdmaModel {
            node: "c".into(),
            rails: [
                ("mlx5_0:1".to_string(), rail(100.0)),
                ("mlx5_1:1".to_string(), rail(100.0)),
            ]
            .into(),
            links: BTreeMap::new(),
        };
        model.links.insert(
            "d".into(),
            SimLinkFault {
                bw_factor: 1.0,
                dead: true,
                hcas: vec!["mlx5_1".into()],
            },
        );
        let c = SimulatedRdmaEngine::new(model).unwrap();
        let d = engine("d", &[("mlx5_0:1", rail(100.0)), ("mlx5_1:1", rail(100.0))]);
        let e = engine("e", &[("mlx5_1:1", rail(100.0))]);
        assert!(pair(&c, &d, "mlx5_0").is_ok());
        for result in [pair(&c, &d, "mlx5_1"), pair(&d, &c, "mlx5_1")] {
            assert!(matches!(
                result,
                Err(RdmaError::WorkCompletion {
                    status_code: 12,
                    ..
                })
            ));
        }
        assert!(pair(&c, &e, "mlx5_1").is_ok());
    }
}
