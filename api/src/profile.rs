//! The `FabricProfile` custom resource: one homogeneous GPU node pool and the fabric
//! it must have. Cluster-scoped, `railguard.io/v1alpha1`.

use std::collections::{BTreeMap, BTreeSet};

use kube::CustomResource;
use schemars::JsonSchema;

use crate::finding::{FindingKind, DEFAULT_FATAL_FINDINGS};
use serde::{Deserialize, Serialize};

pub use crate::error::FieldProblem;
use crate::error::ProfileError;
use crate::quantity::parse_bytes;
use crate::selector::LabelSelector;
pub use crate::signature::LinkLayer;
use crate::signature::{layout_signature, RailLayout};

/// One compute rail: an HCA port and the GPUs whose traffic it carries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RailSpec {
    /// RDMA device name, e.g. `mlx5_0`.
    #[schemars(pattern(r"^[A-Za-z0-9_.-]{1,64}$"))]
    pub hca: String,
    /// Port number on the HCA (1-based).
    #[schemars(range(min = 1, max = 255))]
    pub port: u32,
    pub link_layer: LinkLayer,
    /// Expected link rate in Gb/s (e.g. 400 for NDR, 200 for HDR).
    #[schemars(range(min = 1, max = 3200))]
    pub rate_gbps: u32,
    /// GPU indices (NVML order) this rail serves.
    #[schemars(inner(range(max = 255)))]
    pub gpus: Vec<u32>,
    /// Network interface behind the port, when known (RoCE netdev or IPoIB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
}

impl RailSpec {
    /// `hca:port`, the form NCCL and railguard messages use.
    pub fn id(&self) -> String {
        format!("{}:{}", self.hca, self.port)
    }
}

/// NCCL settings injected into training containers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NcclSettings {
    /// `NCCL_IB_HCA`; derived from the rails in exact-match form (`=mlx5_0:1,...`) when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ib_hca: Option<String>,
    /// `NCCL_SOCKET_IFNAME`, e.g. `=eth0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_ifname: Option<String>,
    /// `NCCL_CROSS_NIC` (0, 1 or 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 2))]
    pub cross_nic: Option<u8>,
    /// Other NCCL variables to inject, e.g. `NCCL_IB_QPS_PER_CONNECTION`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// How the settings reach the training process: `Env` (the webhook injects the
    /// variables at admission) or `Plugin` (railguard's NCCL environment plugin answers them
    /// at run time from the node's certificate).
    #[serde(default, skip_serializing_if = "NcclDelivery::is_env")]
    pub delivery: NcclDelivery,
    /// `Plugin` only: the plugin's values replace the ones the container sets itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enforce: bool,
    /// `Plugin` only: what the plugin does on a node whose certificate or rails are unusable.
    #[serde(default, skip_serializing_if = "OnUnhealthy::is_warn")]
    pub on_unhealthy: OnUnhealthy,
    /// `Plugin` only: every node of a job answers the same number of rails (the fleet's
    /// consistent rail count).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub consistent_rails: bool,
}

/// How a profile's NCCL settings reach the training process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NcclDelivery {
    /// The webhook injects `NCCL_IB_HCA`, `NCCL_SOCKET_IFNAME`, `NCCL_CROSS_NIC` and `env`
    /// into the containers: the profile's values, the same on every node.
    #[default]
    Env,
    /// The webhook injects `NCCL_ENV_PLUGIN` and mounts `libnccl-env-railguard.so` and the
    /// node file the prober writes; the plugin answers from what was certified on the node
    /// the pod runs on (docs/nccl-env-plugin.md).
    Plugin,
}

impl NcclDelivery {
    fn is_env(&self) -> bool {
        *self == NcclDelivery::Env
    }
}

/// What the NCCL environment plugin does when the node is unhealthy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OnUnhealthy {
    /// Warn and answer nothing: NCCL sees the process environment.
    #[default]
    Warn,
    /// Warn and fail NCCL's initialisation, so the job stops at start.
    Fail,
}

impl OnUnhealthy {
    fn is_warn(&self) -> bool {
        *self == OnUnhealthy::Warn
    }
}

/// Variables the NCCL environment plugin computes from the node's rails: with
/// `delivery: Plugin` a profile may not set them (the plugin would refuse its node file).
pub const PLUGIN_COMPUTED_ENV: [&str; 2] = ["NCCL_IB_HCA", "NCCL_IB_GID_INDEX"];

/// How many RDMA device resources a training container requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RdmaCountMode {
    /// One shared device (e.g. `rdma/rdma_shared_device_a: 1`).
    SharedDevice,
    /// One per GPU the container requests.
    PerGpu,
    /// One per rail of the profile.
    PerRail,
}

/// The RDMA extended resource a training container needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RdmaResource {
    /// Extended resource name, e.g. `rdma/rdma_shared_device_a` or `nvidia.com/hostdev`.
    pub resource_name: String,
    pub count_mode: RdmaCountMode,
    /// RoCE traffic class: the GRH traffic class byte (DSCP << 2, e.g. 106 for DSCP 26) of the
    /// fabric's lossless class. railguard's RDMA tests send in it and training containers get
    /// it as `NCCL_IB_TC`; absent: 0, NCCL's default (`src/transport/net_ib/connect.cc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_class: Option<u8>,
    /// InfiniBand service level (0-15) of the tests, injected as `NCCL_IB_SL`; absent: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 15))]
    pub service_level: Option<u8>,
}

/// Highest InfiniBand service level (the SL field is 4 bits).
pub const MAX_SERVICE_LEVEL: u8 = 15;

impl RdmaResource {
    /// How many of the resource a container with `gpus` GPUs asks for, on a profile of
    /// `rails` rails (the webhook's injection and the campaign's MPIJob use this one rule).
    pub fn count(&self, gpus: u64, rails: usize) -> u64 {
        match self.count_mode {
            RdmaCountMode::SharedDevice => 1,
            RdmaCountMode::PerGpu => gpus,
            RdmaCountMode::PerRail => u64::try_from(rails).unwrap_or(u64::MAX),
        }
    }
}

/// A profile field renamed so that its name carries its unit: GB/s (10^9 bytes/s, nccl-tests'
/// unit) ends in `GBps`, Gb/s (line rate) in `Gbps`. For one release the old name is still
/// read (a serde alias; the CRD keeps it in its schema so the API server does not prune it)
/// and the profile's `Valid` condition warns about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenamedField {
    /// The object holding the field, as a JSON pointer from the FabricProfile's root.
    pub object: &'static str,
    pub old: &'static str,
    pub new: &'static str,
}

/// Every renamed profile field (read under its old name until the next release).
pub const RENAMED_FIELDS: &[RenamedField] = &[
    RenamedField {
        object: "/spec/thresholds",
        old: "busbwPlateauGbps",
        new: "busbwPlateauGBps",
    },
    RenamedField {
        object: "/spec/certification/ncclPair",
        old: "minBusbwGbps",
        new: "minBusbwGBps",
    },
    RenamedField {
        object: "/spec/certification/ncclPair",
        old: "minRailBusbwGbps",
        new: "minRailBusbwGBps",
    },
];

