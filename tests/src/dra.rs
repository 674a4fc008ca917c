//! Dynamic Resource Allocation (`resource.k8s.io/v1`, Kubernetes 1.37) for the end-to-end
//! tests: the ResourceSlices of a simulated GPU node exactly as the two DRA drivers publish
//! them, the DeviceClasses and aligned-rail ResourceClaimTemplates railguard's chart ships,
//! pods that use them, and what the scheduler allocated them.
//!
//! Shapes, and where each comes from:
//! - NICs: kubernetes-sigs/dranet (driver `dra.net`, `cmd/dranet/app.go`). One device per
//!   PCI network function (PCI class `02`, `pkg/inventory/db.go` `isNetworkDevice`), named
//!   by `pkg/names/names.go` `NormalizePCIAddress` (`0000:1d:00.0` -> `pci-0000-1d-00-0`),
//!   with `dra.net/pciAddress` (`discoverPCIDevices`), the link's `ifName`, `mac`, `mtu`,
//!   `encapsulation`, `alias`, `state`, `type`, `ebpf`, `sriov`, `virtual`
//!   (`addLinkAttributes`), `dra.net/rdma` and `dra.net/rdmaDevice` (`addRDMAAttributes`),
//!   `dra.net/numaNode`, `pciVendor`, `pciDevice` and the standard
//!   `resource.kubernetes.io/numaNode` and `pcieRoot` (`addPCIAttributes`); attribute names
//!   from `pkg/apis/attributes.go`; devices sorted by name (`GetResources`' caller). One
//!   slice in one pool named after the node (`pkg/driver/dra_hooks.go` `PublishResources`).
//! - GPUs: NVIDIA/k8s-dra-driver-gpu (driver `gpu.nvidia.com`, `cmd/gpu-kubelet-plugin/
//!   main.go`), the non-DynamicMIG path of `driver.go` `publishResources`: one slice with
//!   every GPU in one pool named after the node. Device `gpu-<minor>` (`deviceinfo.go`
//!   `CanonicalName`), attributes of `GpuInfo.Attributes` (`type: gpu`, `uuid`,
//!   `productName`, `brand`, `architecture`, versions `cudaComputeCapability`,
//!   `driverVersion`, `cudaDriverVersion`, the standard `pciBusID` and `pcieRoot`),
//!   capacity `memory` (`partitions.go` `fullGpuCapacity`).
//! - Slices: the kubelet plugin helper (k8s.io/dynamic-resource-allocation v0.37.2,
//!   `kubeletplugin/draplugin.go` `PublishResources`, `resourceslice/
//!   resourceslicecontroller.go`) creates them with `generateName`
//!   `<index, 5 hex digits>-<driver>-<node>-`, the Node as controlling owner, `nodeName`
//!   set, pool generation 1 on the first publish and `resourceSliceCount` 1.
//! - Standard attributes: `deviceattribute/attribute.go` and `pci_linux.go` of the same
//!   module: `pciBusID` `0000:1b:00.0`; `pcieRoot` is the first directory under
//!   `/sys/devices` of the device's `/sys/bus/pci/devices/<addr>` link ([`pcie_root`]).
//! - The API types: k8s.io/api v0.37.2 `resource/v1/types.go`.
//!
//! k8s-openapi is built for 1.33 here, which has no `resource.k8s.io/v1`: every DRA object
//! goes through [`kube::core::DynamicObject`] and [`ApiResource`]s of [`resource`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::Client;
use railguard_api::dra as api_dra;
use railguard_api::Certificate;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::{eventually, NotYet, HARNESS_FIELD_MANAGER};

/// The API group of DRA.
pub const GROUP: &str = "resource.k8s.io";
/// The version the tests use (GA, and the only one 1.37 serves).
pub const VERSION: &str = "v1";

/// The `ApiResource` of a `resource.k8s.io/v1` kind: `ResourceSlice`, `ResourceClaim`,
/// `ResourceClaimTemplate`, `DeviceClass` or `DeviceTaintRule`.
pub fn resource(kind: &str) -> ApiResource {
    let plural = match kind {
        "DeviceClass" => "deviceclasses".to_string(),
        k => format!("{}s", k.to_ascii_lowercase()),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), &plural)
}

