//! Fabric checks beyond link state and rate, from the runbook: a Subnet Manager behind every
//! InfiniBand rail, a RoCE v2 GID on every RoCE rail's netdev (or a VLAN on it), a netdev
//! MTU that allows the 4096-byte RoCE path MTU, and physical-layer error counters within
//! bounds.
//!
//! Shape: [`read_port_fabric`] adapts one port's sysfs files into [`PortFabric`] (each file
//! absent, junk or a value, never defaulted); [`fabric_findings`] decides over the rails,
//! without IO.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use railguard_api::LinkLayer;
use serde::{Deserialize, Serialize};

use super::attr::{read_attr, Attr};
use super::{Finding, FindingKind, Hca, HcaPort, PortState, Rail, Severity};

/// The type of a GID table entry (`gid_attrs/types/<i>`, the kernel's
/// `ib_cache_gid_type_str`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GidType {
    /// `IB/RoCE v1`: an InfiniBand GID, or RoCE v1 (layer 2 only, not routable).
    #[serde(rename = "IB/RoCE v1")]
    IbRoceV1,
    /// `RoCE v2`: UDP/IP encapsulated, what NCCL selects on RoCE fabrics.
    #[serde(rename = "RoCE v2")]
    RoceV2,
}

impl GidType {
    fn from_sysfs(s: &str) -> Option<Self> {
        match s.trim() {
            "IB/RoCE v1" => Some(GidType::IbRoceV1),
            "RoCE v2" => Some(GidType::RoceV2),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GidType::IbRoceV1 => "IB/RoCE v1",
            GidType::RoceV2 => "RoCE v2",
        }
    }
}

/// One used entry of a port's GID table (`gids/<i>` not all zero).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GidEntry {
    pub index: u32,
    /// The GID as the kernel prints it (`fe80:0000:...`), or junk.
    pub gid: Attr<String>,
    /// `gid_attrs/types/<i>`.
    pub gid_type: Attr<GidType>,
    /// `gid_attrs/ndevs/<i>`: the netdev the GID belongs to (e.g. `eth2` or `eth2.100`).
    pub ndev: Attr<String>,
}

/// What a port's traffic runs on: a netdev's MTU and the devices below it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetdevFacts {
    /// `sys/class/net/<if>/mtu`.
    pub mtu: Attr<u32>,
    /// The `lower_<if>` links: for a VLAN `eth2.100`, `eth2`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lower: Vec<String>,
}

/// A port's fabric attributes as read, for [`fabric_findings`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortFabric {
    /// `sm_lid` (InfiniBand ports).
    pub sm_lid: Attr<u32>,
    /// `sm_sl` (InfiniBand ports).
    pub sm_sl: Attr<u32>,
    /// Used GID table entries (Ethernet ports); `None` without a `gids/` directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gids: Option<Vec<GidEntry>>,
    /// The port's netdev and every netdev its GIDs name, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub netdevs: BTreeMap<String, NetdevFacts>,
    /// The [`PHYSICAL_COUNTERS`] present under `counters/`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub physical_counters: BTreeMap<String, Attr<u64>>,
}

/// Physical-layer counters and the value above which a rail's link is suspect.
///
/// Names: the PortCounters attributes of `drivers/infiniband/core/sysfs.c`
/// (`PORT_PMA_ATTR(symbol_error, ...)` ..., `ports/<p>/counters/`); mlx5 answers them for
/// InfiniBand and Ethernet ports. mlx5's `hw_counters/` (`drivers/infiniband/hw/mlx5/
/// counters.c`: q counters such as `out_of_sequence`, congestion counters, the extended
/// PPCNT `rx_icrc_encapsulated`) hold transport and congestion events, none of the
/// physical layer; FEC corrected/uncorrectable blocks are only in ethtool (`mlx5e`
/// `rx_corrected_bits_phy`, `rx_fec_*`) and mlxlink, not in sysfs, so they are not read.
///
/// Bounds: infiniband-diags' `error_thresholds` example (ibqueryerrors(8)) sets
/// SymbolErrorCounter=10 and LinkErrorRecoveryCounter=10; the other link error counters take
/// the same bound. This judges what a port accumulated since its counters were last cleared;
/// the growth of these counters over a check window is judged by certification
/// (`certify::ERROR_COUNTERS`).
pub const PHYSICAL_COUNTERS: &[PhysicalCounter] = &[
    PhysicalCounter::new("symbol_error", 10, 16),
    PhysicalCounter::new("link_error_recovery", 10, 8),
    PhysicalCounter::new("link_downed", 10, 8),
    PhysicalCounter::new("port_rcv_errors", 10, 16),
    PhysicalCounter::new("port_rcv_remote_physical_errors", 10, 16),
    PhysicalCounter::new("local_link_integrity_errors", 10, 4),
];

/// One physical-layer counter: its `counters/` file name, the bound, and its width in the
/// PortCounters attribute (it saturates at `2^bits - 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhysicalCounter {
    pub name: &'static str,
    pub bound: u64,
    pub bits: u32,
}

impl PhysicalCounter {
    const fn new(name: &'static str, bound: u64, bits: u32) -> Self {
        Self { name, bound, bits }
    }

    fn saturated(&self, value: u64) -> bool {
        self.bits < 64 && value >= (1u64 << self.bits) - 1
    }
}