impl RenamedField {
    /// The field's path as validation messages write it (`spec.thresholds.busbwPlateauGbps`).
    pub fn old_path(&self) -> String {
        format!(
            "{}.{}",
            self.object.trim_start_matches('/').replace('/', "."),
            self.old
        )
    }
}

/// The old names of the fields of the object at `object` in its schema: the new property's
/// schema under the old name, marked deprecated; a required new name becomes "the new or the
/// old name" (`anyOf` of two `required`, which a structural schema allows), so an object
/// written with the old name still passes the API server's validation.
fn add_renamed_properties(schema: &mut schemars::Schema, object: &str) {
    for field in RENAMED_FIELDS.iter().filter(|f| f.object == object) {
        let Some(properties) = schema
            .get_mut("properties")
            .and_then(serde_json::Value::as_object_mut)
        else {
            continue;
        };
        let Some(mut old) = properties.get(field.new).cloned() else {
            continue;
        };
        if let Some(o) = old.as_object_mut() {
            o.insert(
                "description".into(),
                format!(
                    "Deprecated: the old name of `{}`, read until the next release.",
                    field.new
                )
                .into(),
            );
        }
        properties.insert(field.old.into(), old);
        let Some(required) = schema
            .get_mut("required")
            .and_then(serde_json::Value::as_array_mut)
        else {
            continue;
        };
        let before = required.len();
        required.retain(|r| r.as_str() != Some(field.new));
        if required.len() < before {
            schema.insert(
                "anyOf".into(),
                serde_json::json!([{"required": [field.new]}, {"required": [field.old]}]),
            );
        }
    }
}

fn renamed_thresholds_schema(schema: &mut schemars::Schema) {
    add_renamed_properties(schema, "/spec/thresholds");
}

fn renamed_nccl_pair_schema(schema: &mut schemars::Schema) {
    add_renamed_properties(schema, "/spec/certification/ncclPair");
}

/// Per-profile thresholds for certification.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = renamed_thresholds_schema)]
pub struct Thresholds {
    /// Minimum RDMA WRITE bandwidth per rail from host memory, Gb/s.
    #[schemars(range(min = 0))]
    pub write_bw_host_gbps: f64,
    /// Minimum RDMA WRITE bandwidth per rail from GPU memory (GPUDirect), Gb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub write_bw_gpu_gbps: Option<f64>,
    /// Maximum small-message RDMA WRITE latency, microseconds: the HCA loopback's
    /// `ib_write_lat` figure, the median half round trip of a 2-byte ping-pong (a healthy NDR
    /// HCA: about 1-2). The campaign's pair tests hold theirs to it too: post to completion of
    /// one signaled write, about a full round trip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_latency_us: Option<f64>,
    /// Minimum bus bandwidth plateau, GB/s (nccl-tests units), of the node's NCCL loopback:
    /// one rank per GPU with P2P, SHM and NVLS off, so every byte goes GPU → NIC → NIC → GPU.
    /// It is bounded by one rail's line rate (NDR 400 Gb/s: 50 GB/s), not by NVLink.
    #[serde(rename = "busbwPlateauGBps", alias = "busbwPlateauGbps")]
    #[schemars(range(min = 0))]
    pub busbw_plateau_gbps: f64,
    /// Minimum busbw plateau of the optional NVLink run (`ncclTests.nvlinkRun`: P2P on), GB/s;
    /// absent: the run is recorded, not judged.
    #[serde(
        default,
        rename = "nvlinkBusbwGBps",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0))]
    pub nvlink_busbw_gbps: Option<f64>,
    /// Allowed growth of each error counter over a check window; unlisted counters allow 0.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counter_growth: BTreeMap<String, u64>,
    /// A drop beyond this percentage below the node's own history median is a regression.
    #[serde(default = "default_regression_tolerance")]
    #[schemars(range(min = 0, max = 100))]
    pub regression_tolerance_percent: f64,
}

fn default_regression_tolerance() -> f64 {
    10.0
}

/// How and how often the prober certifies nodes of this profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificationSpec {
    /// Lifetime of a certificate from its last invasive pass, seconds.
    #[serde(default = "default_ttl")]
    #[schemars(range(min = 1, max = MAX_SECONDS))]
    pub ttl_seconds: u64,
    /// Interval between invasive runs, seconds (must be shorter than the TTL).
    #[serde(default = "default_interval")]
    #[schemars(range(min = 1, max = MAX_SECONDS))]
    pub interval_seconds: u64,
    /// Interval between passive rail checks, seconds.
    #[serde(default = "default_passive_interval")]
    #[schemars(range(min = 1, max = MAX_SECONDS))]
    pub passive_interval_seconds: u64,
    /// Passive healing: a rail that a passive check failed (its port down or flapping, its
    /// link layer or rate wrong, its error counters growing: faults `link-down`, `link-rate`,
    /// `errors`) is restored to what it was before, and the node to its verdict before, after
    /// this many consecutive clean passive checks, without waiting for the next invasive run.
    /// Flap damping: each further passive failure of the rail before it heals, or within its
    /// hold (as many clean checks again after the heal), restarts the count and doubles the
    /// checks required (N, 2N, 4N, at most 8N); an invasive run clears every hold. A rail
    /// that an invasive test failed (`rdma`, `latency`, `gpudirect`, `pcie`, `wire`,
    /// `failed`) is never healed passively. `0`: a passive pass keeps the earlier verdict
    /// (only an invasive run restores a rail). docs/passive-healing.md has the rule.
    #[serde(default = "default_passive_heal_windows")]
    #[schemars(range(min = 0, max = MAX_PASSIVE_HEAL_WINDOWS))]
    pub passive_heal_windows: u32,
    /// How many past results a certificate keeps as history.
    #[serde(default = "default_history")]
    #[schemars(range(min = 1, max = MAX_HISTORY_DEPTH))]
    pub history_depth: u32,
    /// What runs the node's NCCL loopback: `Native` (the default: the prober's own ranks
    /// through NCCL's C API, `ncclNative`; no nccl-tests binary on the node, only
    /// `libnccl.so.2`, which the prober image carries, and the CUDA driver) or `NcclTests`
    /// (`all_reduce_perf`, `ncclTests`).
    #[serde(default)]
    pub nccl_runner: NcclRunner,
    /// nccl-tests settings.
    #[serde(default)]
    pub nccl_tests: NcclTestsSpec,
    /// The native runner's sweep (`ncclRunner: Native`).
    #[serde(default)]
    pub nccl_native: NcclNativeSpec,
    /// How GPU memory is registered with the HCA for the GPUDirect RDMA tests.
    #[serde(default)]
    pub gpu_registration: GpuRegistration,
    /// Finding kinds that fail certification (default: [`DEFAULT_FATAL_FINDINGS`]); an empty
    /// list makes every finding informational.
    #[serde(default = "default_fatal_findings")]
    pub fatal_findings: Vec<FindingKind>,
    /// NCCL all-reduce pair tests in campaigns (full node and one rail at a time), run by the
    /// prober through NCCL's C API; absent: campaigns run none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_pair: Option<NcclPairSpec>,
    /// Keep the NoSchedule taint `railguard.io/fabric-unhealthy` on the profile's nodes that
    /// are failed, degraded, expired or (with `fleet.outliers: Filter`) fleet outliers, so
    /// every scheduler (the default one, Kueue, KAI, Volcano, Karpenter) keeps pods without a
    /// toleration off them; the fleet controller writes it and removes it when a passing
    /// certificate lands.
    #[serde(default)]
    pub taints: bool,
    /// At most this many of the profile's nodes run an invasive test at once, cluster-wide:
    /// a count (`4`) or a percentage of the profile's nodes (`"5%"`, rounded up, at least
    /// one). Each run first takes one of as many `coordination.k8s.io` Leases
    /// ([`FabricProfile::invasive_slot_leases`]) and waits while all are held; waiting
    /// nodes take them oldest certificate first (`status.invasive.queue`, kept by the fleet
    /// controller; without it a percentage is one slot). Size it so that nodes × run length
    /// ÷ slots stays under `intervalSeconds` (BENCHMARKS.md, "Certification wave").
    #[serde(default)]
    pub max_concurrent_invasive: crate::invasive::MaxConcurrentInvasive,
    /// Count certificates made by a simulated engine and stand-in (`simulated: true`, the
    /// `railguard.io/simulated` label) as certification. Off (the default) they certify
    /// nothing: the extender refuses such nodes, the webhook's affinity requires the label's
    /// absence and the node guard refuses to store one. Only demos and tests, whose nodes
    /// are simulated, turn it on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accept_simulated: bool,
}

