//! This node's ranks of a two-node NCCL all-reduce, run through NCCL's C API loaded at run
//! time ([`railguard_gpu`]): the body of the hidden `railguard-prober nccl-ranks` child
//! process the campaign endpoint starts for every NCCL pair test.
//!
//! A child process, because NCCL reads `NCCL_IB_HCA` and its other settings once per process:
//! a per-rail test needs a fresh one. One thread per local GPU joins the communicator
//! ([`Nccl::init_rank`]) and runs the timed, checked sweep. The child speaks JSON lines on
//! stdout ([`RanksLine`]): the rank-0 side first prints the unique id its parent sends to
//! the peer over the campaign's authenticated channel, then every child prints its result or
//! its error. NCCL's debug output goes to stderr, which the parent captures and judges.

use std::path::PathBuf;
use std::sync::Arc;

use railguard_api::error::error_chain;
use railguard_gpu::collective::SweepPoint;
use railguard_gpu::{CudaDriver, CudaError, Device, Nccl, NcclError, UniqueId, UNIQUE_ID_BYTES};
use serde::{Deserialize, Serialize};

/// The hidden subcommand of `railguard-prober` that runs a node's ranks (campaign pair tests
/// and the native loopback).
pub const RANKS_SUBCOMMAND: &str = "nccl-ranks";

/// What one `nccl-ranks` child runs.
#[derive(Debug, Clone, PartialEq)]
pub struct RanksSpec {
    pub cuda_library: Option<PathBuf>,
    pub nccl_library: Option<PathBuf>,
    /// The node's GPUs by PCI bus id, in GPU index order (empty: every GPU CUDA sees, in PCI
    /// bus order).
    pub node_gpus: Vec<String>,
    /// Indices into the node's GPUs this test runs one rank on each (empty: all of them).
    pub gpu_indices: Vec<u32>,
    /// `None`: this is the rank-0 side; it makes the unique id, and the communicator has
    /// twice its local ranks (the pair is homogeneous), or only its local ranks with
    /// `single_node`.
    pub join: Option<JoinSpec>,
    /// The node's own loopback: one communicator of this child's ranks alone, whose id is
    /// never printed (nobody else joins).
    pub single_node: bool,
    pub sizes: Vec<usize>,
    pub warmup: u32,
    pub iterations: u32,
}

/// The second side: the id from rank 0 and where its ranks sit in the communicator.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinSpec {
    pub unique_id: UniqueId,
    pub nranks: u32,
    pub first_rank: u32,
}

/// One line of the child's stdout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum RanksLine {
    /// Printed by the rank-0 side before it joins the communicator.
    #[serde(rename_all = "camelCase")]
    UniqueId {
        id: String,
        nranks: u32,
        local_ranks: u32,
    },
    Result(RanksResult),
    Error(RanksFailure),
}

/// The collective as this node's ranks saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RanksResult {
    pub nranks: u32,
    pub first_rank: u32,
    /// PCI bus ids of the GPUs that ran a rank here.
    pub gpus: Vec<String>,
    pub nccl_version: String,
    /// Per size: the slowest local rank's time (the collective ends when its last rank
    /// does), its bandwidths, and the wrong elements of all local ranks.
    pub points: Vec<PairPoint>,
}

/// One message size of the pair's sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PairPoint {
    pub bytes: usize,
    pub time_us: f64,
    /// GB/s.
    #[serde(rename = "algbwGBps")]
    pub algbw_gbps: f64,
    /// GB/s.
    #[serde(rename = "busbwGBps")]
    pub busbw_gbps: f64,
    pub wrong: u64,
}

/// Why the ranks did not run, and what kind of evidence that is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RanksFailure {
    pub kind: FailureKind,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FailureKind {
    /// No CUDA driver, no NCCL, or no GPU to run on: the node cannot take the test at all.
    NotInstalled,
    /// NCCL or CUDA failed while the collective was set up or ran: evidence against the
    /// path.
    Collective,
    /// The request did not fit this node (GPU count, arguments): no evidence.
    Invalid,
}

impl RanksFailure {
    fn new(kind: FailureKind, reason: impl Into<String>) -> Self {
        RanksFailure {
            kind,
            reason: reason.into(),
        }
    }
}

