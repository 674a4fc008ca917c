//! Rail health as DRA device taints (`resource.k8s.io/v1`, Kubernetes 1.37): which DRA
//! devices a rail consists of, and the `DeviceTaintRule`s a node's verdicts call for.
//! Pure data and functions; the fleet controller moves them in and out of the cluster.
//!
//! The device shapes are the drivers' own:
//! - NICs, `kubernetes-sigs/dranet` (driver `dra.net`, `cmd/dranet/app.go`): one device per
//!   PCI network function named `pci-<domain>-<bus>-<dev>-<fn>` (`pkg/names/names.go`
//!   `NormalizePCIAddress`), attributes `dra.net/pciAddress`, `dra.net/rdmaDevice`,
//!   `dra.net/isSriovVf`, ... (`pkg/apis/attributes.go`, `pkg/inventory/db.go`), and the
//!   standard `resource.kubernetes.io/pcieRoot` / `numaNode`; one pool named after the node.
//! - GPUs, NVIDIA's `k8s-dra-driver-gpu` (driver `gpu.nvidia.com`): one device per GPU named
//!   `gpu-<minor>` (`cmd/gpu-kubelet-plugin/deviceinfo.go` `CanonicalName`), attributes
//!   `type`, `uuid`, `productName`, ... and the standard `resource.kubernetes.io/pciBusID`
//!   and `pcieRoot`; one pool named after the node (`cmd/gpu-kubelet-plugin/driver.go`).
//! - Standard attribute names and formats: `k8s.io/dynamic-resource-allocation`
//!   `deviceattribute/attribute.go` (pciBusID `0000:1b:00.0`, pcieRoot `pci0000:15`).
//!
//! The taint: `k8s.io/api` `resource/v1/types.go` (1.37): `DeviceTaintRule` selects devices
//! by driver, pool and device name and adds one taint (key and value label-shaped, effect
//! `None|NoSchedule|NoExecute`); a device carries at most `DeviceTaintsMaxLength` (16)
//! taints.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::certificate::{Certificate, RailFault, RailResult, RailVerdict};
use crate::node::{FabricState, NodeFabric};

/// The API group and version DeviceTaintRules and ResourceSlices are served at (1.37).
pub const API_VERSION: &str = "resource.k8s.io/v1";
/// Key of every taint railguard puts on a device.
pub const TAINT_KEY: &str = "railguard.io/rail";
/// Label on each rule: the Node it is for (rules of a deleted Node are found by it).
pub const LABEL_NODE: &str = "railguard.io/node";
/// Label on each rule: the rail (`mlx5_0.1`, label-value form of `mlx5_0:1`).
pub const LABEL_RAIL: &str = "railguard.io/rail";
/// Label on each rule: who owns it (the fleet controller deletes only its own rules).
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "railguard-fleet";
/// `DeviceTaintsMaxLength` of resource.k8s.io/v1: taints one device may carry.
pub const MAX_TAINTS_PER_DEVICE: usize = 16;
/// dranet's driver name (`cmd/dranet/app.go`).
pub const DRANET_DRIVER: &str = "dra.net";
/// NVIDIA's GPU DRA driver name.
pub const NVIDIA_GPU_DRIVER: &str = "gpu.nvidia.com";

/// Attribute names read from slices.
pub mod attr {
    /// dranet: the NIC's PCI address (`0000:8a:00.0`).
    pub const DRANET_PCI_ADDRESS: &str = "dra.net/pciAddress";
    /// dranet: the RDMA device of the NIC (`mlx5_0`).
    pub const DRANET_RDMA_DEVICE: &str = "dra.net/rdmaDevice";
    /// dranet: the NIC is an SR-IOV virtual function.
    pub const DRANET_IS_SRIOV_VF: &str = "dra.net/isSriovVf";
    /// Standard: the PCI address of any PCI device.
    pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
    /// Standard: the PCIe root complex (`pci0000:15`), the alignment key of GPU and NIC.
    pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
}

/// `taintEffect` of a profile's `dra` settings.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum DraTaintEffect {
    /// New claims stay off the device; running pods stay.
    #[default]
    NoSchedule,
    /// Also evict the pods of claims allocated the device (kube-controller-manager's
    /// device-taint eviction).
    NoExecute,
    /// Only record: the rule exists and names the reason, nothing is kept off.
    None,
}

impl DraTaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            DraTaintEffect::NoSchedule => "NoSchedule",
            DraTaintEffect::NoExecute => "NoExecute",
            DraTaintEffect::None => "None",
        }
    }
}