pub use crate::invasive::MAX_CONCURRENT_INVASIVE;

/// Largest message of an NCCL pair sweep (16 GiB, past every real plateau).
pub const MAX_NCCL_PAIR_BYTES: u64 = 16 << 30;
/// Longest NCCL pair test (one hour).
pub const MAX_NCCL_PAIR_TIMEOUT_SECONDS: u64 = 3600;

/// The campaign's NCCL pair tests: for each tested pair of nodes, the full node (every GPU,
/// every rail) and, with `perRail`, each rail alone (`NCCL_IB_HCA` limited to it, the GPUs
/// the rail serves) — the runbook's per-rail and scaling matrix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = renamed_nccl_pair_schema)]
pub struct NcclPairSpec {
    /// Run the full-node test.
    #[serde(default = "default_true")]
    pub full_node: bool,
    /// Run one test per rail.
    #[serde(default = "default_true")]
    pub per_rail: bool,
    /// Minimum busbw of the full-node test, GB/s (at the sweep's largest size).
    #[serde(
        default,
        rename = "minBusbwGBps",
        alias = "minBusbwGbps",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0))]
    pub min_busbw_gbps: Option<f64>,
    /// Minimum busbw of a one-rail test, GB/s.
    #[serde(
        default,
        rename = "minRailBusbwGBps",
        alias = "minRailBusbwGbps",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0))]
    pub min_rail_busbw_gbps: Option<f64>,
    /// Smallest message of the sweep, bytes (sizes double up to `maxBytes`).
    #[serde(default = "default_pair_min_bytes")]
    #[schemars(range(min = 4, max = MAX_NCCL_PAIR_BYTES))]
    pub min_bytes: u64,
    /// Largest message of the sweep, bytes.
    #[serde(default = "default_pair_max_bytes")]
    #[schemars(range(min = 4, max = MAX_NCCL_PAIR_BYTES))]
    pub max_bytes: u64,
    /// Untimed all-reduces per size.
    #[serde(default = "default_pair_warmup")]
    #[schemars(range(max = 100))]
    pub warmup: u32,
    /// Timed all-reduces per size.
    #[serde(default = "default_pair_iterations")]
    #[schemars(range(min = 1, max = 1000))]
    pub iterations: u32,
    /// Limit of one pair test, seconds.
    #[serde(default = "default_pair_timeout")]
    #[schemars(range(min = 1, max = MAX_NCCL_PAIR_TIMEOUT_SECONDS))]
    pub timeout_seconds: u64,
    /// A node that cannot run the test (no NCCL library, no GPU) fails it; otherwise such a
    /// test proves nothing either way.
    #[serde(default)]
    pub require_measured: bool,
}

fn default_pair_min_bytes() -> u64 {
    1 << 20
}
fn default_pair_max_bytes() -> u64 {
    256 << 20
}
fn default_pair_warmup() -> u32 {
    5
}
fn default_pair_iterations() -> u32 {
    20
}
fn default_pair_timeout() -> u64 {
    300
}

impl Default for NcclPairSpec {
    fn default() -> Self {
        NcclPairSpec {
            full_node: true,
            per_rail: true,
            min_busbw_gbps: None,
            min_rail_busbw_gbps: None,
            min_bytes: default_pair_min_bytes(),
            max_bytes: default_pair_max_bytes(),
            warmup: default_pair_warmup(),
            iterations: default_pair_iterations(),
            timeout_seconds: default_pair_timeout(),
            require_measured: false,
        }
    }
}

impl NcclPairSpec {
    /// The sweep's sizes: `minBytes` doubling up to `maxBytes` (both included).
    pub fn sizes(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut b = self.min_bytes.max(4);
        while b <= self.max_bytes {
            out.push(usize::try_from(b).unwrap_or(usize::MAX));
            match b.checked_mul(2) {
                Some(n) => b = n,
                None => break,
            }
        }
        out
    }

    fn problems(&self, out: &mut Vec<FieldProblem>) {
        let at = |f: &str| format!("spec.certification.ncclPair.{f}");
        if let Some(v) = self.min_busbw_gbps {
            check_number(out, &at("minBusbwGBps"), v, true);
        }
        if let Some(v) = self.min_rail_busbw_gbps {
            check_number(out, &at("minRailBusbwGBps"), v, true);
        }
        sweep_size_problems(out, &at, self.min_bytes, self.max_bytes);
        if self.min_bytes > self.max_bytes {
            out.push(FieldProblem {
                field: at("minBytes"),
                message: format!("{} is above maxBytes ({})", self.min_bytes, self.max_bytes),
            });
        }
        sweep_round_problems(out, &at, self.warmup, self.iterations);
        if self.timeout_seconds == 0 || self.timeout_seconds > MAX_NCCL_PAIR_TIMEOUT_SECONDS {
            out.push(FieldProblem {
                field: at("timeoutSeconds"),
                message: format!("must be between 1 and {MAX_NCCL_PAIR_TIMEOUT_SECONDS}"),
            });
        }
        if !self.full_node && !self.per_rail {
            out.push(FieldProblem {
                field: at("fullNode"),
                message:
                    "fullNode and perRail are both off: no test would run (remove ncclPair instead)"
                        .into(),
            });
        }
    }
}