fn cuda_failure(e: &CudaError) -> RanksFailure {
    let kind = match e {
        CudaError::Load { .. } | CudaError::Symbol { .. } | CudaError::NoDevice { .. } => {
            FailureKind::NotInstalled
        }
        // cuInit without devices (CUDA_ERROR_NO_DEVICE) is a CPU-only node too.
        CudaError::Call { code: 100, .. } => FailureKind::NotInstalled,
        CudaError::Call { .. } => FailureKind::Collective,
        CudaError::InvalidArgument { .. } => FailureKind::Invalid,
    };
    RanksFailure::new(kind, error_chain(e))
}

fn nccl_failure(e: &NcclError) -> RanksFailure {
    let kind = match e {
        NcclError::Load { .. } | NcclError::Symbol { .. } => FailureKind::NotInstalled,
        NcclError::Call { .. } => FailureKind::Collective,
        NcclError::Cuda(c) => return cuda_failure(c),
        NcclError::InvalidArgument { .. } => FailureKind::Invalid,
    };
    RanksFailure::new(kind, error_chain(e))
}

/// The unique id as it travels (lowercase hex).
pub fn encode_id(id: &UniqueId) -> String {
    hex::encode(id.0)
}

/// A unique id from its hex form.
pub fn decode_id(text: &str) -> Result<UniqueId, String> {
    let bytes = hex::decode(text.trim()).map_err(|_| "unique id is not hex".to_string())?;
    let arr: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|b: Vec<u8>| {
        format!(
            "unique id is {} bytes, NCCL's is {UNIQUE_ID_BYTES}",
            b.len()
        )
    })?;
    Ok(UniqueId(arr))
}

/// The GPUs this child runs on, by index into the node's GPU list.
fn pick_gpus(cuda: &Arc<CudaDriver>, spec: &RanksSpec) -> Result<Vec<Device>, RanksFailure> {
    let node: Vec<Device> = if spec.node_gpus.is_empty() {
        let mut all = cuda.devices().map_err(|e| cuda_failure(&e))?;
        all.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
        all
    } else {
        spec.node_gpus
            .iter()
            .map(|id| cuda.device_by_pci_bus_id(id))
            .collect::<Result<_, _>>()
            .map_err(|e| cuda_failure(&e))?
    };
    if node.is_empty() {
        return Err(RanksFailure::new(
            FailureKind::NotInstalled,
            "CUDA sees no GPU on this node",
        ));
    }
    if spec.gpu_indices.is_empty() {
        return Ok(node);
    }
    spec.gpu_indices
        .iter()
        .map(|&i| {
            node.get(i as usize).cloned().ok_or_else(|| {
                RanksFailure::new(
                    FailureKind::Invalid,
                    format!("GPU {i} requested, the node has {} GPUs", node.len()),
                )
            })
        })
        .collect()
}