/// How a profile's rail health becomes DRA device taints (Kubernetes 1.37 and later).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DraSpec {
    /// Effect of the taints railguard writes.
    #[serde(default)]
    pub taint_effect: DraTaintEffect,
    /// The DRA driver publishing the rails' NICs (dranet's `dra.net`); an empty string
    /// leaves NICs alone.
    #[serde(default = "default_nic_driver")]
    pub nic_driver: String,
    /// The DRA driver publishing the GPUs (NVIDIA's `gpu.nvidia.com`); an empty string
    /// leaves GPUs alone.
    #[serde(default = "default_gpu_driver")]
    pub gpu_driver: String,
    /// Taint every rail of a node whose certification expired.
    #[serde(default = "default_true")]
    pub taint_expired: bool,
    /// Taint every rail of a node pending (certification running, or never certified) for
    /// longer than this, seconds; unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_grace_seconds: Option<u64>,
    /// Taint the rails the fleet controller marks as outliers of the profile's fleet.
    #[serde(default)]
    pub taint_outliers: bool,
    /// Rail counts to ship aligned ResourceClaimTemplates for (the chart's
    /// `railguard-<profile>-<n>-rails`).
    #[serde(default = "default_claim_rails")]
    pub claim_rails: Vec<u32>,
}

fn default_nic_driver() -> String {
    DRANET_DRIVER.to_string()
}
fn default_gpu_driver() -> String {
    NVIDIA_GPU_DRIVER.to_string()
}
fn default_true() -> bool {
    true
}
fn default_claim_rails() -> Vec<u32> {
    vec![8, 4, 2, 1]
}

impl Default for DraSpec {
    fn default() -> Self {
        DraSpec {
            taint_effect: DraTaintEffect::default(),
            nic_driver: default_nic_driver(),
            gpu_driver: default_gpu_driver(),
            taint_expired: true,
            pending_grace_seconds: None,
            taint_outliers: false,
            claim_rails: default_claim_rails(),
        }
    }
}

/// The name of the ResourceClaimTemplate (and of its DeviceClasses' prefix) the chart ships
/// for `rails` aligned GPU+NIC pairs of `profile`.
pub fn claim_template_name(profile: &str, rails: u32) -> String {
    format!("railguard-{profile}-{rails}-rails")
}

/// The DeviceClass of a profile's rail NICs (`railguard-<profile>-nic`) or GPUs (`-gpu`).
pub fn device_class_name(profile: &str, kind: DeviceKind) -> String {
    format!("railguard-{profile}-{}", kind.as_str())
}

// ---------------------------------------------------------------------------------------
// ResourceSlice, as much of resource.k8s.io/v1 as railguard reads.

/// A `resource.k8s.io/v1` ResourceSlice (only what railguard reads; unknown fields ignored).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceSlice {
    #[serde(default)]
    pub metadata: SliceMeta,
    pub spec: ResourceSliceSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SliceMeta {
    #[serde(default)]
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    pub driver: String,
    pub pool: ResourcePool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default)]
    pub devices: Vec<SliceDevice>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePool {
    pub name: String,
    #[serde(default)]
    pub generation: i64,
    #[serde(default)]
    pub resource_slice_count: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SliceDevice {
    pub name: String,
    #[serde(default)]
    pub attributes: BTreeMap<String, DeviceAttribute>,
}

/// One attribute value: exactly one of the fields is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceAttribute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl SliceDevice {
    /// An attribute by its qualified name; an unqualified one in a slice belongs to the
    /// slice's driver (`uuid` of `gpu.nvidia.com` is `gpu.nvidia.com/uuid`).
    pub fn attribute(&self, driver: &str, name: &str) -> Option<&DeviceAttribute> {
        self.attributes.get(name).or_else(|| {
            let (domain, short) = name.split_once('/')?;
            (domain == driver)
                .then(|| self.attributes.get(short))
                .flatten()
        })
    }

    fn string_attr(&self, driver: &str, name: &str) -> Option<&str> {
        self.attribute(driver, name)?.string.as_deref()
    }
}

/// Normalizes a PCI address to the standard attribute's form (`0000:1b:00.0`): NVML writes
/// `00000000:1B:00.0` (an 8-digit domain, upper case), sysfs `0000:1b:00.0`.
pub fn normalize_pci_address(addr: &str) -> String {
    let a = addr.trim().to_ascii_lowercase();
    match a.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 && domain.chars().all(|c| c == '0') => {
            format!("0000:{rest}")
        }
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => a,
    }
}

// ---------------------------------------------------------------------------------------
// Rails to devices.

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Nic,
    Gpu,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Nic => "nic",
            DeviceKind::Gpu => "gpu",
        }
    }
}