/// The cluster's ResourceSlices.
pub fn slices(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &resource("ResourceSlice"))
}

/// The cluster's DeviceTaintRules.
pub fn taint_rules(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &resource("DeviceTaintRule"))
}

/// The ResourceClaims of `namespace`.
pub fn claims(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &resource("ResourceClaim"))
}

// ---------------------------------------------------------------------------------------
// A node's devices.

/// One NIC (PCI network function) as dranet sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    /// `0000:1d:00.0`.
    pub pci_address: String,
    /// The RDMA device on it (`mlx5_0`), if any.
    pub rdma_device: Option<String>,
    /// Its netdev (`ibp24s0`).
    pub if_name: String,
    /// `pci0000:15`; `None` where the root could not be found (dranet then leaves it out).
    pub pcie_root: Option<String>,
    /// NUMA node; `None` for none (sysfs `-1`: the standard attribute is left out).
    pub numa: Option<i64>,
    /// PCI device id (`0x1021`, ConnectX-7), for `dra.net/pciDevice`.
    pub pci_device_id: Option<u16>,
    /// An SR-IOV virtual function (`dra.net/isSriovVf`).
    pub is_vf: bool,
}

/// One GPU as NVIDIA's DRA driver sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// The device minor (`/dev/nvidia<minor>`): the device is `gpu-<minor>`.
    pub minor: u32,
    /// `0000:1a:00.0`.
    pub pci_bus_id: String,
    /// `pci0000:15`.
    pub pcie_root: Option<String>,
}

/// A rail's aligned pair: its NIC and the GPU that prefers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailPair {
    /// `hca:port` of the rail.
    pub rail: String,
    pub gpu: Gpu,
    pub nic: Nic,
}

impl RailPair {
    /// A pair from its facts: GPU minor and PCI bus id, NIC PCI address, RDMA device,
    /// netdev, the PCIe root both hang off and the NUMA node.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rail: &str,
        gpu_minor: u32,
        gpu_pci_bus_id: &str,
        nic_pci_address: &str,
        rdma_device: &str,
        if_name: &str,
        pcie_root: &str,
        numa: i64,
    ) -> RailPair {
        RailPair {
            rail: rail.to_string(),
            gpu: Gpu {
                minor: gpu_minor,
                pci_bus_id: api_dra::normalize_pci_address(gpu_pci_bus_id),
                pcie_root: Some(pcie_root.to_string()),
            },
            nic: Nic {
                pci_address: api_dra::normalize_pci_address(nic_pci_address),
                rdma_device: Some(rdma_device.to_string()),
                if_name: if_name.to_string(),
                pcie_root: Some(pcie_root.to_string()),
                numa: Some(numa),
                pci_device_id: Some(0x1021),
                is_vf: false,
            },
        }
    }
}

/// What the GPU driver reports about every GPU of a node (NVML's answers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuModel {
    pub product_name: String,
    pub brand: String,
    pub architecture: String,
    pub cuda_compute_capability: String,
    pub driver_version: String,
    pub cuda_driver_version: String,
    /// `memory` capacity (`81559Mi`).
    pub memory: String,
}

impl GpuModel {
    /// An H100 SXM (the dgx-h100 simulated model's driver 550.54.15, CUDA 12.4).
    pub fn h100() -> GpuModel {
        GpuModel {
            product_name: "NVIDIA H100 80GB HBM3".into(),
            brand: "Nvidia".into(),
            architecture: "Hopper".into(),
            cuda_compute_capability: "9.0.0".into(),
            driver_version: "550.54.15".into(),
            cuda_driver_version: "12.4.0".into(),
            memory: "81559Mi".into(),
        }
    }
}

/// The DRA-visible devices of one node: its rails' GPU+NIC pairs and its other NICs
/// (storage, management), which dranet publishes too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLayout {
    pub node: String,
    pub pairs: Vec<RailPair>,
    pub other_nics: Vec<Nic>,
    pub gpu_model: GpuModel,
}

impl NodeLayout {
    /// A layout of `pairs` only, H100 GPUs.
    pub fn new(node: &str, pairs: Vec<RailPair>) -> NodeLayout {
        NodeLayout {
            node: node.to_string(),
            pairs,
            other_nics: Vec::new(),
            gpu_model: GpuModel::h100(),
        }
    }

