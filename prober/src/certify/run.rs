//! The shell that gathers certification evidence on a node: sysfs port readings before and
//! after the invasive window, native RDMA per rail through an [`RdmaEngine`], the NCCL runs
//! (main and the profile's controls) as child processes, and the software baseline. Every
//! decision is left to [`super::policy`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use railguard_api::error::error_chain;
use railguard_api::profile::NcclRunner;
use railguard_api::{FabricProfileSpec, GpuAffinity};

use super::evidence::{
    Evidence, FarGpuBench, NcclRunEvidence, PortReading, RailBench, ResourceExposure, LOOPBACK_ENV,
    RUN_GDR_OFF, RUN_MAIN, RUN_NVLINK, RUN_SOCKET,
};
use crate::discover::{self, DiscoverError, Discovery};
use crate::nccl::native::{NativeNccl, NativeRunSpec};
use crate::nccl::ranks::RANKS_SUBCOMMAND;
use crate::nccl::{run_nccl_test, NcclRunSpec};
use crate::progress::{NoProgress, Progress};
use crate::rdma::{MemoryKind, RailBenchRequest, RdmaEngine, RdmaError};

/// Why evidence could not be gathered at all (individual measurements that fail become
/// evidence, not errors).
#[derive(Debug, thiserror::Error)]
pub enum GatherError {
    #[error("cannot read the node's sysfs")]
    Discover {
        #[source]
        source: DiscoverError,
    },
}

/// Where and how to gather evidence on this node.
#[derive(Clone)]
pub struct NodeSetup {
    pub sysfs_root: PathBuf,
    pub use_nvml: bool,
    pub engine: Arc<dyn RdmaEngine>,
    /// nccl-tests `all_reduce_perf` (the profile's, or the simulated stand-in).
    pub nccl_binary: PathBuf,
    /// Environment for every NCCL run (e.g. `RAILGUARD_SIM_ROOT` for the stand-in).
    pub nccl_env: Vec<(String, String)>,
    /// How the native runner (`certification.ncclRunner: Native`) starts its ranks.
    pub native_nccl: NativeNccl,
    pub log_dir: PathBuf,
    pub nccl_timeout: Duration,
    /// Software versions discovery does not read (CUDA, OFED).
    pub software: Arc<dyn SoftwareSource>,
    /// The engine and NCCL binary are simulations: certificates say `simulated: true`.
    pub simulated: bool,
}

/// Software versions the sysfs readers do not cover: the CUDA version the driver supports and
/// the OFED release. A real node reads them from NVML and the loaded modules
/// ([`HostSoftware`]); a simulated node from its model.
pub trait SoftwareSource: Send + Sync {
    /// Certificate keys (`cuda`, `ofed`) to their versions; missing ones are left out.
    fn versions(&self) -> BTreeMap<String, String>;
}

/// A real node's software source: `ofed` from `sys/module/mlx5_core/version` under the sysfs
/// root, `cuda` from NVML (only when NVML describes this machine, see [`NodeSetup::use_nvml`]).
#[derive(Clone, Debug)]
pub struct HostSoftware {
    pub sysfs_root: PathBuf,
    pub use_nvml: bool,
}

impl SoftwareSource for HostSoftware {
    fn versions(&self) -> BTreeMap<String, String> {
        let mut s = BTreeMap::new();
        if let Ok(v) = std::fs::read_to_string(self.sysfs_root.join("sys/module/mlx5_core/version"))
        {
            s.insert("ofed".into(), v.trim().to_string());
        }
        if self.use_nvml {
            if let Some(v) = discover::nvml_cuda_version() {
                s.insert("cuda".into(), v);
            }
        }
        s
    }
}

/// Evidence plus what the certificate records besides the verdict.
#[derive(Clone, Debug)]
pub struct Gathered {
    pub evidence: Evidence,
    pub gpus: Vec<GpuAffinity>,
}

/// Port readings of every HCA port discovery found.
pub fn port_readings(d: &Discovery) -> Vec<PortReading> {
    let mut out = Vec::new();
    for h in &d.hcas {
        for p in &h.ports {
            let mut counters = p.counters.clone();
            counters.extend(p.hw_counters.iter().map(|(k, v)| (k.clone(), *v)));
            out.push(PortReading {
                hca: h.name.clone(),
                port: p.port,
                state: p.state.as_str().to_string(),
                phys_state: p.phys_state.clone(),
                link_layer: p.link_layer,
                rate_gbps: p.rate_gbps,
                counters,
                pci_address: h.pci_bus_id.clone(),
                sriov_vfs: h.sriov_vfs.clone(),
            });
        }
    }
    out
}