/// The RoCE headers the kernel takes off the netdev MTU for the RoCE path MTU
/// (`iboe_get_mtu` in `include/rdma/ib_addr.h`: GRH 40 + UDP 8 + BTH 12 + XRC 4 +
/// AtomicETH 28 + ICRC 4).
pub const ROCE_HEADER_BYTES: u32 = 96;

/// The path MTU RDMA training traffic needs on RoCE: 4096 bytes (what NCCL uses).
pub const ROCE_PATH_MTU: u32 = 4096;

/// The smallest netdev MTU that gives [`ROCE_PATH_MTU`] (4192; fabrics usually run 9000).
pub const MIN_ROCE_NETDEV_MTU: u32 = ROCE_PATH_MTU + ROCE_HEADER_BYTES;

/// The RoCE path MTU a netdev MTU allows (`iboe_get_mtu`), 0 when below 256.
pub fn roce_path_mtu(netdev_mtu: u32) -> u32 {
    let room = netdev_mtu.saturating_sub(ROCE_HEADER_BYTES);
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|m| room >= *m)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Reading (thin).

/// `0x1a` (how `sm_lid` prints) or decimal.
fn parse_lid(s: &str) -> Option<u32> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Eight groups of four hex digits.
fn is_gid(s: &str) -> bool {
    let groups: Vec<&str> = s.split(':').collect();
    groups.len() == 8
        && groups
            .iter()
            .all(|g| g.len() == 4 && g.chars().all(|c| c.is_ascii_hexdigit()))
}

fn is_zero_gid(s: &str) -> bool {
    s.chars().all(|c| c == '0' || c == ':')
}

/// Counter text: a number, or `N/A (no PMA)` (older kernels, when the PMA query fails:
/// not available, not junk).
fn parse_counter(text: Attr<String>) -> Attr<u64> {
    match text {
        Attr::Value(t) if t.starts_with("N/A") => Attr::Absent,
        other => other.parse(|s| s.parse().ok()),
    }
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The sysfs directory of a netdev: under the HCA's PCI device when it is there (the same
/// kernel object as `sys/class/net/<if>`), else `sys/class/net/<if>` (VLANs are virtual).
fn netdev_dir(root: &Path, hdir: &Path, name: &str) -> PathBuf {
    let own = hdir.join("device/net").join(name);
    if own.is_dir() {
        own
    } else {
        root.join("sys/class/net").join(name)
    }
}

fn read_netdev(root: &Path, hdir: &Path, name: &str) -> NetdevFacts {
    let dir = netdev_dir(root, hdir, name);
    NetdevFacts {
        mtu: read_attr(&dir.join("mtu")).parse(|s| s.parse().ok()),
        lower: dir_names(&dir)
            .into_iter()
            .filter_map(|n| n.strip_prefix("lower_").map(str::to_string))
            .collect(),
    }
}

fn read_gids(pdir: &Path) -> Option<Vec<GidEntry>> {
    let gdir = pdir.join("gids");
    if !gdir.is_dir() {
        return None;
    }
    let mut indices: Vec<u32> = dir_names(&gdir)
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect();
    indices.sort_unstable();
    let mut out = Vec::new();
    for index in indices {
        let gid = match read_attr(&gdir.join(index.to_string())) {
            Attr::Absent => continue,
            Attr::Value(g) if is_gid(&g) && is_zero_gid(&g) => continue,
            Attr::Value(g) if is_gid(&g) => Attr::Value(g),
            Attr::Value(g) | Attr::Junk(g) => Attr::Junk(g),
        };
        let attr =
            |kind: &str| read_attr(&pdir.join("gid_attrs").join(kind).join(index.to_string()));
        out.push(GidEntry {
            index,
            gid,
            gid_type: attr("types").parse(GidType::from_sysfs),
            ndev: attr("ndevs").parse(|s| (!s.is_empty()).then(|| s.to_string())),
        });
    }
    Some(out)
}

/// Reads the fabric attributes of port `pdir` of HCA directory `hdir` (`netdev`: the port's
/// own netdev, when known). The GID table is read for Ethernet ports only (an InfiniBand
/// port's GIDs carry no netdev).
pub(crate) fn read_port_fabric(
    root: &Path,
    hdir: &Path,
    pdir: &Path,
    link_layer: Option<LinkLayer>,
    netdev: Option<&str>,
) -> PortFabric {
    let gids = match link_layer {
        Some(LinkLayer::Ib) => None,
        _ => read_gids(pdir),
    };
    let mut names: BTreeSet<String> = netdev.map(str::to_string).into_iter().collect();
    for e in gids.iter().flatten() {
        if let Attr::Value(n) = &e.ndev {
            names.insert(n.clone());
        }
    }
    let netdevs = names
        .into_iter()
        .map(|n| {
            let facts = read_netdev(root, hdir, &n);
            (n, facts)
        })
        .collect();
    let cdir = pdir.join("counters");
    let physical_counters = PHYSICAL_COUNTERS
        .iter()
        .filter_map(|c| match read_attr(&cdir.join(c.name)) {
            Attr::Absent => None,
            text => Some((c.name.to_string(), parse_counter(text))),
        })
        .collect();
    PortFabric {
        sm_lid: read_attr(&pdir.join("sm_lid")).parse(parse_lid),
        sm_sl: read_attr(&pdir.join("sm_sl")).parse(|s| s.parse().ok()),
        gids,
        netdevs,
        physical_counters,
    }
}

// ---------------------------------------------------------------------------------------
// Deciding (pure).

/// How a GID's netdev relates to the rail's netdev.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GidCarrier {
    /// The rail's netdev itself.
    Netdev,
    /// A device on top of it (a VLAN such as `eth2.100`).
    Upper,
    /// Some other netdev.
    Foreign,
}