    /// The same devices on another node (slices are per node; the hardware is the same).
    pub fn for_node(&self, node: &str) -> NodeLayout {
        NodeLayout {
            node: node.to_string(),
            ..self.clone()
        }
    }

    /// The pair of rail `rail` (`mlx5_3:1`).
    pub fn pair(&self, rail: &str) -> Option<&RailPair> {
        self.pairs.iter().find(|p| p.rail == rail)
    }

    /// The dranet device name of a NIC, the NVIDIA one of a GPU.
    pub fn nic_device(nic: &Nic) -> String {
        dranet_device_name(&nic.pci_address)
    }

    /// `gpu-<minor>`.
    pub fn gpu_device(gpu: &Gpu) -> String {
        format!("gpu-{}", gpu.minor)
    }

    /// The PCIe root of device `device` of `driver` on this node.
    pub fn pcie_root_of(&self, driver: &str, device: &str) -> Option<String> {
        if driver == api_dra::DRANET_DRIVER {
            self.pairs
                .iter()
                .map(|p| &p.nic)
                .chain(&self.other_nics)
                .find(|n| Self::nic_device(n) == device)
                .and_then(|n| n.pcie_root.clone())
        } else {
            self.pairs
                .iter()
                .find(|p| Self::gpu_device(&p.gpu) == device)
                .and_then(|p| p.gpu.pcie_root.clone())
        }
    }
}

/// dranet's device name of a PCI address (`pkg/names/names.go` `NormalizePCIAddress`:
/// `pci-` and the address with `:` and `.` as `-`).
pub fn dranet_device_name(pci_address: &str) -> String {
    format!("pci-{}", pci_address.replace([':', '.'], "-"))
}

/// Where a layout's per-device facts come from: a sysfs tree ([`SysfsTree`], the real
/// rules) or given values ([`GivenTopology`]).
pub trait PciTopology {
    /// `resource.kubernetes.io/pcieRoot` of a PCI device.
    fn pcie_root(&self, pci_address: &str) -> Result<String>;
    /// Its NUMA node (`None`: no affinity).
    fn numa(&self, pci_address: &str) -> Option<i64>;
    /// The netdev of a NIC.
    fn if_name(&self, pci_address: &str) -> Option<String>;
    /// The PCI device id.
    fn device_id(&self, pci_address: &str) -> Option<u16>;
}

/// The `pcieRoot` rule of k8s.io/dynamic-resource-allocation v0.37.2
/// (`deviceattribute/pci_linux.go` `resolvePCIeRoot`): read the link
/// `<sysfs>/bus/pci/devices/<addr>`, which must resolve to `devices/pci<...>/.../<addr>`;
/// the root is its first component under `devices/` (`pci0000:15`). `sysfs` is the
/// directory mounted at `/sys`.
pub fn pcie_root(sysfs: &Path, pci_address: &str) -> Result<String> {
    let link = Path::new("bus/pci/devices").join(pci_address);
    let target = std::fs::read_link(sysfs.join(&link))
        .with_context(|| format!("failed to read symlink for PCI Bus ID {}", link.display()))?;
    // Relative to the link's directory, cleaned lexically (filepath.Clean).
    let joined = if target.is_absolute() {
        target.clone()
    } else {
        link.parent().unwrap_or(Path::new("")).join(&target)
    };
    let mut parts: Vec<String> = Vec::new();
    for c in joined.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    let ok = parts.first().map(String::as_str) == Some("devices")
        && parts.get(1).is_some_and(|p| p.starts_with("pci"))
        && parts.last().map(String::as_str) == Some(pci_address);
    if !ok {
        bail!(
            "symlink target for PCI Bus ID {pci_address} is invalid: {}",
            target.display()
        );
    }
    Ok(parts[1].clone())
}

/// A sysfs tree (the simulated one `railguard_sim::write_sysfs` writes, or a real `/sys`).
#[derive(Clone, Debug)]
pub struct SysfsTree {
    /// The directory that is `/sys`.
    pub sys: PathBuf,
}

impl SysfsTree {
    /// The tree under `root` (`root/sys`, as `write_sysfs` lays it out).
    pub fn under(root: &Path) -> SysfsTree {
        SysfsTree {
            sys: root.join("sys"),
        }
    }