/// One DRA device, as a DeviceTaintRule selects it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DeviceRef {
    pub kind: DeviceKind,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// `resource.kubernetes.io/pcieRoot`, when the driver publishes it.
    pub pcie_root: Option<String>,
}

/// The DRA devices of one rail: its HCA's NIC device (and the devices of its SR-IOV VFs)
/// and the GPU(s) whose preferred HCA it is.
#[derive(Clone, Debug, PartialEq)]
pub struct RailDevices {
    /// `hca:port`.
    pub rail: String,
    pub nics: Vec<DeviceRef>,
    pub gpus: Vec<DeviceRef>,
}

/// The slices to read of one node: node-local slices of `driver`, and of each pool only the
/// newest generation (the scheduler ignores older ones: `k8s.io/dynamic-resource-allocation`
/// `structured/pools.go` keeps the slices of the highest `pool.generation`).
fn current_slices<'a>(
    slices: &[&'a ResourceSlice],
    node: &str,
    driver: &str,
) -> Vec<&'a ResourceSlice> {
    let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
    let ours: Vec<&ResourceSlice> = slices
        .iter()
        .copied()
        .filter(|s| s.spec.driver == driver && s.spec.node_name.as_deref() == Some(node))
        .collect();
    for s in &ours {
        let g = newest.entry(s.spec.pool.name.as_str()).or_insert(i64::MIN);
        *g = (*g).max(s.spec.pool.generation);
    }
    ours.into_iter()
        .filter(|s| newest.get(s.spec.pool.name.as_str()) == Some(&s.spec.pool.generation))
        .collect()
}

fn device_ref(kind: DeviceKind, slice: &ResourceSlice, d: &SliceDevice) -> DeviceRef {
    DeviceRef {
        kind,
        driver: slice.spec.driver.clone(),
        pool: slice.spec.pool.name.clone(),
        device: d.name.clone(),
        pcie_root: d
            .string_attr(&slice.spec.driver, attr::PCIE_ROOT)
            .map(str::to_string),
    }
}