/// The message sizes of an NCCL sweep (`ncclPair`, `ncclNative`): each within 4 bytes and
/// [`MAX_NCCL_PAIR_BYTES`].
fn sweep_size_problems(
    out: &mut Vec<FieldProblem>,
    at: &dyn Fn(&str) -> String,
    min_bytes: u64,
    max_bytes: u64,
) {
    for (f, v) in [("minBytes", min_bytes), ("maxBytes", max_bytes)] {
        if !(4..=MAX_NCCL_PAIR_BYTES).contains(&v) {
            out.push(FieldProblem {
                field: at(f),
                message: format!("must be between 4 and {MAX_NCCL_PAIR_BYTES} bytes"),
            });
        }
    }
}

/// The warm-up and timed rounds of an NCCL sweep: at most 100 and 1 to 1000.
fn sweep_round_problems(
    out: &mut Vec<FieldProblem>,
    at: &dyn Fn(&str) -> String,
    warmup: u32,
    iterations: u32,
) {
    if warmup > 100 {
        out.push(FieldProblem {
            field: at("warmup"),
            message: "must be at most 100".into(),
        });
    }
    if !(1..=1000).contains(&iterations) {
        out.push(FieldProblem {
            field: at("iterations"),
            message: "must be between 1 and 1000".into(),
        });
    }
}

/// What runs the node's NCCL loopback.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NcclRunner {
    /// `all_reduce_perf` from nccl-tests (`certification.ncclTests`), one process with one
    /// rank per GPU.
    NcclTests,
    /// The prober's `nccl-ranks` child: one thread and rank per GPU in one communicator
    /// through `libnccl.so.2` (railguard-gpu), timed and checked like nccl-tests. The
    /// default: the prober image certifies a node without an nccl-tests build.
    #[default]
    Native,
}

/// The native loopback's sweep: sizes double from `minBytes` to `maxBytes`, as
/// `all_reduce_perf -b -e -f 2` (defaults: the shipped `ncclTests.args`, `-b 8M -e 8G -w 5
/// -n 20`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NcclNativeSpec {
    /// Smallest message, bytes.
    #[serde(default = "default_native_min_bytes")]
    #[schemars(range(min = 4, max = MAX_NCCL_PAIR_BYTES))]
    pub min_bytes: u64,
    /// Largest message, bytes.
    #[serde(default = "default_native_max_bytes")]
    #[schemars(range(min = 4, max = MAX_NCCL_PAIR_BYTES))]
    pub max_bytes: u64,
    /// Untimed all-reduces per size.
    #[serde(default = "default_pair_warmup")]
    #[schemars(range(max = 100))]
    pub warmup: u32,
    /// Timed all-reduces per size.
    #[serde(default = "default_pair_iterations")]
    #[schemars(range(min = 1, max = 1000))]
    pub iterations: u32,
}

fn default_native_min_bytes() -> u64 {
    8 << 20
}
fn default_native_max_bytes() -> u64 {
    8 << 30
}

impl Default for NcclNativeSpec {
    fn default() -> Self {
        NcclNativeSpec {
            min_bytes: default_native_min_bytes(),
            max_bytes: default_native_max_bytes(),
            warmup: default_pair_warmup(),
            iterations: default_pair_iterations(),
        }
    }
}

impl NcclNativeSpec {
    /// The sweep's sizes, doubling from the smallest to the largest.
    pub fn sizes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut s = self.min_bytes.max(4);
        while s <= self.max_bytes {
            out.push(s);
            s = s.saturating_mul(2);
            if s == u64::MAX {
                break;
            }
        }
        out
    }

    fn problems(&self, out: &mut Vec<FieldProblem>) {
        let at = |f: &str| format!("spec.certification.ncclNative.{f}");
        sweep_size_problems(out, &at, self.min_bytes, self.max_bytes);
        if self.min_bytes > self.max_bytes {
            out.push(FieldProblem {
                field: at("minBytes"),
                message: "must not exceed maxBytes".into(),
            });
        }
        sweep_round_problems(out, &at, self.warmup, self.iterations);
    }
}

/// The registration path of GPU memory for RDMA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum GpuRegistration {
    /// DMA-BUF first (`ibv_reg_dmabuf_mr`), then nvidia-peermem; the certificate records
    /// which worked and why the other did not.
    #[default]
    Auto,
    /// Only DMA-BUF (`cuMemGetHandleForAddressRange` + `ibv_reg_dmabuf_mr`).
    DmaBuf,
    /// Only nvidia-peermem (`ibv_reg_mr` on the device pointer).
    PeerMem,
}

fn default_fatal_findings() -> Vec<FindingKind> {
    DEFAULT_FATAL_FINDINGS.to_vec()
}

impl Default for CertificationSpec {
    fn default() -> Self {
        Self {
            ttl_seconds: default_ttl(),
            interval_seconds: default_interval(),
            passive_interval_seconds: default_passive_interval(),
            passive_heal_windows: default_passive_heal_windows(),
            history_depth: default_history(),
            nccl_runner: NcclRunner::default(),
            nccl_tests: NcclTestsSpec::default(),
            nccl_native: NcclNativeSpec::default(),
            gpu_registration: GpuRegistration::default(),
            fatal_findings: default_fatal_findings(),
            nccl_pair: None,
            taints: false,
            max_concurrent_invasive: Default::default(),
            accept_simulated: false,
        }
    }
}

fn default_ttl() -> u64 {
    24 * 3600
}
fn default_interval() -> u64 {
    6 * 3600
}
fn default_passive_interval() -> u64 {
    60
}
/// Most clean passive checks [`CertificationSpec::passive_heal_windows`] may require (the
/// flap damping asks for up to eight times as many).
pub const MAX_PASSIVE_HEAL_WINDOWS: u32 = 1000;
fn default_passive_heal_windows() -> u32 {
    5
}
fn default_history() -> u32 {
    5
}