    fn device_dir(&self, pci_address: &str) -> PathBuf {
        self.sys.join("bus/pci/devices").join(pci_address)
    }

    fn read(&self, pci_address: &str, file: &str) -> Option<String> {
        std::fs::read_to_string(self.device_dir(pci_address).join(file))
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn first_entry(&self, pci_address: &str, dir: &str) -> Option<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.device_dir(pci_address).join(dir))
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names.into_iter().next()
    }

    /// Every PCI network function (class `0x02....`, dranet's `isNetworkDevice`), by
    /// address.
    pub fn network_functions(&self) -> Result<Vec<String>> {
        let dir = self.sys.join("bus/pci/devices");
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let name = e?.file_name().to_string_lossy().into_owned();
            if self
                .read(&name, "class")
                .is_some_and(|c| c.starts_with("0x02"))
            {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    /// The NIC at `pci_address`, as dranet reads it.
    pub fn nic(&self, pci_address: &str) -> Result<Nic> {
        Ok(Nic {
            pci_address: pci_address.to_string(),
            rdma_device: self.first_entry(pci_address, "infiniband"),
            if_name: self.if_name(pci_address).unwrap_or_default(),
            pcie_root: Some(self.pcie_root(pci_address)?),
            numa: self.numa(pci_address),
            pci_device_id: self.device_id(pci_address),
            is_vf: self.device_dir(pci_address).join("physfn").exists(),
        })
    }
}

impl PciTopology for SysfsTree {
    fn pcie_root(&self, pci_address: &str) -> Result<String> {
        pcie_root(&self.sys, pci_address)
    }
    fn numa(&self, pci_address: &str) -> Option<i64> {
        self.read(pci_address, "numa_node")?
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
    }
    fn if_name(&self, pci_address: &str) -> Option<String> {
        self.first_entry(pci_address, "net")
    }
    fn device_id(&self, pci_address: &str) -> Option<u16> {
        let id = self.read(pci_address, "device")?;
        u16::from_str_radix(id.trim_start_matches("0x"), 16).ok()
    }
}

/// Given facts: the PCIe root of each PCI address (missing: an error), NUMA nodes, and
/// netdevs named as udev names an InfiniBand port by its slot (`ibp<bus>s<slot>`).
#[derive(Clone, Debug, Default)]
pub struct GivenTopology {
    pub roots: BTreeMap<String, String>,
    pub numa: BTreeMap<String, i64>,
}

impl PciTopology for GivenTopology {
    fn pcie_root(&self, pci_address: &str) -> Result<String> {
        self.roots
            .get(&api_dra::normalize_pci_address(pci_address))
            .cloned()
            .with_context(|| format!("no PCIe root given for {pci_address}"))
    }
    fn numa(&self, pci_address: &str) -> Option<i64> {
        self.numa
            .get(&api_dra::normalize_pci_address(pci_address))
            .copied()
    }
    fn if_name(&self, pci_address: &str) -> Option<String> {
        let a = api_dra::normalize_pci_address(pci_address);
        let mut it = a.split([':', '.']);
        let (_, bus, slot) = (it.next()?, it.next()?, it.next()?);
        Some(format!(
            "ibp{}s{}",
            u32::from_str_radix(bus, 16).ok()?,
            u32::from_str_radix(slot, 16).ok()?
        ))
    }
    fn device_id(&self, _: &str) -> Option<u16> {
        Some(0x1021)
    }
}

/// The layout of `node` as its certificate describes it: per rail with a PCI address, its
/// NIC and the GPU(s) whose preferred HCA (and port) it is; a GPU's minor is its index.
/// PCIe roots, NUMA nodes and netdevs come from `topo`. A rail without a PCI address or
/// without a GPU is left out (nothing to align).
pub fn layout_from_certificate(
    node: &str,
    cert: &Certificate,
    topo: &dyn PciTopology,
) -> Result<NodeLayout> {
    let mut pairs = Vec::new();
    for rail in &cert.rails {
        let Some(nic_addr) = rail.pci_address.as_deref() else {
            continue;
        };
        let nic_addr = api_dra::normalize_pci_address(nic_addr);
        for g in cert
            .gpus
            .iter()
            .filter(|g| g.preferred_hca == rail.hca && g.port.is_none_or(|p| p == rail.port))
        {
            let Some(bus) = g.pci_bus_id.as_deref() else {
                continue;
            };
            let bus = api_dra::normalize_pci_address(bus);
            pairs.push(RailPair {
                rail: rail.id(),
                gpu: Gpu {
                    minor: g.gpu,
                    pcie_root: Some(topo.pcie_root(&bus)?),
                    pci_bus_id: bus,
                },
                nic: Nic {
                    rdma_device: Some(rail.hca.clone()),
                    if_name: topo.if_name(&nic_addr).unwrap_or_default(),
                    pcie_root: Some(topo.pcie_root(&nic_addr)?),
                    numa: topo.numa(&nic_addr),
                    pci_device_id: topo.device_id(&nic_addr),
                    is_vf: false,
                    pci_address: nic_addr.clone(),
                },
            });
        }
    }
    Ok(NodeLayout::new(node, pairs))
}

/// [`layout_from_certificate`] over a sysfs tree, plus every other network function of
/// the tree (storage and management NICs), which dranet publishes as well.
pub fn layout_from_sysfs(node: &str, cert: &Certificate, tree: &SysfsTree) -> Result<NodeLayout> {
    let mut layout = layout_from_certificate(node, cert, tree)?;
    for addr in tree.network_functions()? {
        if layout.pairs.iter().all(|p| p.nic.pci_address != addr) {
            layout.other_nics.push(tree.nic(&addr)?);
        }
    }
    Ok(layout)
}

// ---------------------------------------------------------------------------------------
// The slices.

fn s(v: &str) -> Value {
    json!({ "string": v })
}

fn pci_device_name(id: u16) -> Option<&'static str> {
    // pci.ids names ghw reports (`dra.net/pciDevice`).
    match id {
        0x1021 => Some("MT2910 Family [ConnectX-7]"),
        0x101b => Some("MT28908 Family [ConnectX-6]"),
        0x101d => Some("MT2892 Family [ConnectX-6 Dx]"),
        _ => None,
    }
}