/// Maps each rail of `cert` to its DRA devices among `slices` (all slices of the cluster or
/// of the node; only the node's, of the drivers `spec` names, are read).
///
/// A NIC device belongs to a rail when its `dra.net/pciAddress` (or standard `pciBusID`) is
/// the rail's HCA PCI function or one of its SR-IOV VFs; a certificate without PCI addresses
/// (older probers) falls back to `dra.net/rdmaDevice` = the rail's HCA. A GPU device belongs
/// to a rail when its `pciBusID` is that of a GPU whose preferred HCA is the rail's.
pub fn rail_devices(
    node: &str,
    cert: &Certificate,
    slices: &[&ResourceSlice],
    spec: &DraSpec,
) -> Vec<RailDevices> {
    let nic_slices = if spec.nic_driver.is_empty() {
        Vec::new()
    } else {
        current_slices(slices, node, &spec.nic_driver)
    };
    let gpu_slices = if spec.gpu_driver.is_empty() {
        Vec::new()
    } else {
        current_slices(slices, node, &spec.gpu_driver)
    };
    cert.rails
        .iter()
        .map(|rail| {
            let functions: BTreeSet<String> = rail
                .pci_address
                .iter()
                .chain(rail.sriov_vfs.iter())
                .map(|a| normalize_pci_address(a))
                .collect();
            let mut nics = Vec::new();
            for s in &nic_slices {
                for d in &s.spec.devices {
                    let addr = d
                        .string_attr(&s.spec.driver, attr::DRANET_PCI_ADDRESS)
                        .or_else(|| d.string_attr(&s.spec.driver, attr::PCI_BUS_ID))
                        .map(normalize_pci_address);
                    let matches = if functions.is_empty() {
                        d.string_attr(&s.spec.driver, attr::DRANET_RDMA_DEVICE)
                            == Some(rail.hca.as_str())
                    } else {
                        addr.is_some_and(|a| functions.contains(&a))
                    };
                    if matches {
                        nics.push(device_ref(DeviceKind::Nic, s, d));
                    }
                }
            }
            let gpu_addrs: BTreeSet<String> = cert
                .gpus
                .iter()
                .filter(|g| g.preferred_hca == rail.hca && g.port.is_none_or(|p| p == rail.port))
                .filter_map(|g| g.pci_bus_id.as_deref().map(normalize_pci_address))
                .collect();
            let mut gpus = Vec::new();
            for s in &gpu_slices {
                for d in &s.spec.devices {
                    let addr = d
                        .string_attr(&s.spec.driver, attr::PCI_BUS_ID)
                        .map(normalize_pci_address);
                    if addr.is_some_and(|a| gpu_addrs.contains(&a)) {
                        gpus.push(device_ref(DeviceKind::Gpu, s, d));
                    }
                }
            }
            nics.sort();
            gpus.sort();
            RailDevices {
                rail: rail.id(),
                nics,
                gpus,
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Verdicts to taints.

/// Why a rail's devices are tainted: the taint's value (a label value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaintReason {
    /// A failed rail, by its first fault (`link-down`, `gpudirect`, ...).
    Failed(RailFault),
    /// A rail below its own history (regression).
    Regressed,
    /// The node's certification expired.
    Expired,
    /// The node has been pending longer than the profile's grace.
    Pending,
    /// The fleet controller marks the rail an outlier of its fleet.
    Outlier,
}

impl TaintReason {
    pub fn value(self) -> &'static str {
        match self {
            TaintReason::Failed(f) => f.as_str(),
            TaintReason::Regressed => "regressed",
            TaintReason::Expired => "expired",
            TaintReason::Pending => "pending",
            TaintReason::Outlier => "outlier",
        }
    }

    /// Whether the GPU is tainted along with the NIC: only when the fault is on the
    /// GPU↔NIC path (GPU-memory registration or bandwidth, the far-GPU comparison, a
    /// PCIe link below its capability); a node-wide reason covers every device of the rail.
    pub fn taints_gpu(self) -> bool {
        match self {
            TaintReason::Failed(f) => f.on_gpu_path(),
            TaintReason::Expired | TaintReason::Pending => true,
            TaintReason::Regressed | TaintReason::Outlier => false,
        }
    }
}

/// One DeviceTaintRule railguard wants.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WantedRule {
    pub name: String,
    pub node: String,
    pub rail: String,
    pub device: DeviceRef,
    /// The taint's value ([`TaintReason::value`]).
    pub value: String,
    pub effect: DraTaintEffect,
}

/// The reason each rail of a node is tainted for, if any, at `now`.
/// `outlier_rails`: rails (`hca:port`) the fleet analysis marks as outliers now.
pub fn rail_taint_reasons(
    node: &NodeFabric,
    spec: &DraSpec,
    outlier_rails: &BTreeSet<String>,
    now: Timestamp,
) -> BTreeMap<String, TaintReason> {
    let mut out = BTreeMap::new();
    let Some(cert) = node.state.certificate() else {
        return out;
    };
    let node_wide = match &node.state {
        FabricState::Expired { .. } if spec.taint_expired => Some(TaintReason::Expired),
        FabricState::Pending { previous } => {
            let since = previous.as_ref().map(|p| {
                if p.is_expired(now) {
                    p.expires_at
                } else {
                    p.issued_at
                }
            });
            match (spec.pending_grace_seconds, since) {
                (_, Some(_)) if previous.as_ref().is_some_and(|p| p.is_expired(now)) => {
                    // Pending after the expiry: expired until a run passes.
                    spec.taint_expired.then_some(TaintReason::Expired)
                }
                (Some(grace), Some(since))
                    if now.as_second() - since.as_second() > grace as i64 =>
                {
                    Some(TaintReason::Pending)
                }
                _ => None,
            }
        }
        _ => None,
    };
    // A pending node keeps its previous certificate's rail verdicts meanwhile.
    for rail in &cert.rails {
        let id = rail.id();
        let own = match rail.verdict {
            RailVerdict::Failed => Some(TaintReason::Failed(first_fault(rail))),
            RailVerdict::Degraded => Some(TaintReason::Regressed),
            RailVerdict::Healthy => None,
        };
        let outlier =
            (spec.taint_outliers && outlier_rails.contains(&id)).then_some(TaintReason::Outlier);
        if let Some(r) = own.or(node_wide).or(outlier) {
            out.insert(id, r);
        }
    }
    out
}

fn first_fault(rail: &RailResult) -> RailFault {
    rail.faults.first().copied().unwrap_or(RailFault::Failed)
}

/// The DeviceTaintRules a node calls for: one per tainted device (so no device ever
/// carries more than one railguard taint, far below [`MAX_TAINTS_PER_DEVICE`]).
pub fn wanted_rules(
    node: &str,
    devices: &[RailDevices],
    reasons: &BTreeMap<String, TaintReason>,
    effect: DraTaintEffect,
) -> Vec<WantedRule> {
    let mut out: BTreeMap<String, WantedRule> = BTreeMap::new();
    for rd in devices {
        let Some(reason) = reasons.get(&rd.rail) else {
            continue;
        };
        let gpus = if reason.taints_gpu() {
            &rd.gpus[..]
        } else {
            &[]
        };
        for d in rd.nics.iter().chain(gpus) {
            let name = rule_name(node, d);
            // Two rails sharing a GPU: the first (by rail order) names it.
            out.entry(name.clone()).or_insert_with(|| WantedRule {
                name,
                node: node.to_string(),
                rail: rd.rail.clone(),
                device: d.clone(),
                value: reason.value().to_string(),
                effect,
            });
        }
    }
    out.into_values().collect()
}

/// The rule's name: `railguard-<node>-<device>-<hash>`, a DNS subdomain of at most 253
/// characters, the same for the same device every time (so a rule is updated in place).
/// The hash of driver, pool and device keeps two drivers' same-named devices apart.
pub fn rule_name(node: &str, d: &DeviceRef) -> String {
    let digest = Sha256::digest(format!("{}\0{}\0{}", d.driver, d.pool, d.device).as_bytes());
    let hash = hex::encode(&digest[..4]);
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                let c = c.to_ascii_lowercase();
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    };
    let mut stem = format!("railguard-{}-{}", clean(node), clean(&d.device));
    stem.truncate(253 - 1 - hash.len());
    let stem = stem.trim_end_matches(['-', '.']);
    format!("{stem}-{hash}")
}