/// Runs this node's ranks. `announce` receives the rank-0 side's id line before the ranks
/// join (the child prints it at once, so its parent can send it to the peer).
pub fn run_ranks(
    spec: &RanksSpec,
    announce: &mut dyn FnMut(&RanksLine),
) -> Result<RanksResult, RanksFailure> {
    if spec.sizes.iter().all(|&s| s < 4) || spec.iterations == 0 {
        return Err(RanksFailure::new(
            FailureKind::Invalid,
            "a sweep needs a size of at least 4 bytes and one iteration",
        ));
    }
    let cuda = CudaDriver::load(spec.cuda_library.as_deref()).map_err(|e| cuda_failure(&e))?;
    let nccl = Nccl::load(spec.nccl_library.as_deref()).map_err(|e| nccl_failure(&e))?;
    let gpus = pick_gpus(&cuda, spec)?;
    let local = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
    let (id, nranks, first_rank) = match &spec.join {
        None if spec.single_node => {
            let id = nccl.unique_id().map_err(|e| nccl_failure(&e))?;
            (id, local, 0)
        }
        None => {
            let id = nccl.unique_id().map_err(|e| nccl_failure(&e))?;
            let nranks = local.saturating_mul(2);
            announce(&RanksLine::UniqueId {
                id: encode_id(&id),
                nranks,
                local_ranks: local,
            });
            (id, nranks, 0)
        }
        Some(j) => {
            if j.first_rank.checked_add(local) != Some(j.nranks) {
                return Err(RanksFailure::new(
                    FailureKind::Invalid,
                    format!(
                        "ranks {}..{} of {} asked of this node, it runs {local} GPUs for the test",
                        j.first_rank, j.nranks, j.nranks
                    ),
                ));
            }
            (j.unique_id, j.nranks, j.first_rank)
        }
    };
    let per_rank: Vec<Result<Vec<SweepPoint>, NcclError>> = std::thread::scope(|s| {
        let handles: Vec<_> = gpus
            .iter()
            .enumerate()
            .map(|(i, device)| {
                let (cuda, nccl) = (&cuda, &nccl);
                let rank = first_rank + i as u32;
                s.spawn(move || {
                    let stream = cuda.stream(device)?;
                    let mut comm = nccl.init_rank(&id, nranks, rank, &stream)?;
                    comm.all_reduce_sweep(
                        cuda,
                        device,
                        &stream,
                        &spec.sizes,
                        spec.warmup,
                        spec.iterations,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(NcclError::InvalidArgument {
                        reason: "a rank thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut sweeps = Vec::with_capacity(per_rank.len());
    for r in per_rank {
        sweeps.push(r.map_err(|e| nccl_failure(&e))?);
    }
    Ok(RanksResult {
        nranks,
        first_rank,
        gpus: gpus.iter().map(|d| d.pci_bus_id.clone()).collect(),
        nccl_version: nccl.version_string(),
        points: combine(&sweeps, nranks),
    })
}

/// The collective per size from each local rank's sweep: the slowest rank's time, the
/// bandwidths of that time, and every rank's wrong elements.
pub fn combine(sweeps: &[Vec<SweepPoint>], nranks: u32) -> Vec<PairPoint> {
    let Some(first) = sweeps.first() else {
        return Vec::new();
    };
    first
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let same: Vec<&SweepPoint> = sweeps.iter().filter_map(|s| s.get(i)).collect();
            let time_us = same.iter().map(|q| q.time_us).fold(0.0, f64::max);
            let wrong = same.iter().map(|q| q.wrong).sum();
            let slowest = SweepPoint::new(p.bytes, time_us / 1e6, nranks, wrong);
            PairPoint {
                bytes: p.bytes,
                time_us: slowest.time_us,
                algbw_gbps: slowest.algbw_gbps,
                busbw_gbps: slowest.busbw_gbps,
                wrong,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn ids_round_trip_and_bad_ones_are_named() {
        let mut raw = [0u8; UNIQUE_ID_BYTES];
        raw[0] = 0xab;
        raw[127] = 7;
        let id = UniqueId(raw);
        assert_eq!(decode_id(&encode_id(&id)).unwrap(), id);
        assert!(decode_id("zz").unwrap_err().contains("not hex"));
        assert!(decode_id("abcd").unwrap_err().contains("2 bytes"));
    }

    #[test]
    fn the_slowest_rank_decides_and_wrong_elements_add_up() {
        let a = vec![SweepPoint::new(1 << 20, 0.001, 4, 0)];
        let b = vec![SweepPoint::new(1 << 20, 0.002, 4, 3)];
        let p = &combine(&[a, b], 4)[0];
        assert_eq!(p.time_us, 2000.0);
        assert_eq!(p.wrong, 3);
        assert!((p.busbw_gbps - p.algbw_gbps * 1.5).abs() < 1e-9, "{p:?}");
        assert!(combine(&[], 2).is_empty());
    }

    #[test]
    fn lines_have_a_stable_json_shape() {
        let line = RanksLine::UniqueId {
            id: "00".into(),
            nranks: 4,
            local_ranks: 2,
        };
        let v = serde_json::to_value(&line).unwrap();
        assert_eq!(v["type"], "uniqueId");
        assert_eq!(v["localRanks"], 2);
        let e = RanksLine::Error(RanksFailure::new(FailureKind::NotInstalled, "x"));
        assert_eq!(serde_json::to_value(&e).unwrap()["kind"], "notInstalled");
    }
}