/// How the prober runs `all_reduce_perf`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NcclTestsSpec {
    /// Path of the `all_reduce_perf` binary: absolute, and one of the paths the prober was
    /// installed to allow (chart value `prober.ncclTests.allowedBinaries`), since the prober
    /// runs it as root on every node of the profile.
    #[serde(default = "default_nccl_binary")]
    #[schemars(pattern(r"^(/[A-Za-z0-9_.+-]+)+$"), length(max = 256))]
    pub binary: String,
    /// Arguments to `all_reduce_perf` (flags and plain values; never run through a shell).
    /// Without `-g`/`--ngpus` the prober adds `-g <the node's GPU count>`: one process, one
    /// rank per GPU. Arguments that make one rank (`-g 1` with one thread) are refused, since
    /// one rank moves no byte (nccl-tests `src/common.cu`: nranks = nProcs × nThreads × nGpus).
    #[serde(default = "default_nccl_args")]
    #[schemars(inner(pattern(r"^[A-Za-z0-9_.=:,+-]{1,64}$")), length(max = 64))]
    pub args: Vec<String>,
    /// Force `NCCL_ALGO=Ring` so the run measures the fabric rather than NVLS/tree tricks.
    #[serde(default)]
    pub force_ring: bool,
    /// GPUDirect RDMA must be in use (GDRDMA in the NCCL log).
    #[serde(default = "default_true")]
    pub expect_gdr: bool,
    /// Also run with `NCCL_NET_GDR_LEVEL=LOC`, which must be slower.
    #[serde(default)]
    pub gdr_negative_control: bool,
    /// Also run socket-only for comparison.
    #[serde(default)]
    pub socket_comparison: bool,
    /// Also run with NVLink (P2P, SHM and NVLS as NCCL defaults them): separate evidence of the
    /// node's GPU interconnect, judged against `thresholds.nvlinkBusbwGBps` when set.
    #[serde(default)]
    pub nvlink_run: bool,
}

impl Default for NcclTestsSpec {
    fn default() -> Self {
        Self {
            binary: default_nccl_binary(),
            args: default_nccl_args(),
            force_ring: false,
            expect_gdr: true,
            gdr_negative_control: false,
            socket_comparison: false,
            nvlink_run: false,
        }
    }
}

/// Longest period a profile may set (ten years): keeps `ttlSeconds` and friends far from
/// overflowing a timestamp.
pub const MAX_SECONDS: u64 = 10 * 366 * 24 * 3600;
/// Most certificates a node's history may keep (they live in one annotation).
pub const MAX_HISTORY_DEPTH: u32 = 100;
/// Most arguments `ncclTests.args` may hold.
pub const MAX_NCCL_ARGS: usize = 64;

/// The ranks an `all_reduce_perf` command line asks for in its one process: `-t`/`--nthreads`
/// threads of `-g`/`--ngpus` GPUs each (nccl-tests `src/common.cu`: both default to 1, and
/// nranks = nProcs × nThreads × nGpus; getopt_long also takes `-g8` and `--ngpus=8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankRequest {
    pub threads: u32,
    /// `None`: the arguments name no GPU count (the prober adds `-g <node GPUs>`).
    pub gpus: Option<u32>,
}

impl RankRequest {
    /// Ranks of the process; `None` while the GPU count is left to the prober.
    pub fn ranks(&self) -> Option<u64> {
        self.gpus.map(|g| u64::from(g) * u64::from(self.threads))
    }
}

/// Reads `-t` and `-g` from nccl-tests arguments (the last occurrence wins, as with getopt).
pub fn rank_request(args: &[String]) -> Result<RankRequest, String> {
    let mut req = RankRequest {
        threads: 1,
        gpus: None,
    };
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let (which, inline) = if let Some(v) = a.strip_prefix("--ngpus") {
            ('g', v)
        } else if let Some(v) = a.strip_prefix("--nthreads") {
            ('t', v)
        } else if let Some(v) = a.strip_prefix("-g") {
            ('g', v)
        } else if let Some(v) = a.strip_prefix("-t") {
            ('t', v)
        } else {
            i += 1;
            continue;
        };
        let value = if a.starts_with("--") {
            match inline.strip_prefix('=') {
                Some(v) => v.to_string(),
                None if inline.is_empty() => {
                    i += 1;
                    args.get(i).cloned().ok_or(format!("{a} needs a value"))?
                }
                // `--ngpusx` is another option; leave it to the tool.
                None => {
                    i += 1;
                    continue;
                }
            }
        } else if inline.is_empty() {
            i += 1;
            args.get(i).cloned().ok_or(format!("{a} needs a value"))?
        } else {
            inline.to_string()
        };
        let n: u32 = value
            .parse()
            .map_err(|_| format!("{a} takes a whole number, got {value:?}"))?;
        if n == 0 {
            return Err(format!("{a} must be at least 1"));
        }
        match which {
            'g' => req.gpus = Some(n),
            _ => req.threads = n,
        }
        i += 1;
    }
    Ok(req)
}

impl NcclTestsSpec {
    /// The arguments the prober runs on a node with `node_gpus` GPUs: the profile's, plus
    /// `-g <node_gpus>` where they name no GPU count.
    pub fn args_for_node(&self, node_gpus: u32) -> Vec<String> {
        let mut args = self.args.clone();
        if matches!(rank_request(&args), Ok(RankRequest { gpus: None, .. })) {
            args.push("-g".into());
            args.push(node_gpus.max(1).to_string());
        }
        args
    }

    /// Why these arguments cannot measure the fabric, if they cannot.
    pub fn rank_problem(&self) -> Option<String> {
        match rank_request(&self.args) {
            Err(e) => Some(e),
            Ok(r) if r.ranks().is_some_and(|n| n < 2) => Some(format!(
                "asks all_reduce_perf for 1 rank (-t {} -g {} in one process): one rank moves no byte, so busbw is 0 and no NIC is used; leave -g out and the prober runs one rank per GPU of the node",
                r.threads,
                r.gpus.unwrap_or(1)
            )),
            Ok(_) => None,
        }
    }

    /// Whether `binary` is one of the install-time allowed paths (compared exactly: the
    /// path is validated to be absolute and free of `..`).
    pub fn binary_is_allowed(&self, allowed: &[String]) -> bool {
        allowed.iter().any(|a| a == &self.binary)
    }
}

/// An absolute path of plain components: no `..`, no `.`, no empty component, and only the
/// characters of the CRD pattern.
fn is_plain_absolute_path(p: &str) -> bool {
    p.len() <= 256
        && p.starts_with('/')
        && p[1..].split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "_.+-".contains(ch))
        })
}

fn is_plain_argument(a: &str) -> bool {
    !a.is_empty()
        && a.len() <= 64
        && a.chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "_.=:,+-".contains(ch))
}

fn default_nccl_binary() -> String {
    "/usr/local/bin/all_reduce_perf".to_string()
}
fn default_nccl_args() -> Vec<String> {
    [
        "-b", "8M", "-e", "8G", "-f", "2", "-w", "5", "-n", "20", "-c", "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}
fn default_true() -> bool {
    true
}

/// What to do when a rule is broken at admission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// Admit and return an admission warning.
    #[default]
    Warn,
    /// Reject the pod.
    Deny,
}

/// Whether admission applies what it decides or only records it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AdmissionMode {
    /// Admit every pod unchanged: the patch railguard would apply (or the denial it would
    /// give) goes into the `railguard.io/audit` annotation and a warning, so an operator can
    /// review real traffic before enforcing.
    Audit,
    /// Apply the patch, deny what the policy denies.
    #[default]
    Enforce,
}

impl AdmissionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionMode::Audit => "Audit",
            AdmissionMode::Enforce => "Enforce",
        }
    }
}