/// The label-value form of a rail id (`mlx5_0:1` → `mlx5_0.1`).
pub fn rail_label(rail: &str) -> String {
    rail.replace(':', ".")
}

/// The rule as the API takes it (for server-side apply).
pub fn rule_object(rule: &WantedRule) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule.name,
            "labels": {
                LABEL_MANAGED_BY: MANAGED_BY,
                LABEL_NODE: rule.node,
                LABEL_RAIL: rail_label(&rule.rail),
            },
        },
        "spec": {
            "deviceSelector": {
                "driver": rule.device.driver,
                "pool": rule.device.pool,
                "device": rule.device.device,
            },
            "taint": {
                "key": TAINT_KEY,
                "value": rule.value,
                "effect": rule.effect.as_str(),
            },
        },
    })
}

/// A DeviceTaintRule as read back: what [`plan_rules`] compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingRule {
    pub name: String,
    pub driver: Option<String>,
    pub pool: Option<String>,
    pub device: Option<String>,
    pub key: String,
    pub value: String,
    pub effect: String,
}

impl ExistingRule {
    fn matches(&self, w: &WantedRule) -> bool {
        self.driver.as_deref() == Some(w.device.driver.as_str())
            && self.pool.as_deref() == Some(w.device.pool.as_str())
            && self.device.as_deref() == Some(w.device.device.as_str())
            && self.key == TAINT_KEY
            && self.value == w.value
            && self.effect == w.effect.as_str()
    }

    /// Reads a rule object (`resource.k8s.io/v1` JSON); `None` when it has no name.
    pub fn from_object(obj: &serde_json::Value) -> Option<ExistingRule> {
        let s = |p: &str| obj.pointer(p).and_then(|v| v.as_str()).map(str::to_string);
        Some(ExistingRule {
            name: s("/metadata/name")?,
            driver: s("/spec/deviceSelector/driver"),
            pool: s("/spec/deviceSelector/pool"),
            device: s("/spec/deviceSelector/device"),
            key: s("/spec/taint/key").unwrap_or_default(),
            value: s("/spec/taint/value").unwrap_or_default(),
            effect: s("/spec/taint/effect").unwrap_or_default(),
        })
    }
}

/// What to write: rules to apply (new or changed) and names to delete (railguard's rules
/// nothing wants any more: the rail passed, the node or its slices are gone, the profile
/// changed).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RulePlan {
    pub apply: Vec<WantedRule>,
    pub delete: Vec<String>,
}

pub fn plan_rules(wanted: &[WantedRule], existing: &[ExistingRule]) -> RulePlan {
    let by_name: BTreeMap<&str, &ExistingRule> =
        existing.iter().map(|e| (e.name.as_str(), e)).collect();
    let wanted_names: BTreeSet<&str> = wanted.iter().map(|w| w.name.as_str()).collect();
    RulePlan {
        apply: wanted
            .iter()
            .filter(|w| !by_name.get(w.name.as_str()).is_some_and(|e| e.matches(w)))
            .cloned()
            .collect(),
        delete: existing
            .iter()
            .filter(|e| !wanted_names.contains(e.name.as_str()))
            .map(|e| e.name.clone())
            .collect(),
    }
}