/// A stable, made-up hardware address: 20 bytes for an IPoIB link, 6 for Ethernet.
fn mac(node: &str, pci: &str, ib: bool) -> String {
    let digest = Sha256::digest(format!("{node}/{pci}").as_bytes());
    let bytes: Vec<u8> = if ib {
        // QPN, then the port GID (fe80::/64 and the port GUID).
        let mut b = vec![0x00, 0x00, 0x10, 0x49, 0xfe, 0x80, 0, 0, 0, 0, 0, 0];
        b.extend_from_slice(&digest[..8]);
        b
    } else {
        let mut b = digest[..6].to_vec();
        b[0] = (b[0] & 0xfe) | 0x02;
        b
    };
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn dranet_device(node: &str, nic: &Nic) -> Value {
    let ib = nic.if_name.starts_with("ib");
    let mut attrs = serde_json::Map::new();
    let mut put = |k: &str, v: Value| {
        attrs.insert(k.to_string(), v);
    };
    put("dra.net/pciAddress", s(&nic.pci_address));
    put("dra.net/ifName", s(&nic.if_name));
    put("dra.net/mac", s(&mac(node, &nic.pci_address, ib)));
    put(
        "dra.net/mtu",
        json!({ "int": if ib { 4092 } else { 9000 } }),
    );
    put(
        "dra.net/encapsulation",
        s(if ib { "infiniband" } else { "ether" }),
    );
    put("dra.net/alias", s(""));
    put("dra.net/state", s("up"));
    put("dra.net/type", s(if ib { "ipoib" } else { "device" }));
    put("dra.net/ebpf", json!({ "bool": false }));
    put("dra.net/sriov", json!({ "bool": false }));
    if nic.is_vf {
        put("dra.net/isSriovVf", json!({ "bool": true }));
    }
    put("dra.net/virtual", json!({ "bool": false }));
    if let Some(n) = nic.numa {
        put("resource.kubernetes.io/numaNode", json!({ "int": n }));
        put("dra.net/numaNode", json!({ "int": n }));
    }
    if let Some(root) = &nic.pcie_root {
        put(api_dra::attr::PCIE_ROOT, s(root));
    }
    put("dra.net/pciVendor", s("Mellanox Technologies"));
    if let Some(name) = nic.pci_device_id.and_then(pci_device_name) {
        put("dra.net/pciDevice", s(name));
    }
    put("dra.net/rdma", json!({ "bool": nic.rdma_device.is_some() }));
    if let Some(rdma) = &nic.rdma_device {
        put(api_dra::attr::DRANET_RDMA_DEVICE, s(rdma));
    }
    json!({ "name": dranet_device_name(&nic.pci_address), "attributes": attrs })
}

fn gpu_uuid(node: &str, gpu: &Gpu) -> String {
    let d = hex_of(&Sha256::digest(format!("{node}/{}", gpu.pci_bus_id).as_bytes())[..16]);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &d[0..8],
        &d[8..12],
        &d[12..16],
        &d[16..20],
        &d[20..32]
    )
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn nvidia_device(node: &str, m: &GpuModel, gpu: &Gpu) -> Value {
    let mut attrs = json!({
        "type": s("gpu"),
        "uuid": s(&gpu_uuid(node, gpu)),
        "productName": s(&m.product_name),
        "brand": s(&m.brand),
        "architecture": s(&m.architecture),
        "cudaComputeCapability": { "version": m.cuda_compute_capability },
        "driverVersion": { "version": m.driver_version },
        "cudaDriverVersion": { "version": m.cuda_driver_version },
        (api_dra::attr::PCI_BUS_ID): s(&gpu.pci_bus_id),
    });
    if let Some(root) = &gpu.pcie_root {
        attrs[api_dra::attr::PCIE_ROOT] = s(root);
    }
    json!({
        "name": NodeLayout::gpu_device(gpu),
        "attributes": attrs,
        "capacity": { "memory": { "value": m.memory } },
    })
}

fn slice_object(driver: &str, node: &str, node_uid: &str, devices: Vec<Value>) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "ResourceSlice",
        "metadata": {
            // resourceslicecontroller.go: <index as 5 hex digits>-<driver>-<owner name>-
            "generateName": format!("00000-{driver}-{node}-"),
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                "controller": true,
            }],
        },
        "spec": {
            "driver": driver,
            "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 },
            "nodeName": node,
            "devices": devices,
        },
    })
}