/// Where a GID on `ndev` sits relative to the rail's `netdev`: the device itself, a device
/// whose `lower_` link names it, or (without `lower_` links) a VLAN named `<netdev>.<id>`.
pub fn gid_carrier(ndev: &str, netdev: &str, facts: &BTreeMap<String, NetdevFacts>) -> GidCarrier {
    if ndev == netdev {
        return GidCarrier::Netdev;
    }
    let lower = facts.get(ndev).map(|f| f.lower.as_slice()).unwrap_or(&[]);
    let vlan_name = ndev
        .strip_prefix(netdev)
        .and_then(|rest| rest.strip_prefix('.'))
        .is_some_and(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()));
    if lower.iter().any(|l| l == netdev) || (lower.is_empty() && vlan_name) {
        GidCarrier::Upper
    } else {
        GidCarrier::Foreign
    }
}

/// One rail's checks: its findings, junk files and unknowns gathered as they are met.
struct RailCheck<'a> {
    rail: &'a Rail,
    port: &'a HcaPort,
    subject: String,
    base: String,
    out: Vec<Finding>,
    junk: Vec<String>,
}

/// Unknowns (a file absent) of every rail, one informational finding per kind.
#[derive(Default)]
struct Unknowns(BTreeMap<FindingKind, Vec<String>>);

impl Unknowns {
    fn add(&mut self, kind: FindingKind, evidence: String) {
        self.0.entry(kind).or_default().push(evidence);
    }

    fn into_findings(self) -> impl Iterator<Item = Finding> {
        self.0.into_iter().map(|(kind, evidence)| {
            let what = match kind {
                FindingKind::SubnetManager => "Subnet Manager",
                FindingKind::RoceGid => "RoCE v2 GID",
                FindingKind::Mtu => "netdev MTU",
                FindingKind::PhysicalLayer => "physical-layer counters",
                other => other.as_str(),
            };
            Finding {
                kind,
                severity: Severity::Info,
                subject: "node".into(),
                message: format!(
                    "{what} unknown on {} rail(s): sysfs does not show it",
                    evidence.len()
                ),
                evidence,
            }
        })
    }
}

impl<'a> RailCheck<'a> {
    fn new(rail: &'a Rail, port: &'a HcaPort) -> Self {
        Self {
            rail,
            port,
            subject: format!("{}:{}", rail.hca, rail.port),
            base: format!("sys/class/infiniband/{}/ports/{}", rail.hca, rail.port),
            out: Vec::new(),
            junk: Vec::new(),
        }
    }