/// The certificate's GPU affinity from discovery.
pub fn gpu_affinity(d: &Discovery) -> Vec<GpuAffinity> {
    d.affinity
        .gpus
        .iter()
        .filter_map(|g| {
            let nic = g.preferred.as_ref()?;
            Some(GpuAffinity {
                gpu: g.index,
                pci_bus_id: g.pci_bus_id.clone(),
                preferred_hca: nic.hca.clone(),
                port: nic.port,
                path: nic.path,
                numa: g.numa,
            })
        })
        .collect()
}

/// Driver, CUDA, kernel, HCA firmware and OFED versions: discovery's facts, then what
/// `source` adds.
pub fn software_baseline(
    d: &Discovery,
    profile: &FabricProfileSpec,
    source: &dyn SoftwareSource,
) -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    if let Some(v) = &d.platform.nvidia_driver {
        s.insert("driver".into(), v.trim().to_string());
    }
    if let Some(v) = &d.platform.kernel {
        s.insert("kernel".into(), v.trim().to_string());
    }
    let mut fw: Vec<String> = d
        .hcas
        .iter()
        .filter(|h| profile.rails.iter().any(|r| r.hca == h.name))
        .filter_map(|h| h.fw_ver.clone())
        .collect();
    fw.sort();
    fw.dedup();
    if !fw.is_empty() {
        s.insert("fw_ver".into(), fw.join(","));
    }
    for (k, v) in source.versions() {
        s.entry(k).or_insert(v);
    }
    s
}

/// Reads the node's sysfs.
pub fn discover_node(setup: &NodeSetup) -> Result<Discovery, GatherError> {
    discover::discover(&setup.sysfs_root, setup.use_nvml)
        .map_err(|source| GatherError::Discover { source })
}

/// The GPUs a rail's GPU-memory tests use: its own first GPU, and for the runbook's affinity
/// comparison a GPU on another NUMA node (only when both NUMA nodes are known: an unknown
/// one is never taken for "far").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RailGpus {
    pub near: u32,
    pub far: Option<u32>,
}

/// Picks [`RailGpus`] for a rail served by `rail_gpus` (profile order) among the node's GPUs.
pub fn rail_gpus(rail_gpus: &[u32], gpus: &[discover::Gpu]) -> Option<RailGpus> {
    let near = *rail_gpus.first()?;
    let numa_of = |i: u32| gpus.iter().find(|g| g.index == i).and_then(|g| g.numa);
    let far = numa_of(near).and_then(|home| {
        gpus.iter()
            .filter(|g| g.numa.is_some_and(|n| n != home))
            .map(|g| g.index)
            .min()
    });
    Some(RailGpus { near, far })
}

/// Sets its flag when dropped: the future holding it was dropped.
struct AbandonOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Native RDMA per profile rail: host memory, then GPU memory of the rail's own GPU (the
/// GPU↔HCA path) and of a GPU on the other socket, then nothing else. Runs on a blocking
/// thread: verbs calls block. Each rail is one step of `progress`.
pub async fn bench_rails(
    engine: Arc<dyn RdmaEngine>,
    profile: &FabricProfileSpec,
    gpus: &[discover::Gpu],
    progress: Arc<dyn Progress>,
) -> Vec<RailBench> {
    let class = crate::rdma::TrafficClass::of_profile(profile);
    let rails: Vec<(String, u32, Option<RailGpus>)> = profile
        .rails
        .iter()
        .map(|r| (r.hca.clone(), r.port, rail_gpus(&r.gpus, gpus)))
        .collect();
    let total = rails.len();
    // An abandoned run (a GPU pod arrived, shutdown) drops this future, but not the blocking
    // thread: the guard tells it to stop after the rail under way.
    let abandoned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _guard = AbandonOnDrop(abandoned.clone());
    let joined = tokio::task::spawn_blocking(move || {
        rails
            .into_iter()
            .enumerate()
            .take_while(|_| !abandoned.load(std::sync::atomic::Ordering::SeqCst))
            .map(|(i, (hca, port, gpu))| {
                let label = format!("RDMA {}/{total} {hca}:{port}", i + 1);
                let bench = bench_rail(
                    engine.as_ref(),
                    RailBenchRequest {
                        class,
                        ..RailBenchRequest::host(&hca, port)
                    },
                    gpu,
                    &label,
                    progress.as_ref(),
                );
                progress.step_done();
                bench
            })
            .collect::<Vec<_>>()
    })
    .await;
    match joined {
        Ok(v) => v,
        Err(e) => profile
            .rails
            .iter()
            .map(|r| RailBench {
                hca: r.hca.clone(),
                port: r.port,
                error: Some(format!("benchmark thread failed: {e}")),
                ..RailBench::default()
            })
            .collect(),
    }
}