/// dranet's slice of the node: every NIC (the pairs' and the others), sorted by device
/// name.
pub fn dranet_slice(layout: &NodeLayout, node_uid: &str) -> Value {
    let mut nics: Vec<&Nic> = layout
        .pairs
        .iter()
        .map(|p| &p.nic)
        .chain(&layout.other_nics)
        .collect();
    nics.sort_by_key(|n| dranet_device_name(&n.pci_address));
    nics.dedup_by_key(|n| n.pci_address.clone());
    let devices = nics
        .into_iter()
        .map(|n| dranet_device(&layout.node, n))
        .collect();
    slice_object(api_dra::DRANET_DRIVER, &layout.node, node_uid, devices)
}

/// NVIDIA's slice of the node: every GPU, by minor.
pub fn nvidia_slice(layout: &NodeLayout, node_uid: &str) -> Value {
    let mut gpus: Vec<&Gpu> = layout.pairs.iter().map(|p| &p.gpu).collect();
    gpus.sort_by_key(|g| g.minor);
    gpus.dedup_by_key(|g| g.minor);
    let devices = gpus
        .into_iter()
        .map(|g| nvidia_device(&layout.node, &layout.gpu_model, g))
        .collect();
    slice_object(api_dra::NVIDIA_GPU_DRIVER, &layout.node, node_uid, devices)
}

/// Creates the node's two slices as the drivers' kubelet plugins do (the Node must exist:
/// it owns them); their names.
pub async fn publish_slices(client: &Client, layout: &NodeLayout) -> Result<Vec<String>> {
    let node = Api::<Node>::all(client.clone())
        .get(&layout.node)
        .await
        .with_context(|| format!("Node {}", layout.node))?;
    let uid = node.metadata.uid.unwrap_or_default();
    let mut names = Vec::new();
    for obj in [dranet_slice(layout, &uid), nvidia_slice(layout, &uid)] {
        let created = slices(client)
            .create(&PostParams::default(), &serde_json::from_value(obj)?)
            .await
            .with_context(|| format!("creating a ResourceSlice of {}", layout.node))?;
        names.push(created.metadata.name.unwrap_or_default());
    }
    Ok(names)
}