/// Admission policy of the profile.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionPolicy {
    /// Audit or Enforce for this profile's pods; unset follows the webhook's `--mode`
    /// (chart `webhook.mode`). Lets one profile enforce while the others still audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<AdmissionMode>,
    /// Unsafe NCCL settings found on a pod (NCCL_DEBUG, GDR_LEVEL=SYS, ...).
    #[serde(default)]
    pub unsafe_nccl: Enforcement,
    /// IPC_LOCK needed but the namespace enforces Pod Security baseline/restricted.
    #[serde(default)]
    pub pod_security_conflict: Enforcement,
}

/// Which namespaces may use the exemption annotations (`inject: "false"`, `skip`,
/// `allow-uncertified`). A namespace is allowed when it is listed by name or its labels
/// match the selector. Empty means no namespace may.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExemptionPolicy {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

impl ExemptionPolicy {
    /// Whether a namespace (name and labels) may use exemption annotations.
    pub fn allows(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.namespaces.iter().any(|n| n == namespace)
            || self
                .namespace_selector
                .as_ref()
                .is_some_and(|s| !s.is_empty() && s.matches(labels))
    }
}

/// Spec of a FabricProfile.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "railguard.io",
    version = "v1alpha1",
    kind = "FabricProfile",
    plural = "fabricprofiles",
    shortname = "fp",
    printcolumn = r#"{"name":"Rails","type":"integer","jsonPath":".status.rails"}"#,
    printcolumn = r#"{"name":"Signature","type":"string","jsonPath":".status.signature"}"#,
    printcolumn = r#"{"name":"Default","type":"boolean","jsonPath":".spec.default"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    status = "FabricProfileStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct FabricProfileSpec {
    /// Labels that select the profile's nodes (and pods' nodeSelectors).
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// The profile used for GPU pods that select no other.
    #[serde(default)]
    pub default: bool,
    /// Compute rails, one per HCA port.
    pub rails: Vec<RailSpec>,
    #[serde(default)]
    pub nccl: NcclSettings,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<RdmaResource>,
    /// Multus networks (`name`, `ns/name`, `ns/name@if`) to attach.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<String>,
    /// `sizeLimit` of the memory-backed `/dev/shm` (Kubernetes quantity, e.g. `64Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<String>,
    /// Add `IPC_LOCK` to training containers.
    #[serde(default = "default_true")]
    pub ipc_lock: bool,
    /// Add a `railguard-prober preflight` init container.
    #[serde(default)]
    pub preflight: bool,
    pub thresholds: Thresholds,
    #[serde(default)]
    pub certification: CertificationSpec,
    #[serde(default)]
    pub exemptions: ExemptionPolicy,
    #[serde(default)]
    pub policy: AdmissionPolicy,
    /// Node label keys for placement scoring, most specific first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_keys: Vec<String>,
    /// How the profile's nodes are compared with each other (fleet baseline, outliers).
    #[serde(default)]
    pub fleet: crate::fleet::FleetSpec,
    /// How rail health becomes DRA device taints (clusters serving `resource.k8s.io/v1`).
    #[serde(default)]
    pub dra: crate::dra::DraSpec,
}

/// Status written by the webhook (`rails`, `signature`, `conditions`; informational) and by
/// the fleet controller (`fleet`, whose history it reads back for drift).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FabricProfileStatus {
    /// Number of rails (valid profiles only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rails: Option<u32>,
    /// The rail-layout signature nodes of the profile carry (valid profiles only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// `Valid`: `True` when railguard serves the profile, `False` (reason `InvalidProfile`,
    /// the message naming the field) when it skips it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    /// The fleet baseline of the profile's certified nodes, its outliers and drift.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<crate::fleet::FleetStatus>,
    /// The invasive slots resolved against the profile's nodes and the queue of nodes
    /// waiting for one (written by the fleet controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invasive: Option<crate::invasive::InvasiveStatus>,
}

impl FabricProfileSpec {
    /// The rail layout this profile describes.
    pub fn layout(&self) -> Vec<RailLayout> {
        self.rails
            .iter()
            .map(|r| RailLayout {
                hca: r.hca.clone(),
                port: r.port,
                link_layer: r.link_layer,
                rate_gbps: r.rate_gbps,
                gpus: r.gpus.clone(),
            })
            .collect()
    }

    /// The rail-layout signature nodes of this profile must carry.
    pub fn signature(&self) -> String {
        layout_signature(&self.layout())
    }

    /// `NCCL_IB_HCA`: the explicit value, or the exact-match form derived from the rails.
    pub fn nccl_ib_hca(&self) -> String {
        match &self.nccl.ib_hca {
            Some(v) => v.clone(),
            None => derive_ib_hca(&self.rails),
        }
    }

    /// Looks up a rail by `hca:port`.
    pub fn rail(&self, hca: &str, port: u32) -> Option<&RailSpec> {
        self.rails.iter().find(|r| r.hca == hca && r.port == port)
    }

    /// Topology keys for scoring: the profile's own, or the defaults.
    pub fn topology_keys(&self) -> Vec<String> {
        if self.topology_keys.is_empty() {
            crate::keys::DEFAULT_TOPOLOGY_KEYS
                .iter()
                .map(|s| s.to_string())
                .collect()
        } else {
            self.topology_keys.clone()
        }
    }

    /// Checks the profile for mistakes, reporting every problem with its field path.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let mut problems = Vec::new();
        let mut push =
            |field: String, message: String| problems.push(FieldProblem { field, message });