    fn fabric(&self) -> &'a PortFabric {
        &self.port.fabric
    }

    /// An active InfiniBand rail needs a Subnet Manager (`sm_lid` non-zero). A port that is
    /// not active is already a `port-down` finding.
    fn subnet_manager(&mut self, unknown: &mut Unknowns) {
        if !matches!(self.port.state, PortState::Active | PortState::ActiveDefer) {
            return;
        }
        let f = self.fabric();
        let lid_path = format!("{}/sm_lid", self.base);
        match &f.sm_lid {
            Attr::Absent => unknown.add(FindingKind::SubnetManager, format!("{lid_path} absent")),
            Attr::Junk(t) => self.junk.push(format!("{lid_path} = {t:?}")),
            Attr::Value(0) => {
                let mut evidence = vec![
                    format!("{lid_path} = 0x0"),
                    format!("{}/state = {}", self.base, self.port.state.as_str()),
                ];
                if let Some(sl) = f.sm_sl.value() {
                    evidence.push(format!("{}/sm_sl = {sl}", self.base));
                }
                self.out.push(Finding {
                    kind: FindingKind::SubnetManager,
                    severity: Severity::Critical,
                    subject: self.subject.clone(),
                    message: format!(
                        "InfiniBand rail {} is active but knows no Subnet Manager (sm_lid 0): no path records, no new connections",
                        self.subject
                    ),
                    evidence,
                });
            }
            Attr::Value(_) => {}
        }
        if let Attr::Junk(t) = &f.sm_sl {
            self.junk.push(format!("{}/sm_sl = {t:?}", self.base));
        }
    }

    fn gid_evidence(&self, e: &GidEntry) -> String {
        let show = |a: &Attr<String>| match a {
            Attr::Value(v) => v.clone(),
            Attr::Junk(j) => format!("{j:?}"),
            Attr::Absent => "<absent>".into(),
        };
        let gid_type = match &e.gid_type {
            Attr::Value(t) => t.as_str().to_string(),
            Attr::Junk(j) => format!("{j:?}"),
            Attr::Absent => "<absent>".into(),
        };
        format!(
            "{}/gids/{} = {} (type {gid_type}, ndev {})",
            self.base,
            e.index,
            show(&e.gid),
            show(&e.ndev)
        )
    }

    /// A RoCE rail needs a RoCE v2 GID on its netdev or a VLAN on it. Returns the netdev
    /// carrying it when it is an upper device (for the MTU check).
    fn roce_gid(&mut self, unknown: &mut Unknowns) -> Option<String> {
        let f = self.fabric();
        let Some(gids) = &f.gids else {
            unknown.add(FindingKind::RoceGid, format!("{}/gids absent", self.base));
            return None;
        };
        for e in gids {
            let at = |kind: &str| format!("{}/{kind}/{}", self.base, e.index);
            if let Attr::Junk(t) = &e.gid {
                self.junk.push(format!("{} = {t:?}", at("gids")));
            }
            if let Attr::Junk(t) = &e.gid_type {
                self.junk.push(format!("{} = {t:?}", at("gid_attrs/types")));
            }
            if let Attr::Junk(t) = &e.ndev {
                self.junk.push(format!("{} = {t:?}", at("gid_attrs/ndevs")));
            }
        }
        let v2: Vec<&GidEntry> = gids
            .iter()
            .filter(|e| e.gid.value().is_some() && e.gid_type.value() == Some(&GidType::RoceV2))
            .collect();
        let table: Vec<String> = gids.iter().take(8).map(|e| self.gid_evidence(e)).collect();
        if v2.is_empty() {
            if gids.iter().any(|e| e.gid_type == Attr::Absent) {
                // Without gid_attrs the type is unknown, not wrong.
                unknown.add(
                    FindingKind::RoceGid,
                    format!("{}/gid_attrs/types absent", self.base),
                );
                return None;
            }
            let mut evidence = table;
            if gids.is_empty() {
                evidence.push(format!("{}/gids: every entry is zero", self.base));
            }
            self.out.push(Finding {
                kind: FindingKind::RoceGid,
                severity: Severity::Critical,
                subject: self.subject.clone(),
                message: format!(
                    "RoCE rail {} has no RoCE v2 GID (NCCL needs a routable v2 GID; check the netdev's IP address and the RoCE mode)",
                    self.subject
                ),
                evidence,
            });
            return None;
        }
        let Some(netdev) = self.rail.netdev.as_deref() else {
            unknown.add(
                FindingKind::RoceGid,
                format!(
                    "{}: no netdev under sys/class/infiniband/{}/device/net, the RoCE v2 GID's netdev cannot be checked",
                    self.subject, self.rail.hca
                ),
            );
            return None;
        };
        let mut carriers: Vec<(GidCarrier, &str)> = v2
            .iter()
            .filter_map(|e| e.ndev.value())
            .map(|n| (gid_carrier(n, netdev, &f.netdevs), n.as_str()))
            .collect();
        carriers.sort();
        match carriers.first() {
            Some((GidCarrier::Netdev, _)) => None,
            Some((GidCarrier::Upper, upper)) => {
                self.out.push(Finding {
                    kind: FindingKind::RoceGid,
                    severity: Severity::Info,
                    subject: self.subject.clone(),
                    message: format!(
                        "RoCE v2 GID of {} is on {upper}, a VLAN/upper device of the rail's netdev {netdev}",
                        self.subject
                    ),
                    evidence: v2.iter().map(|e| self.gid_evidence(e)).collect(),
                });
                Some((*upper).to_string())
            }
            Some((GidCarrier::Foreign, _)) => {
                let foreign: BTreeSet<&str> = carriers.iter().map(|(_, n)| *n).collect();
                let mut evidence: Vec<String> = v2.iter().map(|e| self.gid_evidence(e)).collect();
                evidence.push(format!(
                    "sys/class/infiniband/{}/device/net = {netdev}",
                    self.rail.hca
                ));
                self.out.push(Finding {
                    kind: FindingKind::RoceGid,
                    severity: Severity::Critical,
                    subject: self.subject.clone(),
                    message: format!(
                        "RoCE v2 GIDs of {} are on {}, not on the rail's netdev {netdev} or a VLAN on it",
                        self.subject,
                        foreign.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                    evidence,
                });
                None
            }
            None => {
                unknown.add(
                    FindingKind::RoceGid,
                    format!("{}/gid_attrs/ndevs of the RoCE v2 GIDs absent", self.base),
                );
                None
            }
        }
    }

    /// A RoCE rail's netdev (and the VLAN carrying its v2 GID) must allow the 4096-byte
    /// path MTU. InfiniBand rails are not judged: the IPoIB MTU does not bound the RDMA path
    /// MTU, and the port's active MTU is not in sysfs.
    fn mtu(&mut self, unknown: &mut Unknowns, upper: Option<&str>) {
        let Some(netdev) = self.rail.netdev.as_deref() else {
            unknown.add(
                FindingKind::Mtu,
                format!(
                    "{}: no netdev under sys/class/infiniband/{}/device/net",
                    self.subject, self.rail.hca
                ),
            );
            return;
        };
        for name in std::iter::once(netdev).chain(upper) {
            let path = format!("sys/class/net/{name}/mtu");
            match self.fabric().netdevs.get(name).map(|n| &n.mtu) {
                None | Some(Attr::Absent) => {
                    unknown.add(FindingKind::Mtu, format!("{path} absent"))
                }
                Some(Attr::Junk(t)) => self.junk.push(format!("{path} = {t:?}")),
                Some(Attr::Value(mtu)) if *mtu < MIN_ROCE_NETDEV_MTU => {
                    self.out.push(Finding {
                        kind: FindingKind::Mtu,
                        severity: Severity::Warning,
                        subject: self.subject.clone(),
                        message: format!(
                            "netdev {name} of RoCE rail {} has MTU {mtu}: RoCE path MTU {} instead of {ROCE_PATH_MTU} (needs an MTU of at least {MIN_ROCE_NETDEV_MTU}, fabrics usually run 9000)",
                            self.subject,
                            roce_path_mtu(*mtu)
                        ),
                        evidence: vec![format!("{path} = {mtu}")],
                    });
                }
                Some(Attr::Value(_)) => {}
            }
        }
    }

    /// Physical-layer counters beyond their bound.
    fn physical_layer(&mut self, unknown: &mut Unknowns) {
        let counters = &self.fabric().physical_counters;
        let mut over = Vec::new();
        let mut known = 0;
        for c in PHYSICAL_COUNTERS {
            let path = format!("{}/counters/{}", self.base, c.name);
            match counters.get(c.name) {
                None | Some(Attr::Absent) => {}
                Some(Attr::Junk(t)) => self.junk.push(format!("{path} = {t:?}")),
                Some(Attr::Value(v)) => {
                    known += 1;
                    if *v > c.bound {
                        let saturated = if c.saturated(*v) { ", saturated" } else { "" };
                        over.push((
                            c.name,
                            format!("{path} = {v} (bound {}{saturated})", c.bound),
                        ));
                    }
                }
            }
        }
        if known == 0 && !counters.values().any(|a| matches!(a, Attr::Junk(_))) {
            unknown.add(
                FindingKind::PhysicalLayer,
                format!(
                    "{}/counters/{{symbol_error,link_downed,...}} absent",
                    self.base
                ),
            );
        }
        if !over.is_empty() {
            let names: Vec<&str> = over.iter().map(|(name, _)| *name).collect();
            self.out.push(Finding {
                kind: FindingKind::PhysicalLayer,
                severity: Severity::Warning,
                subject: self.subject.clone(),
                message: format!(
                    "rail {} shows physical-layer errors ({}): a marginal cable, transceiver or port",
                    self.subject,
                    names.join(", ")
                ),
                evidence: over.into_iter().map(|(_, e)| e).collect(),
            });
        }
    }

    fn finish(mut self) -> Vec<Finding> {
        if !self.junk.is_empty() {
            self.out.push(Finding {
                kind: FindingKind::SysfsUnreadable,
                severity: Severity::Warning,
                subject: self.subject.clone(),
                message: format!(
                    "fabric attributes of {} are not understood ({} file(s))",
                    self.subject,
                    self.junk.len()
                ),
                evidence: self.junk,
            });
        }
        self.out
    }
}