/// The cluster's ResourceSlices in railguard's model (what the fleet controller reads).
pub async fn read_slices(client: &Client) -> Result<Vec<api_dra::ResourceSlice>> {
    slices(client)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|o| Ok(serde_json::from_value(serde_json::to_value(o)?)?))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Classes, templates, pods.

/// The version `helm template --kube-version` gets for the modern control plane.
pub const CHART_KUBE_VERSION: &str = "v1.37.2";

/// What a 1.37 server adds to Helm's built-in API list, as far as the chart asks
/// (`charts/railguard/templates/_dra.tpl` `railguard.draServed` checks
/// `resource.k8s.io/v1/DeviceTaintRule`).
pub fn chart_api_versions() -> Vec<String> {
    [
        "resource.k8s.io/v1",
        "resource.k8s.io/v1/DeviceClass",
        "resource.k8s.io/v1/DeviceTaintRule",
        "resource.k8s.io/v1/ResourceClaim",
        "resource.k8s.io/v1/ResourceClaimTemplate",
        "resource.k8s.io/v1/ResourceSlice",
        "policy/v1/PodDisruptionBudget",
        "batch/v1/CronJob",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The chart's values for its DRA objects: claim templates in `namespaces`, the GPU class
/// serving `extended_resource` when given.
pub fn chart_values(namespaces: &[&str], extended_resource: Option<&str>) -> String {
    json!({ "dra": {
        "enabled": true,
        "claimTemplateNamespaces": namespaces,
        "gpuExtendedResourceName": extended_resource.unwrap_or(""),
    }})
    .to_string()
}

/// The chart's DRA objects (its DeviceClasses and ResourceClaimTemplates,
/// `charts/railguard/templates/dra.yaml`) as the real Helm renders them with the default
/// values and `values` (YAML or JSON) for a 1.37 server.
pub fn chart_objects(values: &str) -> Result<Vec<Value>> {
    let out = crate::helm::shared().template_values_output(
        "railguard",
        "railguard",
        &["{}", values],
        &chart_api_versions(),
        CHART_KUBE_VERSION,
    )?;
    let docs = crate::helm::documents_of(out, "railguard")?;
    Ok(docs
        .into_iter()
        .map(|d| d.obj)
        .filter(|o| {
            o["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with(&format!("{GROUP}/")))
        })
        .collect())
}

/// Server-side applies a `resource.k8s.io/v1` object (namespaced when its metadata names a
/// namespace) as the harness.
pub async fn apply(client: &Client, obj: &Value) -> Result<DynamicObject> {
    let kind = obj["kind"].as_str().context("object without kind")?;
    let name = obj["metadata"]["name"]
        .as_str()
        .context("object without name")?;
    let ar = resource(kind);
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.patch(
        name,
        &PatchParams::apply(HARNESS_FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .with_context(|| format!("applying {kind} {name}"))
}

/// A pod of `name` whose one container uses a claim made from `template` (the
/// ResourceClaimTemplate's name). Nothing runs it: no kubelet.
pub fn claim_pod(name: &str, template: &str) -> Pod {
    #[allow(clippy::unwrap_used)] // a fixed, valid object
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": {
            "resourceClaims": [{ "name": "rails", "resourceClaimTemplateName": template }],
            "containers": [{
                "name": "train", "image": "registry.k8s.io/pause:3.10",
                "resources": { "claims": [{ "name": "rails" }] },
            }],
        },
    }))
    .unwrap()
}

/// A plain pod asking for `count` of the extended resource `resource` (`nvidia.com/gpu`).
pub fn extended_resource_pod(name: &str, resource: &str, count: u32) -> Pod {
    #[allow(clippy::unwrap_used)] // a fixed, valid object
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": {
            "containers": [{
                "name": "cuda", "image": "registry.k8s.io/pause:3.10",
                "resources": { "limits": { resource: count.to_string() } },
            }],
        },
    }))
    .unwrap()
}

// ---------------------------------------------------------------------------------------
// Allocations.