        if self.rails.is_empty() {
            push("spec.rails".into(), "at least one rail is required".into());
        }
        let mut seen = BTreeSet::new();
        for (i, rail) in self.rails.iter().enumerate() {
            let at = format!("spec.rails[{i}]");
            if !is_device_name(&rail.hca) {
                push(
                    format!("{at}.hca"),
                    format!("invalid HCA name {:?}", rail.hca),
                );
            }
            if rail.port == 0 {
                push(format!("{at}.port"), "port numbers start at 1".into());
            } else if rail.port > 255 {
                push(
                    format!("{at}.port"),
                    format!("port {} is above 255", rail.port),
                );
            }
            if rail.rate_gbps == 0 {
                push(
                    format!("{at}.rateGbps"),
                    format!("rail {} has rate 0", rail.id()),
                );
            } else if rail.rate_gbps > 3200 {
                push(
                    format!("{at}.rateGbps"),
                    format!(
                        "rail {} has rate {} Gb/s, above 3200",
                        rail.id(),
                        rail.rate_gbps
                    ),
                );
            }
            if !seen.insert((rail.hca.as_str(), rail.port)) {
                push(at.to_string(), format!("duplicate rail {}", rail.id()));
            }
            let mut gpus = BTreeSet::new();
            for g in &rail.gpus {
                if *g > 255 {
                    push(format!("{at}.gpus"), format!("GPU index {g} is above 255"));
                }
                if !gpus.insert(*g) {
                    push(
                        format!("{at}.gpus"),
                        format!("GPU {g} listed twice on rail {}", rail.id()),
                    );
                }
            }
        }
        // GPUs are numbered 0..n; every GPU up to the highest one named must be served.
        // Indices above 255 are reported above; walking up to one (4294967295) would not end.
        let served: BTreeSet<u32> = self
            .rails
            .iter()
            .flat_map(|r| r.gpus.iter().copied())
            .collect();
        if let Some(&max) = served.iter().next_back().filter(|&&max| max <= 255) {
            for g in 0..=max {
                if !served.contains(&g) {
                    push("spec.rails".into(), format!("GPU {g} is served by no rail"));
                }
            }
        }
        if let Some(hca) = &self.nccl.ib_hca {
            if let Err(e) = parse_ib_hca(hca) {
                push("spec.nccl.ibHca".into(), e);
            }
        }
        if let Some(ifname) = &self.nccl.socket_ifname {
            if ifname.trim().is_empty() || ifname.contains(char::is_whitespace) {
                push(
                    "spec.nccl.socketIfname".into(),
                    format!("invalid interface list {ifname:?}"),
                );
            }
        }
        if let Some(c) = self.nccl.cross_nic {
            if c > 2 {
                push(
                    "spec.nccl.crossNic".into(),
                    format!("must be 0, 1 or 2, not {c}"),
                );
            }
        }
        for k in self.nccl.env.keys() {
            if !k.starts_with("NCCL_") {
                push(
                    format!("spec.nccl.env.{k}"),
                    "only NCCL_* variables belong here".into(),
                );
            } else if self.nccl.delivery == NcclDelivery::Plugin
                && PLUGIN_COMPUTED_ENV.contains(&k.as_str())
            {
                push(
                    format!("spec.nccl.env.{k}"),
                    "with delivery Plugin the plugin computes it from the node's rails".into(),
                );
            }
        }
        match self.nccl.delivery {
            // The plugin derives NCCL_IB_HCA from the node's healthy rails; a fixed list
            // would be silently ignored.
            NcclDelivery::Plugin if self.nccl.ib_hca.is_some() => push(
                "spec.nccl.ibHca".into(),
                "with delivery Plugin the plugin computes NCCL_IB_HCA from the node's rails".into(),
            ),
            NcclDelivery::Plugin => {}
            // Only the plugin reads these; under Env they would do nothing.
            NcclDelivery::Env => {
                for (set, field) in [
                    (self.nccl.enforce, "enforce"),
                    (self.nccl.on_unhealthy != OnUnhealthy::Warn, "onUnhealthy"),
                    (self.nccl.consistent_rails, "consistentRails"),
                ] {
                    if set {
                        push(
                            format!("spec.nccl.{field}"),
                            "only the NCCL environment plugin reads it: set delivery: Plugin"
                                .into(),
                        );
                    }
                }
            }
        }
        if let Some(rdma) = &self.rdma {
            if let Some(sl) = rdma.service_level.filter(|sl| *sl > MAX_SERVICE_LEVEL) {
                push(
                    "spec.rdma.serviceLevel".into(),
                    format!("{sl} is not an InfiniBand service level (0-{MAX_SERVICE_LEVEL})"),
                );
            }
            if !is_extended_resource_name(&rdma.resource_name) {
                push(
                    "spec.rdma.resourceName".into(),
                    format!(
                        "{:?} is not an extended resource name (domain/name)",
                        rdma.resource_name
                    ),
                );
            }
        }
        for (i, n) in self.networks.iter().enumerate() {
            if n.trim().is_empty() || n.contains(',') || n.contains(char::is_whitespace) {
                push(
                    format!("spec.networks[{i}]"),
                    format!("invalid network name {n:?}"),
                );
            }
        }
        if let Some(size) = &self.shm_size {
            match parse_bytes(size) {
                Ok(0) => push("spec.shmSize".into(), "must be larger than 0".into()),
                Ok(_) => {}
                Err(e) => push("spec.shmSize".into(), e.to_string()),
            }
        }
        let t = &self.thresholds;
        let mut numeric = Vec::new();
        check_number(
            &mut numeric,
            "spec.thresholds.writeBwHostGbps",
            t.write_bw_host_gbps,
            true,
        );
        if let Some(v) = t.write_bw_gpu_gbps {
            check_number(&mut numeric, "spec.thresholds.writeBwGpuGbps", v, true);
        }
        if let Some(v) = t.max_latency_us {
            check_number(&mut numeric, "spec.thresholds.maxLatencyUs", v, false);
        }
        check_number(
            &mut numeric,
            "spec.thresholds.busbwPlateauGBps",
            t.busbw_plateau_gbps,
            true,
        );
        if let Some(v) = t.nvlink_busbw_gbps {
            check_number(&mut numeric, "spec.thresholds.nvlinkBusbwGBps", v, true);
        }
        check_number(
            &mut numeric,
            "spec.thresholds.regressionTolerancePercent",
            t.regression_tolerance_percent,
            true,
        );
        if t.regression_tolerance_percent > 100.0 {
            numeric.push(FieldProblem {
                field: "spec.thresholds.regressionTolerancePercent".into(),
                message: "must be at most 100".into(),
            });
        }
        problems.extend(numeric);
        let c = &self.certification;
        if c.ttl_seconds == 0 {
            problems.push(FieldProblem {
                field: "spec.certification.ttlSeconds".into(),
                message: "must be positive".into(),
            });
        }
        for (field, v) in [
            ("spec.certification.ttlSeconds", c.ttl_seconds),
            ("spec.certification.intervalSeconds", c.interval_seconds),
            (
                "spec.certification.passiveIntervalSeconds",
                c.passive_interval_seconds,
            ),
        ] {
            if v > MAX_SECONDS {
                problems.push(FieldProblem {
                    field: field.into(),
                    message: format!("must be at most {MAX_SECONDS} (ten years)"),
                });
            }
        }
        if let Some(message) = c.max_concurrent_invasive.problem() {
            problems.push(FieldProblem {
                field: "spec.certification.maxConcurrentInvasive".into(),
                message,
            });
        }
        if c.history_depth == 0 || c.history_depth > MAX_HISTORY_DEPTH {
            problems.push(FieldProblem {
                field: "spec.certification.historyDepth".into(),
                message: format!("must be between 1 and {MAX_HISTORY_DEPTH}"),
            });
        }
        if c.interval_seconds == 0 || c.interval_seconds >= c.ttl_seconds {
            problems.push(FieldProblem {
                field: "spec.certification.intervalSeconds".into(),
                message: format!(
                    "must be positive and shorter than ttlSeconds ({}), or certificates expire between runs",
                    c.ttl_seconds
                ),
            });
        }
        if c.passive_interval_seconds == 0 {
            problems.push(FieldProblem {
                field: "spec.certification.passiveIntervalSeconds".into(),
                message: "must be positive".into(),
            });
        }
        if c.passive_heal_windows > MAX_PASSIVE_HEAL_WINDOWS {
            problems.push(FieldProblem {
                field: "spec.certification.passiveHealWindows".into(),
                message: format!(
                    "must be at most {MAX_PASSIVE_HEAL_WINDOWS} (0: never heal passively)"
                ),
            });
        }
        if !is_plain_absolute_path(&c.nccl_tests.binary) {
            problems.push(FieldProblem {
                field: "spec.certification.ncclTests.binary".into(),
                message: format!(
                    "{:?} is not a plain absolute path (/dir/file, no `..`, letters, digits and _.+- only)",
                    c.nccl_tests.binary
                ),
            });
        }
        if c.nccl_tests.args.len() > MAX_NCCL_ARGS {
            problems.push(FieldProblem {
                field: "spec.certification.ncclTests.args".into(),
                message: format!("at most {MAX_NCCL_ARGS} arguments"),
            });
        }
        for (i, a) in c.nccl_tests.args.iter().enumerate() {
            if !is_plain_argument(a) {
                problems.push(FieldProblem {
                    field: format!("spec.certification.ncclTests.args[{i}]"),
                    message: format!(
                        "{a:?} is not a plain argument (letters, digits and _.=:,+- only, at most 64)"
                    ),
                });
            }
        }
        if c.nccl_runner == NcclRunner::Native {
            c.nccl_native.problems(&mut problems);
        }
        if let Some(message) = c.nccl_tests.rank_problem() {
            problems.push(FieldProblem {
                field: "spec.certification.ncclTests.args".into(),
                message,
            });
        }
        if let Some(pair) = &c.nccl_pair {
            pair.problems(&mut problems);
        }
        self.fleet.problems(&mut problems);
        if let Some(sel) = &self.exemptions.namespace_selector {
            if let Err(e) = sel.validate() {
                problems.push(FieldProblem {
                    field: "spec.exemptions.namespaceSelector".into(),
                    message: e,
                });
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ProfileError::Invalid { problems })
        }
    }
}