/// One rail's loopback benchmarks; `host` is its host-memory request (rail, sweep, class).
fn bench_rail(
    engine: &dyn RdmaEngine,
    host: RailBenchRequest,
    gpu: Option<RailGpus>,
    label: &str,
    progress: &dyn Progress,
) -> RailBench {
    let mut out = RailBench {
        hca: host.hca.clone(),
        port: host.port,
        ..RailBench::default()
    };
    progress.step(&format!("{label} host memory"));
    match engine.loopback(&host) {
        Ok(r) => {
            out.write_bw_host_gbps = Some(r.peak_bw_gbps);
            out.latency_us = Some(r.small_msg_latency_us);
            out.gid_index = r.gid_index;
        }
        Err(e) => {
            out.error = Some(e.to_string());
            return out;
        }
    }
    let Some(RailGpus { near, far }) = gpu else {
        return out;
    };
    progress.step(&format!("{label} GPU {near} memory"));
    let gpu_request = |gpu: u32| RailBenchRequest {
        memory: MemoryKind::Gpu { gpu },
        ..host.clone()
    };
    match engine.loopback(&gpu_request(near)) {
        Ok(r) => {
            out.write_bw_gpu_gbps = Some(r.peak_bw_gbps);
            out.latency_gpu_us = Some(r.small_msg_latency_us);
            out.gpu_registration = r.registration;
        }
        // Not measurable here: recorded; the profile's writeBwGpuGbps decides.
        Err(RdmaError::GpuMemoryUnavailable { reason, .. }) => {
            out.gpu_unavailable = Some(reason);
            return out;
        }
        Err(e) => {
            out.error = Some(format!("GPU memory (gpu {near}): {e}"));
            return out;
        }
    }
    if let Some(far) = far {
        progress.step(&format!("{label} GPU {far} memory (other socket)"));
        out.far_gpu = Some(match engine.loopback(&gpu_request(far)) {
            Ok(r) => FarGpuBench {
                gpu: far,
                write_bw_gbps: Some(r.peak_bw_gbps),
                error: None,
            },
            Err(e) => FarGpuBench {
                gpu: far,
                write_bw_gbps: None,
                error: Some(e.to_string()),
            },
        });
    }
    out
}

/// The NCCL runs the profile asks for, with their distinguishing environment: the loopback
/// (main), then the optional GDR-off control and socket comparison (both loopbacks too), then
/// the optional NVLink run.
pub fn nccl_plan(
    spec: &railguard_api::profile::NcclTestsSpec,
) -> Vec<(&'static str, Vec<(String, String)>)> {
    let loopback: Vec<(String, String)> = LOOPBACK_ENV
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    let with = |extra: (&str, &str)| {
        let mut env = loopback.clone();
        env.push((extra.0.to_string(), extra.1.to_string()));
        env
    };
    let mut plan = vec![(RUN_MAIN, loopback.clone())];
    if spec.gdr_negative_control {
        plan.push((RUN_GDR_OFF, with(("NCCL_NET_GDR_LEVEL", "LOC"))));
    }
    if spec.socket_comparison {
        plan.push((RUN_SOCKET, with(("NCCL_IB_DISABLE", "1"))));
    }
    if spec.nvlink_run {
        plan.push((RUN_NVLINK, vec![]));
    }
    plan
}