/// One allocated device (`status.allocation.devices.results[]` of a ResourceClaim).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Allocated {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// The allocation of a claim object: `None` while unallocated.
pub fn allocation_of(claim: &Value) -> Option<Vec<Allocated>> {
    let results = claim.pointer("/status/allocation/devices/results")?;
    let mut out: Vec<Allocated> = results
        .as_array()?
        .iter()
        .map(|r| {
            let f = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            Allocated {
                request: f("request"),
                driver: f("driver"),
                pool: f("pool"),
                device: f("device"),
            }
        })
        .collect();
    out.sort();
    Some(out)
}

/// The names of a pod's ResourceClaims: those made from its templates
/// (`status.resourceClaimStatuses`) and the one the scheduler made for its DRA-backed
/// extended resources (`status.extendedResourceClaimStatus`, not in k8s-openapi's 1.33
/// types: read as JSON).
pub async fn pod_claim_names(client: &Client, ns: &str, pod: &str) -> Result<Vec<String>> {
    let req = http::Request::get(format!("/api/v1/namespaces/{ns}/pods/{pod}")).body(Vec::new())?;
    let p: Value = client.request(req).await?;
    let mut names: Vec<String> = p
        .pointer("/status/resourceClaimStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s["resourceClaimName"].as_str().map(str::to_string))
        .collect();
    if let Some(n) = p
        .pointer("/status/extendedResourceClaimStatus/resourceClaimName")
        .and_then(Value::as_str)
    {
        names.push(n.to_string());
    }
    Ok(names)
}

/// What the scheduler allocated a pod's claims, all of them together, once each has an
/// allocation (`Err(NotYet)` until then).
pub async fn pod_allocation(
    client: &Client,
    ns: &str,
    pod: &str,
) -> Result<std::result::Result<Vec<Allocated>, NotYet>> {
    let names = pod_claim_names(client, ns, pod).await?;
    if names.is_empty() {
        return Ok(Err(NotYet(format!("pod {ns}/{pod} has no claim yet"))));
    }
    let mut all = Vec::new();
    for name in names {
        let claim = match claims(client, ns).get_opt(&name).await? {
            Some(c) => serde_json::to_value(c)?,
            None => return Ok(Err(NotYet(format!("claim {ns}/{name} not there yet")))),
        };
        match allocation_of(&claim) {
            Some(a) => all.extend(a),
            None => return Ok(Err(NotYet(format!("claim {ns}/{name} not allocated")))),
        }
    }
    all.sort();
    Ok(Ok(all))
}

/// Waits for a pod to be bound and its claims allocated: (node, devices).
pub async fn wait_allocated(
    client: &Client,
    ns: &str,
    pod: &str,
    timeout: Duration,
) -> Result<(String, Vec<Allocated>)> {
    eventually(
        timeout,
        &format!("pod {ns}/{pod} bound with its claims allocated"),
        || async {
            let Some(node) = crate::pod_node(client, ns, pod).await else {
                let why = crate::failed_scheduling_messages(client, ns, pod)
                    .await
                    .unwrap_or_default();
                return Ok(Err(NotYet(format!("unbound; FailedScheduling: {why:?}"))));
            };
            Ok(pod_allocation(client, ns, pod).await?.map(|a| (node, a)))
        },
    )
    .await
}

/// Deletes a pod at once (grace period 0: no kubelet would confirm a graceful end) and
/// waits until its generated claims are gone or at least deallocated.
pub async fn delete_pod_now(client: &Client, ns: &str, pod: &str) -> Result<()> {
    let names = pod_claim_names(client, ns, pod).await.unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let _ = pods
        .delete(pod, &DeleteParams::default().grace_period(0))
        .await;
    eventually(
        Duration::from_secs(60),
        &format!("the claims of deleted pod {ns}/{pod} released"),
        || async {
            if pods.get_opt(pod).await?.is_some() {
                return Ok(Err(NotYet("the pod is still there".into())));
            }
            for n in &names {
                if let Some(c) = claims(client, ns).get_opt(n).await? {
                    if allocation_of(&serde_json::to_value(c)?).is_some() {
                        return Ok(Err(NotYet(format!("claim {n} still allocated"))));
                    }
                }
            }
            Ok(Ok(()))
        },
    )
    .await
}