fn check_number(out: &mut Vec<FieldProblem>, field: &str, v: f64, allow_zero: bool) {
    if !v.is_finite() {
        out.push(FieldProblem {
            field: field.into(),
            message: "must be a finite number".into(),
        });
    } else if v < 0.0 {
        out.push(FieldProblem {
            field: field.into(),
            message: format!("must not be negative, got {v}"),
        });
    } else if !allow_zero && v == 0.0 {
        out.push(FieldProblem {
            field: field.into(),
            message: "must be positive".into(),
        });
    }
}

/// The profile among `profiles` whose rail layout this node has: an exact layout first, then
/// one that differs only in a link's current rate (a downshifted link is then judged as that
/// profile's rail). Pure.
pub fn matching_profile<'a>(
    profiles: &'a [FabricProfile],
    layout: &[RailLayout],
) -> Option<&'a FabricProfile> {
    let exact = layout_signature(layout);
    profiles
        .iter()
        .find(|p| p.spec.signature() == exact)
        .or_else(|| {
            profiles.iter().find(|p| {
                crate::signature::certified_signature(layout, &p.spec.layout())
                    == p.spec.signature()
            })
        })
}

impl FabricProfile {
    /// The profile's name (cluster-scoped, so unique).
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The Leases an invasive run of this profile's nodes takes one of when the profile has
    /// `slots` slots (`certification.maxConcurrentInvasive` resolved, in the prober's
    /// namespace).
    pub fn invasive_slot_leases(&self, slots: u32) -> Vec<String> {
        (0..slots.min(MAX_CONCURRENT_INVASIVE))
            .map(|i| format!("railguard-invasive-{}-{i}", self.name()))
            .collect()
    }

    /// Every Lease the profile's slots can ever use: the chart's RBAC names exactly these
    /// (all [`MAX_CONCURRENT_INVASIVE`] for a percentage).
    pub fn all_invasive_slot_leases(&self) -> Vec<String> {
        self.invasive_slot_leases(self.spec.certification.max_concurrent_invasive.most_slots())
    }

    /// Validates metadata and spec.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let mut problems = match self.spec.validate() {
            Ok(()) => Vec::new(),
            Err(ProfileError::Invalid { problems }) => problems,
            Err(e) => return Err(e),
        };
        if self.metadata.name.as_deref().is_none_or(str::is_empty) {
            problems.insert(
                0,
                FieldProblem {
                    field: "metadata.name".into(),
                    message: "is required".into(),
                },
            );
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ProfileError::Invalid { problems })
        }
    }
}

/// Exact-match `NCCL_IB_HCA` for the rails, in rail order: `=mlx5_0:1,mlx5_3:1`.
pub fn derive_ib_hca(rails: &[RailSpec]) -> String {
    let ids: Vec<String> = rails.iter().map(RailSpec::id).collect();
    format!("={}", ids.join(","))
}

/// One entry of an `NCCL_IB_HCA` list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbHcaEntry {
    pub hca: String,
    pub port: Option<u32>,
}

/// Parsed `NCCL_IB_HCA`: the `^` (exclude) and `=` (exact match) prefixes and the entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbHcaList {
    pub exclude: bool,
    pub exact: bool,
    pub entries: Vec<IbHcaEntry>,
}

/// Parses an `NCCL_IB_HCA` value such as `=mlx5_0:1,mlx5_1:1` or `^mlx5_4`.
pub fn parse_ib_hca(value: &str) -> Result<IbHcaList, String> {
    let mut rest = value.trim();
    let mut exclude = false;
    let mut exact = false;
    loop {
        if let Some(r) = rest.strip_prefix('^') {
            if exclude {
                return Err(format!("{value:?} repeats the ^ prefix"));
            }
            exclude = true;
            rest = r;
        } else if let Some(r) = rest.strip_prefix('=') {
            if exact {
                return Err(format!("{value:?} repeats the = prefix"));
            }
            exact = true;
            rest = r;
        } else {
            break;
        }
    }
    if rest.is_empty() {
        return Err(format!("{value:?} names no HCA"));
    }
    let mut entries = Vec::new();
    for part in rest.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!("{value:?} has an empty entry"));
        }
        let (hca, port) = match part.split_once(':') {
            Some((h, p)) => {
                let port: u32 = p
                    .parse()
                    .map_err(|_| format!("{value:?}: port {p:?} of {h} is not a number"))?;
                if port == 0 {
                    return Err(format!("{value:?}: port numbers start at 1"));
                }
                (h, Some(port))
            }
            None => (part, None),
        };
        if !is_device_name(hca) {
            return Err(format!("{value:?}: invalid HCA name {hca:?}"));
        }
        entries.push(IbHcaEntry {
            hca: hca.to_string(),
            port,
        });
    }
    Ok(IbHcaList {
        exclude,
        exact,
        entries,
    })
}

fn is_device_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

fn is_extended_resource_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((domain, name)) => {
            !domain.is_empty()
                && !domain.ends_with("kubernetes.io")
                && !name.is_empty()
                && !name.contains('/')
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        }
        None => false,
    }
}