/// The fabric findings of the compute rails: Subnet Manager (InfiniBand), RoCE v2 GID and
/// netdev MTU (RoCE), physical-layer counters (both). Files the kernel does not show are
/// unknowns, one informational finding per kind; files that hold junk are
/// `sysfs-unreadable` findings.
pub fn fabric_findings(hcas: &[Hca], rails: &[Rail]) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut unknown = Unknowns::default();
    for rail in rails {
        let Some(port) = hcas
            .iter()
            .find(|h| h.name == rail.hca)
            .and_then(|h| h.ports.iter().find(|p| p.port == rail.port))
        else {
            continue;
        };
        let mut check = RailCheck::new(rail, port);
        match port.link_layer {
            Some(LinkLayer::Ib) => check.subnet_manager(&mut unknown),
            Some(LinkLayer::Roce) => {
                let upper = check.roce_gid(&mut unknown);
                check.mtu(&mut unknown, upper.as_deref());
            }
            // Unknown link layer: nothing to hold the port to.
            None => {}
        }
        check.physical_layer(&mut unknown);
        out.extend(check.finish());
    }
    out.extend(unknown.into_findings());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v<T>(x: T) -> Attr<T> {
        Attr::Value(x)
    }

    fn healthy_counters() -> BTreeMap<String, Attr<u64>> {
        PHYSICAL_COUNTERS
            .iter()
            .map(|c| (c.name.to_string(), v(0)))
            .collect()
    }

    fn gid(index: u32, t: GidType, ndev: &str) -> GidEntry {
        GidEntry {
            index,
            gid: v(format!("fe80:0000:0000:0000:ba3f:d2ff:fe00:{index:04x}")),
            gid_type: v(t),
            ndev: v(ndev.to_string()),
        }
    }

    fn netdev(mtu: u32, lower: &[&str]) -> NetdevFacts {
        NetdevFacts {
            mtu: v(mtu),
            lower: lower.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn ib_fabric(sm_lid: u32) -> PortFabric {
        PortFabric {
            sm_lid: v(sm_lid),
            sm_sl: v(0),
            physical_counters: healthy_counters(),
            ..PortFabric::default()
        }
    }

    fn roce_fabric(gids: Vec<GidEntry>, netdevs: &[(&str, NetdevFacts)]) -> PortFabric {
        PortFabric {
            gids: Some(gids),
            netdevs: netdevs
                .iter()
                .map(|(n, f)| (n.to_string(), f.clone()))
                .collect(),
            physical_counters: healthy_counters(),
            ..PortFabric::default()
        }
    }

    fn node(ll: LinkLayer, netdev: Option<&str>, fabric: PortFabric) -> (Vec<Hca>, Vec<Rail>) {
        let port = HcaPort {
            port: 1,
            state: PortState::Active,
            phys_state: Some("5: LinkUp".into()),
            rate_gbps: Some(400.0),
            link_layer: Some(ll),
            gid0: None,
            netdev: netdev.map(str::to_string),
            counters: BTreeMap::new(),
            hw_counters: BTreeMap::new(),
            fabric,
        };
        let hca = Hca {
            name: "mlx5_0".into(),
            pci_bus_id: Some("0000:18:00.0".into()),
            numa: Some(0),
            fw_ver: None,
            node_guid: None,
            ports: vec![port],
            sriov_vfs: Vec::new(),
        };
        let rail = Rail {
            hca: "mlx5_0".into(),
            port: 1,
            link_layer: Some(ll),
            state: PortState::Active,
            rate_gbps: Some(400.0),
            gpus: vec![0],
            netdev: netdev.map(str::to_string),
            gid_index: None,
        };
        (vec![hca], vec![rail])
    }

    fn findings(n: (Vec<Hca>, Vec<Rail>)) -> Vec<Finding> {
        fabric_findings(&n.0, &n.1)
    }

    fn healthy_roce() -> PortFabric {
        roce_fabric(
            vec![
                gid(0, GidType::IbRoceV1, "eth2"),
                gid(1, GidType::RoceV2, "eth2"),
            ],
            &[("eth2", netdev(9000, &[]))],
        )
    }

    #[test]
    fn healthy_rails_have_no_findings() {
        assert_eq!(findings(node(LinkLayer::Ib, Some("ib0"), ib_fabric(1))), []);
        assert_eq!(
            findings(node(LinkLayer::Roce, Some("eth2"), healthy_roce())),
            []
        );
    }

    #[test]
    fn an_active_ib_rail_without_subnet_manager_is_critical() {
        let f = findings(node(LinkLayer::Ib, Some("ib0"), ib_fabric(0)));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].kind, f[0].severity, f[0].subject.as_str()),
            (FindingKind::SubnetManager, Severity::Critical, "mlx5_0:1")
        );
        assert_eq!(
            f[0].evidence,
            [
                "sys/class/infiniband/mlx5_0/ports/1/sm_lid = 0x0",
                "sys/class/infiniband/mlx5_0/ports/1/state = ACTIVE",
                "sys/class/infiniband/mlx5_0/ports/1/sm_sl = 0",
            ]
        );
        // A port that is down is a port-down finding, not a Subnet Manager one.
        let (mut hcas, mut rails) = node(LinkLayer::Ib, Some("ib0"), ib_fabric(0));
        hcas[0].ports[0].state = PortState::Down;
        rails[0].state = PortState::Down;
        assert_eq!(fabric_findings(&hcas, &rails), []);
    }

    #[test]
    fn sm_lid_absent_is_unknown_and_junk_is_unreadable() {
        let mut fabric = ib_fabric(1);
        fabric.sm_lid = Attr::Absent;
        let f = findings(node(LinkLayer::Ib, Some("ib0"), fabric));
        assert_eq!(
            (f[0].kind, f[0].severity, f[0].subject.as_str()),
            (FindingKind::SubnetManager, Severity::Info, "node")
        );
        let mut fabric = ib_fabric(1);
        fabric.sm_lid = Attr::Junk("lid?".into());
        let f = findings(node(LinkLayer::Ib, Some("ib0"), fabric));
        assert_eq!(
            (f[0].kind, f[0].severity),
            (FindingKind::SysfsUnreadable, Severity::Warning)
        );
        assert_eq!(
            f[0].evidence,
            ["sys/class/infiniband/mlx5_0/ports/1/sm_lid = \"lid?\""]
        );
    }

    #[test]
    fn a_roce_rail_without_v2_gid_is_critical() {
        let fabric = roce_fabric(
            vec![gid(0, GidType::IbRoceV1, "eth2")],
            &[("eth2", netdev(9000, &[]))],
        );
        let f = findings(node(LinkLayer::Roce, Some("eth2"), fabric));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].kind, f[0].severity),
            (FindingKind::RoceGid, Severity::Critical)
        );
        assert!(f[0].message.contains("no RoCE v2 GID"), "{}", f[0].message);
        assert_eq!(
            f[0].evidence,
            ["sys/class/infiniband/mlx5_0/ports/1/gids/0 = fe80:0000:0000:0000:ba3f:d2ff:fe00:0000 (type IB/RoCE v1, ndev eth2)"]
        );
        // An empty table (no address on the netdev) is the same finding.
        let f = findings(node(
            LinkLayer::Roce,
            Some("eth2"),
            roce_fabric(vec![], &[("eth2", netdev(9000, &[]))]),
        ));
        assert_eq!(f[0].kind, FindingKind::RoceGid);
        assert!(f[0].evidence[0].contains("every entry is zero"));
    }

    #[test]
    fn a_v2_gid_on_a_foreign_netdev_is_critical() {
        let fabric = roce_fabric(
            vec![gid(1, GidType::RoceV2, "eth7")],
            &[("eth2", netdev(9000, &[])), ("eth7", netdev(9000, &[]))],
        );
        let f = findings(node(LinkLayer::Roce, Some("eth2"), fabric));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].kind, f[0].severity),
            (FindingKind::RoceGid, Severity::Critical)
        );
        assert!(f[0].message.contains("on eth7"), "{}", f[0].message);
        assert!(f[0].evidence[0].contains("gids/1"));
        assert!(f[0].evidence[0].contains("type RoCE v2, ndev eth7"));
    }

    #[test]
    fn a_v2_gid_on_a_vlan_of_the_rail_netdev_is_fine_and_said() {
        let vlan = netdev(9000, &["eth2"]);
        let fabric = roce_fabric(
            vec![gid(3, GidType::RoceV2, "eth2.100")],
            &[("eth2", netdev(9000, &[])), ("eth2.100", vlan)],
        );
        let f = findings(node(LinkLayer::Roce, Some("eth2"), fabric));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].kind, f[0].severity),
            (FindingKind::RoceGid, Severity::Info)
        );
        assert!(f[0].message.contains("eth2.100"), "{}", f[0].message);
        // Carrier rules: lower_ links, else the VLAN naming convention.
        let none = BTreeMap::new();
        assert_eq!(gid_carrier("eth2", "eth2", &none), GidCarrier::Netdev);
        assert_eq!(gid_carrier("eth2.7", "eth2", &none), GidCarrier::Upper);
        assert_eq!(gid_carrier("eth20", "eth2", &none), GidCarrier::Foreign);
        assert_eq!(gid_carrier("eth2.x", "eth2", &none), GidCarrier::Foreign);
        let macvlan: BTreeMap<String, NetdevFacts> =
            [("mv0".to_string(), netdev(9000, &["eth2"]))].into();
        assert_eq!(gid_carrier("mv0", "eth2", &macvlan), GidCarrier::Upper);
        let other: BTreeMap<String, NetdevFacts> =
            [("eth2.5".to_string(), netdev(9000, &["bond0"]))].into();
        assert_eq!(gid_carrier("eth2.5", "eth2", &other), GidCarrier::Foreign);
    }

    #[test]
    fn gid_attrs_absent_is_unknown_and_junk_is_unreadable() {
        let mut e = gid(1, GidType::RoceV2, "eth2");
        e.gid_type = Attr::Absent;
        let f = findings(node(
            LinkLayer::Roce,
            Some("eth2"),
            roce_fabric(vec![e], &[("eth2", netdev(9000, &[]))]),
        ));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].kind, f[0].severity),
            (FindingKind::RoceGid, Severity::Info)
        );
        let mut e = gid(1, GidType::RoceV2, "eth2");
        e.gid_type = Attr::Junk("RoCE v9".into());
        let f = findings(node(
            LinkLayer::Roce,
            Some("eth2"),
            roce_fabric(
                vec![gid(0, GidType::RoceV2, "eth2"), e],
                &[("eth2", netdev(9000, &[]))],
            ),
        ));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, FindingKind::SysfsUnreadable);
        assert_eq!(
            f[0].evidence,
            ["sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/1 = \"RoCE v9\""]
        );
        let f = findings(node(
            LinkLayer::Roce,
            None,
            roce_fabric(vec![gid(1, GidType::RoceV2, "eth2")], &[]),
        ));
        assert!(f
            .iter()
            .all(|f| f.severity == Severity::Info && f.subject == "node"));
        assert_eq!(
            f.iter().map(|f| f.kind).collect::<Vec<_>>(),
            [FindingKind::RoceGid, FindingKind::Mtu]
        );
    }

    #[test]
    fn a_low_roce_mtu_is_a_warning_with_the_path_mtu() {
        assert_eq!(MIN_ROCE_NETDEV_MTU, 4192);
        assert_eq!(roce_path_mtu(9000), 4096);
        assert_eq!(roce_path_mtu(4200), 4096);
        assert_eq!(roce_path_mtu(4191), 2048);
        assert_eq!(roce_path_mtu(1500), 1024);
        assert_eq!(roce_path_mtu(100), 0);
        let mut fabric = healthy_roce();
        fabric.netdevs.insert("eth2".into(), netdev(1500, &[]));
        let f = findings(node(LinkLayer::Roce, Some("eth2"), fabric));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].kind, f[0].severity),
            (FindingKind::Mtu, Severity::Warning)
        );
        assert!(
            f[0].message.contains("RoCE path MTU 1024"),
            "{}",
            f[0].message
        );
        assert_eq!(f[0].evidence, ["sys/class/net/eth2/mtu = 1500"]);
        // The VLAN carrying the v2 GID counts too.
        let fabric = roce_fabric(
            vec![gid(1, GidType::RoceV2, "eth2.100")],
            &[
                ("eth2", netdev(9000, &[])),
                ("eth2.100", netdev(1500, &["eth2"])),
            ],
        );
        let f = findings(node(LinkLayer::Roce, Some("eth2"), fabric));
        let mtu: Vec<_> = f.iter().filter(|f| f.kind == FindingKind::Mtu).collect();
        assert_eq!(mtu.len(), 1, "{f:#?}");
        assert_eq!(mtu[0].evidence, ["sys/class/net/eth2.100/mtu = 1500"]);
        // IPoIB MTU is not judged.
        let mut fabric = ib_fabric(1);
        fabric.netdevs.insert("ib0".into(), netdev(2044, &[]));
        assert_eq!(findings(node(LinkLayer::Ib, Some("ib0"), fabric)), []);
    }

    #[test]
    fn physical_counters_beyond_bounds_are_warnings() {
        let mut fabric = ib_fabric(1);
        fabric
            .physical_counters
            .insert("symbol_error".into(), v(65535));
        fabric.physical_counters.insert("link_downed".into(), v(3));
        fabric
            .physical_counters
            .insert("link_error_recovery".into(), v(11));
        let f = findings(node(LinkLayer::Ib, Some("ib0"), fabric));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].kind, f[0].severity, f[0].subject.as_str()),
            (FindingKind::PhysicalLayer, Severity::Warning, "mlx5_0:1")
        );
        assert_eq!(
            f[0].evidence,
            [
                "sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error = 65535 (bound 10, saturated)",
                "sys/class/infiniband/mlx5_0/ports/1/counters/link_error_recovery = 11 (bound 10)",
            ]
        );
        assert!(
            f[0].message.contains("symbol_error, link_error_recovery"),
            "{}",
            f[0].message
        );
    }

    #[test]
    fn physical_counters_absent_are_unknown_and_junk_is_unreadable() {
        let mut fabric = ib_fabric(1);
        fabric.physical_counters.clear();
        let f = findings(node(LinkLayer::Ib, Some("ib0"), fabric));
        assert_eq!(
            f.iter().map(|f| (f.kind, f.severity)).collect::<Vec<_>>(),
            [(FindingKind::PhysicalLayer, Severity::Info)]
        );
        let mut fabric = ib_fabric(1);
        fabric
            .physical_counters
            .insert("symbol_error".into(), Attr::Junk("-3".into()));
        let f = findings(node(LinkLayer::Ib, Some("ib0"), fabric));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, FindingKind::SysfsUnreadable);
        assert_eq!(
            f[0].evidence,
            ["sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error = \"-3\""]
        );
    }

    #[test]
    fn attribute_parsing() {
        assert_eq!(parse_lid("0x1a"), Some(26));
        assert_eq!(parse_lid("0x0"), Some(0));
        assert_eq!(parse_lid("7"), Some(7));
        assert_eq!(parse_lid("lid"), None);
        assert!(is_gid("fe80:0000:0000:0000:b83f:d203:0015:0000"));
        assert!(!is_gid("fe80::1"));
        assert!(is_zero_gid("0000:0000:0000:0000:0000:0000:0000:0000"));
        assert_eq!(GidType::from_sysfs("RoCE v2"), Some(GidType::RoceV2));
        assert_eq!(GidType::from_sysfs("IB/RoCE v1\n"), Some(GidType::IbRoceV1));
        assert_eq!(GidType::from_sysfs("v3"), None);
        assert_eq!(parse_counter(v("N/A (no PMA)".into())), Attr::Absent);
        assert_eq!(parse_counter(v("12".into())), v(12));
        assert_eq!(parse_counter(v("-3".into())), Attr::Junk("-3".into()));
    }

    #[test]
    fn the_reader_sorts_absent_junk_and_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let hdir = root.join("sys/class/infiniband/mlx5_0");
        let pdir = hdir.join("ports/1");
        let w = |p: PathBuf, s: &[u8]| {
            fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            fs::write(p, s).expect("write");
        };
        w(
            pdir.join("gids/0"),
            b"fe80:0000:0000:0000:ba3f:d2ff:fe00:0001\n",
        );
        w(
            pdir.join("gids/1"),
            b"fe80:0000:0000:0000:ba3f:d2ff:fe00:0001\n",
        );
        w(
            pdir.join("gids/2"),
            b"0000:0000:0000:0000:0000:0000:0000:0000\n",
        );
        w(pdir.join("gids/3"), b"\xff\xfe junk\n");
        w(pdir.join("gid_attrs/types/0"), b"IB/RoCE v1\n");
        w(pdir.join("gid_attrs/types/1"), b"RoCE v2\n");
        w(pdir.join("gid_attrs/ndevs/0"), b"eth2\n");
        w(pdir.join("gid_attrs/ndevs/1"), b"eth2.100\n");
        w(hdir.join("device/net/eth2/mtu"), b"9000\n");
        w(root.join("sys/class/net/eth2.100/mtu"), b"9000\n");
        w(
            root.join("sys/class/net/eth2.100/lower_eth2/mtu"),
            b"9000\n",
        );
        w(pdir.join("counters/symbol_error"), b"4\n");
        w(pdir.join("counters/link_downed"), b"many\n");
        w(pdir.join("sm_lid"), b"0x1\n");
        let f = read_port_fabric(root, &hdir, &pdir, Some(LinkLayer::Roce), Some("eth2"));
        let gids = f.gids.expect("gid table");
        assert_eq!(gids.len(), 3, "{gids:#?}");
        assert_eq!(gids[1].gid_type, v(GidType::RoceV2));
        assert_eq!(gids[1].ndev, v("eth2.100".to_string()));
        assert!(matches!(gids[2].gid, Attr::Junk(_)));
        assert_eq!(gids[2].gid_type, Attr::Absent);
        assert_eq!(f.netdevs["eth2"].mtu, v(9000));
        assert_eq!(f.netdevs["eth2.100"].lower, ["eth2"]);
        assert_eq!(f.physical_counters["symbol_error"], v(4));
        assert_eq!(
            f.physical_counters["link_downed"],
            Attr::Junk("many".into())
        );
        assert!(!f.physical_counters.contains_key("port_rcv_errors"));
        assert_eq!(f.sm_lid, v(1));
        assert_eq!(f.sm_sl, Attr::Absent);
    }
}