/// The NCCL runs of [`nccl_plan`] on a node with `node_gpus` GPUs (one rank per GPU unless the
/// profile's arguments say otherwise). Returns the runs and the binary's digest. Each run is
/// one step of `progress`.
pub async fn nccl_runs(
    setup: &NodeSetup,
    profile: &FabricProfileSpec,
    node_gpus: u32,
    progress: &dyn Progress,
) -> (Vec<NcclRunEvidence>, Option<String>) {
    let spec = &profile.certification.nccl_tests;
    let mut base_env = setup.nccl_env.clone();
    base_env.push(("NCCL_IB_HCA".into(), profile.nccl_ib_hca()));
    if let Some(ifname) = &profile.nccl.socket_ifname {
        base_env.push(("NCCL_SOCKET_IFNAME".into(), ifname.clone()));
    }
    if spec.force_ring {
        base_env.push(("NCCL_ALGO".into(), "Ring".into()));
    }
    let plan = nccl_plan(spec);
    let args = spec.args_for_node(node_gpus);
    let native = profile.certification.nccl_runner == NcclRunner::Native;
    let runner_name = if native {
        format!("native, {}", RANKS_SUBCOMMAND)
    } else {
        setup
            .nccl_binary
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut runs = Vec::new();
    let mut digest = None;
    let total = plan.len();
    for (i, (label, extra)) in plan.into_iter().enumerate() {
        progress.step(&format!("NCCL {}/{total} {label} ({runner_name})", i + 1));
        let mut env = base_env.clone();
        env.extend(extra.iter().cloned());
        let shown_env: Vec<(String, String)> = extra;
        let result = if native {
            let sweep = &profile.certification.nccl_native;
            let run = NativeRunSpec {
                label: label.to_string(),
                sizes: sweep.sizes(),
                warmup: sweep.warmup,
                iterations: sweep.iterations,
                env,
                log_dir: setup.log_dir.clone(),
                timeout: setup.nccl_timeout,
            };
            setup.native_nccl.run(&run).await
        } else {
            let run = NcclRunSpec {
                label: label.to_string(),
                binary: setup.nccl_binary.clone(),
                args: args.clone(),
                env,
                log_dir: setup.log_dir.clone(),
                timeout: setup.nccl_timeout,
            };
            run_nccl_test(&run).await
        };
        let outcome = match result {
            Ok(r) => {
                digest = digest.or(r.binary_sha256.clone());
                tracing::info!(run = label, plateau = ?r.observation.busbw_plateau_gbps(), transport = ?r.observation.log.net, gdr = ?r.observation.log.gdr, "nccl run finished");
                Ok(r.observation)
            }
            Err(e) => {
                tracing::warn!(run = label, error = %error_chain(&e), "nccl run failed");
                Err(error_chain(&e))
            }
        };
        runs.push(NcclRunEvidence {
            label: label.to_string(),
            env: shown_env,
            outcome,
        });
        progress.step_done();
    }
    (runs, digest)
}

/// The steps of one invasive window: one per rail, one per NCCL run.
pub fn invasive_steps(profile: &FabricProfileSpec) -> u64 {
    let spec = &profile.certification.nccl_tests;
    let runs = nccl_plan(spec).len() as u64;
    profile.rails.len() as u64 + runs
}

/// One invasive certification window: read ports, benchmark every rail, run NCCL, read
/// ports again.
pub async fn gather_invasive(
    setup: &NodeSetup,
    profile: &FabricProfileSpec,
    exposure: Option<ResourceExposure>,
) -> Result<Gathered, GatherError> {
    gather_invasive_with(setup, profile, exposure, Arc::new(NoProgress)).await
}

/// [`gather_invasive`], reporting each rail and NCCL run to `progress` (planned up front with
/// [`invasive_steps`]; `finish` is the caller's).
pub async fn gather_invasive_with(
    setup: &NodeSetup,
    profile: &FabricProfileSpec,
    exposure: Option<ResourceExposure>,
    progress: Arc<dyn Progress>,
) -> Result<Gathered, GatherError> {
    progress.plan(invasive_steps(profile));
    progress.step("reading ports");
    let first = discover_node(setup)?;
    let before = port_readings(&first);
    let benches = bench_rails(setup.engine.clone(), profile, &first.gpus, progress.clone()).await;
    let node_gpus = u32::try_from(first.gpus.len()).unwrap_or(u32::MAX);
    let (nccl, digest) = nccl_runs(setup, profile, node_gpus, progress.as_ref()).await;
    progress.step("reading ports again");
    let last = discover_node(setup)?;
    let mut software = software_baseline(&last, profile, setup.software.as_ref());
    let main = nccl
        .iter()
        .find(|r| r.label == RUN_MAIN)
        .and_then(|r| r.outcome.as_ref().ok());
    // The native ranks report ncclGetVersion of the library they loaded: that, not a log
    // line, is the NCCL that ran.
    let loaded = match profile.certification.nccl_runner {
        NcclRunner::Native => main
            .and_then(|o| o.perf.as_ref())
            .and_then(|p| p.nccl_version.clone()),
        NcclRunner::NcclTests => None,
    };
    if let Some(v) = loaded.or_else(|| main.and_then(|o| o.nccl_version())) {
        software.insert("nccl".into(), v);
    }
    if let Some(d) = digest {
        // What ran: the nccl-tests binary, or the NCCL library the native ranks loaded.
        let key = match profile.certification.nccl_runner {
            NcclRunner::NcclTests => "nccl-tests",
            NcclRunner::Native => "libnccl",
        };
        software.insert(key.into(), d);
    }
    Ok(gathered(
        profile,
        &last,
        Benchmarks {
            before,
            benches,
            nccl,
        },
        software,
        exposure,
    ))
}

/// What a run measured besides the discovery it ends with.
struct Benchmarks {
    /// The port readings at the window's start.
    before: Vec<PortReading>,
    benches: Vec<RailBench>,
    nccl: Vec<NcclRunEvidence>,
}

/// The evidence of a run that ended with discovery `last`.
fn gathered(
    profile: &FabricProfileSpec,
    last: &Discovery,
    measured: Benchmarks,
    software: BTreeMap<String, String>,
    exposure: Option<ResourceExposure>,
) -> Gathered {
    Gathered {
        evidence: Evidence {
            before: measured.before,
            after: port_readings(last),
            benches: measured.benches,
            nccl: measured.nccl,
            layout_signature: Some(railguard_api::certified_signature(
                &last.rail_layout(),
                &profile.layout(),
            )),
            software,
            exposure,
            findings: reported_findings(last),
            gpu_rails: gpu_rails(last),
            grey: BTreeMap::new(),
        },
        gpus: gpu_affinity(last),
    }
}

/// Each GPU's PCI address → the rail (`hca:port`) of its preferred HCA.
pub fn gpu_rails(d: &Discovery) -> BTreeMap<String, String> {
    gpu_affinity(d)
        .into_iter()
        .filter_map(|g| {
            let addr = railguard_api::dra::normalize_pci_address(g.pci_bus_id.as_deref()?);
            Some((addr, format!("{}:{}", g.preferred_hca, g.port.unwrap_or(1))))
        })
        .collect()
}

/// The findings a certificate carries: warning and above (informational ones stay in
/// `discover`'s output).
pub fn reported_findings(d: &Discovery) -> Vec<railguard_api::Finding> {
    d.findings
        .iter()
        .filter(|f| f.severity >= railguard_api::Severity::Warning)
        .cloned()
        .collect()
}

/// One passive window: read ports, wait `window`, read again.
pub async fn gather_passive(
    setup: &NodeSetup,
    profile: &FabricProfileSpec,
    window: Duration,
    exposure: Option<ResourceExposure>,
) -> Result<Gathered, GatherError> {
    let first = discover_node(setup)?;
    tokio::time::sleep(window).await;
    let last = discover_node(setup)?;
    let software = software_baseline(&last, profile, setup.software.as_ref());
    let measured = Benchmarks {
        before: port_readings(&first),
        benches: Vec::new(),
        nccl: Vec::new(),
    };
    Ok(gathered(profile, &last, measured, software, exposure))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, numa: Option<u32>) -> discover::Gpu {
        discover::Gpu {
            index,
            pci_bus_id: format!("0000:{:02x}:00.0", 0x10 + index),
            numa,
            name: None,
            uuid: None,
        }
    }

    #[test]
    fn the_far_gpu_is_the_lowest_index_on_another_known_numa_node() {
        let gpus = [
            gpu(0, Some(0)),
            gpu(1, Some(0)),
            gpu(2, None),
            gpu(3, Some(1)),
            gpu(4, Some(1)),
        ];
        assert_eq!(
            rail_gpus(&[1, 0], &gpus),
            Some(RailGpus {
                near: 1,
                far: Some(3)
            })
        );
        assert_eq!(
            rail_gpus(&[4], &gpus),
            Some(RailGpus {
                near: 4,
                far: Some(0)
            })
        );
        // An unknown NUMA node is never taken for "far", on either side.
        assert_eq!(
            rail_gpus(&[2], &gpus),
            Some(RailGpus { near: 2, far: None })
        );
        let one_socket = [gpu(0, Some(0)), gpu(1, Some(0))];
        assert_eq!(
            rail_gpus(&[0], &one_socket),
            Some(RailGpus { near: 0, far: None })
        );
        assert_eq!(rail_gpus(&[], &gpus), None);
    }
}
