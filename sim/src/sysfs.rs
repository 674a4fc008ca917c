//! Writes a synthetic sysfs tree for a node model: the same layout the kernel exposes, so
//! the real discovery code reads it unchanged.
//!
//! Written: `sys/devices/pciDDDD:BB/<root port>/<switch ports>/<device>` directories with
//! `class`, `vendor`, `device`, `numa_node`, `{current,max}_link_{speed,width}`, `config`
//! (bridges carry an ACS extended capability); `sys/bus/pci/devices/<addr>` relative
//! symlinks; per HCA `infiniband/<name>` with `fw_ver`, `node_guid`, `ports/N/{state,
//! phys_state,rate,link_layer,lid,sm_lid,sm_sl,gids/,gid_attrs/{types,ndevs}/,counters/,
//! hw_counters/}`, `device` link, and `net/<if>/{dev_port,operstate,mtu}`;
//! `sys/class/net/<if>` links (a port's VLAN in `sys/devices/virtual/net/<if>.<id>` with its
//! `lower_<if>` link); `sys/class/infiniband/<name>` links; `sys/class/iommu`;
//! `sys/module/{nvidia,nvidia_peermem}`; `proc/cmdline`, `proc/sys/kernel/osrelease`,
//! `proc/driver/nvidia/version`; and the resolved model in `railguard-sim/model.yaml`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use railguard_api::LinkLayer;

use super::model::{
    GpuModel, HcaModel, IommuMode, LinkModel, ModelPortState, NodeModel, PciNodeModel, PortModel,
    RoceGids, SwitchModel,
};
use super::ModelError;

/// Counters every port has (start at 0 unless the model sets them).
const COUNTERS: &[&str] = &[
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "VL15_dropped",
];
pub(crate) const HW_COUNTERS: &[&str] = &[
    "duplicate_request",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "rnr_nak_retry_err",
    "rp_cnp_handled",
];

/// Where the generator put things (for tests and demos).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimulatedTree {
    /// `gpuN`, HCA names and switch names -> PCI address (switches: upstream port).
    pub addresses: BTreeMap<String, String>,
}

struct Writer<'a> {
    root: &'a Path,
    model: &'a NodeModel,
    tree: SimulatedTree,
    next_bus: u16,
    domain: u16,
    numa: i32,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Write {
        path: path.display().to_string(),
        source,
    }
}

fn write(path: &Path, contents: impl AsRef<[u8]>) -> Result<(), ModelError> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io(parent))?;
    }
    fs::write(path, contents).map_err(io(path))
}

fn symlink(target: &Path, link: &Path) -> Result<(), ModelError> {
    if let Some(parent) = link.parent() {
        fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let _ = fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).map_err(io(link))
}

/// `a/b/c` relative to `from` directory: `../../a/b/c` style, both under the same root.
fn relative(from_dir: &Path, to: &Path) -> PathBuf {
    let f: Vec<_> = from_dir.components().collect();
    let t: Vec<_> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c.as_os_str());
    }
    out
}

fn speed_text(gts: f64) -> String {
    format!("{gts:.1} GT/s PCIe")
}

/// Bridge config space: a type-1 header and one ACS extended capability at 0x100.
fn bridge_config(vendor: u16, device: u16, acs_redirect: bool) -> Vec<u8> {
    let mut c = vec![0u8; 4096];
    c[0..2].copy_from_slice(&vendor.to_le_bytes());
    c[2..4].copy_from_slice(&device.to_le_bytes());
    c[0x0a] = 0x04; // subclass: PCI bridge
    c[0x0b] = 0x06; // class: bridge
    c[0x0e] = 0x01; // header type 1
    let header: u32 = 0x000d | (1 << 16); // ACS, version 1, last capability
    c[0x100..0x104].copy_from_slice(&header.to_le_bytes());
    c[0x104..0x106].copy_from_slice(&0x005fu16.to_le_bytes());
    let control: u16 = if acs_redirect { 0x001d } else { 0x0000 };
    c[0x106..0x108].copy_from_slice(&control.to_le_bytes());
    c
}

fn endpoint_config(vendor: u16, device: u16, class: u32) -> Vec<u8> {
    let mut c = vec![0u8; 256];
    c[0..2].copy_from_slice(&vendor.to_le_bytes());
    c[2..4].copy_from_slice(&device.to_le_bytes());
    c[0x09..0x0c].copy_from_slice(&class.to_le_bytes()[0..3]);
    c
}

fn rate_text(p: &PortModel) -> String {
    if p.state == ModelPortState::Down {
        // What mlx5 reports for a port without link.
        return "10 Gb/sec (4X SDR)".into();
    }
    let lane = f64::from(p.rate_gbps) / 4.0;
    let gen = match p.rate_gbps {
        r if r >= 800 => "XDR",
        r if r >= 400 => "NDR",
        r if r >= 200 => "HDR",
        r if r >= 100 => "EDR",
        r if r >= 56 => "FDR",
        r if r >= 40 => "QDR",
        r if r >= 20 => "DDR",
        _ => "SDR",
    };
    let _ = lane;
    format!("{} Gb/sec (4X {gen})", p.rate_gbps)
}

impl<'a> Writer<'a> {
    fn alloc_bus(&mut self) -> Result<u8, ModelError> {
        let bus = self.next_bus;
        if bus > 0xff {
            return Err(ModelError::Invalid {
                model: self.model.name.clone(),
                message: "PCI bus numbers exhausted (more than 255 buses)".into(),
            });
        }
        self.next_bus += 1;
        Ok(bus as u8)
    }

    fn addr(&self, bus: u8, dev: u8, func: u8) -> String {
        format!("{:04x}:{bus:02x}:{dev:02x}.{func:x}", self.domain)
    }

    /// Writes a PCI function directory with the common files and its bus symlink.
    #[allow(clippy::too_many_arguments)]
    fn pci_function(
        &mut self,
        parent: &Path,
        addr: &str,
        vendor: u16,
        device: u16,
        class: u32,
        link: &LinkModel,
        numa: Option<i32>,
        config: Vec<u8>,
    ) -> Result<PathBuf, ModelError> {
        let dir = parent.join(addr);
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        write(&dir.join("vendor"), format!("0x{vendor:04x}\n"))?;
        write(&dir.join("device"), format!("0x{device:04x}\n"))?;
        write(&dir.join("class"), format!("0x{class:06x}\n"))?;
        write(
            &dir.join("numa_node"),
            format!("{}\n", numa.unwrap_or(self.numa)),
        )?;
        write(
            &dir.join("current_link_speed"),
            format!("{}\n", speed_text(link.speed_gts)),
        )?;
        write(
            &dir.join("max_link_speed"),
            format!("{}\n", speed_text(link.max_speed_gts)),
        )?;
        write(&dir.join("current_link_width"), format!("{}\n", link.width))?;
        write(&dir.join("max_link_width"), format!("{}\n", link.max_width))?;
        write(&dir.join("config"), config)?;
        let bus_dir = self.root.join("sys/bus/pci/devices");
        let rel_dir = dir.strip_prefix(self.root).unwrap_or(&dir).to_path_buf();
        let rel_bus = Path::new("sys/bus/pci/devices");
        symlink(&relative(rel_bus, &rel_dir), &bus_dir.join(addr))?;
        Ok(dir)
    }

    fn bridge(
        &mut self,
        parent: &Path,
        addr: &str,
        device: u16,
        link: &LinkModel,
        acs_redirect: bool,
    ) -> Result<PathBuf, ModelError> {
        let vendor = if device == 0xc030 { 0x1000 } else { 0x8086 };
        self.pci_function(
            parent,
            addr,
            vendor,
            device,
            0x060400,
            link,
            None,
            bridge_config(vendor, device, acs_redirect),
        )
    }

    /// Places `node` on bus `bus` (device 0) below `parent`.
    fn node(&mut self, parent: &Path, bus: u8, node: &PciNodeModel) -> Result<(), ModelError> {
        match node {
            PciNodeModel::Switch(s) => self.switch(parent, bus, s),
            PciNodeModel::Gpu(g) => self.gpu(parent, bus, g),
            PciNodeModel::Hca(h) => self.hca_functions(parent, bus, std::slice::from_ref(h)),
            PciNodeModel::Nic(n) => self.hca_functions(parent, bus, &n.functions),
        }
    }

    fn switch(&mut self, parent: &Path, bus: u8, s: &SwitchModel) -> Result<(), ModelError> {
        let up = self.addr(bus, 0, 0);
        if !s.name.is_empty() {
            self.tree.addresses.insert(s.name.clone(), up.clone());
        }
        let up_dir = self.bridge(parent, &up, 0xc030, &s.link, false)?;
        let inner = self.alloc_bus()?;
        for (j, child) in s.children.iter().enumerate() {
            let dp = self.addr(inner, u8::try_from(j).unwrap_or(0x1f).min(0x1f), 0);
            let dp_dir =
                self.bridge(&up_dir, &dp, 0xc030, &LinkModel::default(), s.acs_redirect)?;
            let sec = self.alloc_bus()?;
            self.node(&dp_dir, sec, child)?;
        }
        Ok(())
    }

    fn gpu(&mut self, parent: &Path, bus: u8, g: &GpuModel) -> Result<(), ModelError> {
        let addr = self.addr(bus, 0, 0);
        self.tree
            .addresses
            .insert(format!("gpu{}", g.index), addr.clone());
        self.pci_function(
            parent,
            &addr,
            0x10de,
            g.device_id,
            g.class,
            &g.link,
            g.numa_node,
            endpoint_config(0x10de, g.device_id, g.class),
        )?;
        Ok(())
    }

    fn hca_functions(
        &mut self,
        parent: &Path,
        bus: u8,
        functions: &[HcaModel],
    ) -> Result<(), ModelError> {
        for (f, h) in functions.iter().enumerate() {
            let addr = self.addr(bus, 0, u8::try_from(f).unwrap_or(7).min(7));
            self.tree.addresses.insert(h.name.clone(), addr.clone());
            let ib = h.ports.iter().all(|p| p.link_layer == LinkLayer::Ib);
            let class = if ib { 0x020700 } else { 0x020000 };
            let dir = self.pci_function(
                parent,
                &addr,
                0x15b3,
                h.device_id,
                class,
                &h.link,
                h.numa_node,
                endpoint_config(0x15b3, h.device_id, class),
            )?;
            self.hca(&dir, h, bus, f)?;
        }
        Ok(())
    }

    fn hca(
        &mut self,
        pci_dir: &Path,
        h: &HcaModel,
        bus: u8,
        func: usize,
    ) -> Result<(), ModelError> {
        let dir = pci_dir.join("infiniband").join(&h.name);
        let guid = node_guid(bus, func);
        write(
            &dir.join("fw_ver"),
            format!(
                "{}\n",
                h.fw_ver.as_deref().unwrap_or(&self.model.software.fw_ver)
            ),
        )?;
        write(&dir.join("node_guid"), format!("{guid}\n"))?;
        write(&dir.join("hca_type"), "MT4129\n")?;
        write(&dir.join("board_id"), "MT_0000000838\n")?;
        symlink(
            Path::new("../../../")
                .join(pci_dir.file_name().unwrap_or_default())
                .as_path(),
            &dir.join("device"),
        )?;
        let class_link = self.root.join("sys/class/infiniband").join(&h.name);
        let rel_dir = dir.strip_prefix(self.root).unwrap_or(&dir).to_path_buf();
        symlink(
            &relative(Path::new("sys/class/infiniband"), &rel_dir),
            &class_link,
        )?;
        for p in &h.ports {
            let pd = dir.join("ports").join(p.port.to_string());
            let (state, phys) = match p.state {
                ModelPortState::Active => ("4: ACTIVE", "5: LinkUp"),
                ModelPortState::Armed => ("3: ARMED", "5: LinkUp"),
                ModelPortState::Init => ("2: INIT", "5: LinkUp"),
                ModelPortState::Down => ("1: DOWN", "3: Disabled"),
            };
            write(&pd.join("state"), format!("{state}\n"))?;
            write(&pd.join("phys_state"), format!("{phys}\n"))?;
            write(&pd.join("rate"), format!("{}\n", rate_text(p)))?;
            let ll = match p.link_layer {
                LinkLayer::Ib => "InfiniBand",
                LinkLayer::Roce => "Ethernet",
            };
            write(&pd.join("link_layer"), format!("{ll}\n"))?;
            write(
                &pd.join("lid"),
                format!("0x{:x}\n", u32::from(bus) * 16 + p.port),
            )?;
            let sm_lid = match (p.link_layer, p.state) {
                (LinkLayer::Roce, _) | (_, ModelPortState::Down) => 0,
                (LinkLayer::Ib, _) => p.sm_lid,
            };
            write(&pd.join("sm_lid"), format!("0x{sm_lid:x}\n"))?;
            write(&pd.join("sm_sl"), "0\n")?;
            self.gid_table(&pd, p, bus, func)?;
            for c in COUNTERS {
                let v = p.counters.get(*c).copied().unwrap_or(0);
                write(&pd.join("counters").join(c), format!("{v}\n"))?;
            }
            for (c, v) in &p.counters {
                write(&pd.join("counters").join(c), format!("{v}\n"))?;
            }
            for c in HW_COUNTERS {
                let v = p.hw_counters.get(*c).copied().unwrap_or(0);
                write(&pd.join("hw_counters").join(c), format!("{v}\n"))?;
            }
            for (c, v) in &p.hw_counters {
                write(&pd.join("hw_counters").join(c), format!("{v}\n"))?;
            }
            if let Some(netdev) = &p.netdev {
                let nd = pci_dir.join("net").join(netdev);
                write(&nd.join("dev_port"), format!("{}\n", p.port - 1))?;
                let oper = if p.state == ModelPortState::Active {
                    "up"
                } else {
                    "down"
                };
                write(&nd.join("operstate"), format!("{oper}\n"))?;
                write(&nd.join("mtu"), format!("{}\n", p.netdev_mtu()))?;
                self.class_net_link(netdev, &nd)?;
                if let Some(id) = p.vlan {
                    let vlan = format!("{netdev}.{id}");
                    let vd = self.virtual_netdev(&vlan, &format!("{oper}\n"), p.netdev_mtu())?;
                    symlink(
                        &relative(&vd, nd.strip_prefix(self.root).unwrap_or(nd.as_path())),
                        &self.root.join(&vd).join(format!("lower_{netdev}")),
                    )?;
                }
            }
            if let Some(foreign) = &p.gid_netdev {
                if !self.root.join("sys/class/net").join(foreign).exists() {
                    self.virtual_netdev(foreign, "up\n", 9000)?;
                }
            }
        }
        Ok(())
    }

    /// `sys/class/net/<name>` -> the netdev's directory.
    fn class_net_link(&self, name: &str, dir: &Path) -> Result<(), ModelError> {
        let rel = dir.strip_prefix(self.root).unwrap_or(dir);
        symlink(
            &relative(Path::new("sys/class/net"), rel),
            &self.root.join("sys/class/net").join(name),
        )
    }

    /// A netdev without a PCI device (a VLAN, or some other interface), returned relative to
    /// the root.
    fn virtual_netdev(&self, name: &str, oper: &str, mtu: u32) -> Result<PathBuf, ModelError> {
        let rel = Path::new("sys/devices/virtual/net").join(name);
        let dir = self.root.join(&rel);
        write(&dir.join("operstate"), oper)?;
        write(&dir.join("mtu"), format!("{mtu}\n"))?;
        self.class_net_link(name, &dir)?;
        Ok(rel)
    }

    /// `gids/<i>` with `gid_attrs/{types,ndevs}/<i>` ([`port_gid_table`]). Unused entries are
    /// zero and have no attributes to read.
    fn gid_table(&self, pd: &Path, p: &PortModel, bus: u8, func: usize) -> Result<(), ModelError> {
        let zero = "0000:0000:0000:0000:0000:0000:0000:0000".to_string();
        let entries = port_gid_table(p, bus, func);
        let ndev = match p.link_layer {
            LinkLayer::Ib => None,
            LinkLayer::Roce => p.gid_netdev(),
        };
        for (i, e) in entries.iter().enumerate() {
            let Some((gid, gid_type)) = e else {
                write(&pd.join("gids").join(i.to_string()), format!("{zero}\n"))?;
                continue;
            };
            write(&pd.join("gids").join(i.to_string()), format!("{gid}\n"))?;
            let attrs = pd.join("gid_attrs");
            write(
                &attrs.join("types").join(i.to_string()),
                format!("{gid_type}\n"),
            )?;
            if let Some(n) = &ndev {
                write(&attrs.join("ndevs").join(i.to_string()), format!("{n}\n"))?;
            }
        }
        Ok(())
    }
}

/// The node GUID of the HCA at PCI function `func` of bus `bus`.
fn node_guid(bus: u8, func: usize) -> String {
    format!("b83f:d203:00{bus:02x}:{func:04x}")
}

/// Slots of a port's GID table written to sysfs.
pub(crate) const GID_TABLE_SIZE: usize = 8;

/// A port's GID table, slot `i` at position `i` (`None`: unused), each used slot its GID as the
/// kernel prints it and its `gid_attrs/types` text. An InfiniBand port has its port GID; an
/// Ethernet port a RoCE v1 and a v2 GID per address of its netdev, link-local first, then
/// IPv4-mapped, as the kernel's GID cache sets them up for mlx5
/// (`../shared/fixtures/ibv_devinfo/`). The HCA is the one at PCI function `func` of bus `bus`
/// ([`hca_locations`]). The simulated RDMA engine chooses its GID from the same table.
pub(crate) fn port_gid_table(
    p: &PortModel,
    bus: u8,
    func: usize,
) -> Vec<Option<(String, &'static str)>> {
    let mut entries: Vec<Option<(String, &'static str)>> = vec![None; GID_TABLE_SIZE];
    match p.link_layer {
        LinkLayer::Ib => {
            entries[0] = Some((
                format!("fe80:0000:0000:0000:{}", node_guid(bus, func)),
                "IB/RoCE v1",
            ))
        }
        LinkLayer::Roce => {
            let link_local = format!("fe80:0000:0000:0000:ba3f:d2ff:fe{bus:02x}:{func:04x}");
            let ipv4 = format!(
                "0000:0000:0000:0000:0000:ffff:0a{bus:02x}:{:02x}{:02x}",
                func & 0xff,
                p.port & 0xff
            );
            let v2 = p.roce_gids == RoceGids::V1AndV2;
            if p.roce_gids != RoceGids::None {
                entries[0] = Some((link_local.clone(), "IB/RoCE v1"));
                entries[2] = Some((ipv4.clone(), "IB/RoCE v1"));
            }
            if v2 {
                entries[1] = Some((link_local, "RoCE v2"));
                entries[3] = Some((ipv4, "RoCE v2"));
            }
        }
    }
    entries
}

/// Where [`write_sysfs`] puts each HCA: its PCI bus and function, by HCA name. The same walk
/// and bus numbering as the writer's (host bridge bus + 1 onwards, a bus per root port, per
/// switch and per switch port), without writing anything.
pub(crate) fn hca_locations(model: &NodeModel) -> BTreeMap<String, (u8, usize)> {
    fn node(n: &PciNodeModel, bus: u16, next: &mut u16, out: &mut BTreeMap<String, (u8, usize)>) {
        match n {
            PciNodeModel::Switch(s) => {
                // The switch's internal bus, then one per downstream port.
                *next += 1;
                for child in &s.children {
                    let sec = *next;
                    *next += 1;
                    node(child, sec, next, out);
                }
            }
            PciNodeModel::Gpu(_) => {}
            PciNodeModel::Hca(h) => {
                out.insert(h.name.clone(), (bus as u8, 0));
            }
            PciNodeModel::Nic(nic) => {
                for (f, h) in nic.functions.iter().enumerate() {
                    out.insert(h.name.clone(), (bus as u8, f));
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for socket in &model.sockets {
        for hb in &socket.host_bridges {
            let mut next = u16::from(hb.bus) + 1;
            for child in &hb.children {
                let sec = next;
                next += 1;
                node(child, sec, &mut next, &mut out);
            }
        }
    }
    out
}

/// Writes the sysfs tree of `model` under `root` (created if needed).
pub fn write_sysfs(model: &NodeModel, root: &Path) -> Result<SimulatedTree, ModelError> {
    model.validate()?;
    fs::create_dir_all(root).map_err(io(root))?;
    fs::create_dir_all(root.join("sys/bus/pci/devices")).map_err(io(root))?;
    fs::create_dir_all(root.join("sys/class/infiniband")).map_err(io(root))?;
    fs::create_dir_all(root.join("sys/class/iommu")).map_err(io(root))?;
    let mut w = Writer {
        root,
        model,
        tree: SimulatedTree::default(),
        next_bus: 0,
        domain: 0,
        numa: 0,
    };
    for socket in &model.sockets {
        w.numa = i32::try_from(socket.numa).unwrap_or(0);
        for hb in &socket.host_bridges {
            w.domain = hb.domain;
            w.next_bus = u16::from(hb.bus) + 1;
            let hb_dir = root
                .join("sys/devices")
                .join(format!("pci{:04x}:{:02x}", hb.domain, hb.bus));
            fs::create_dir_all(&hb_dir).map_err(io(&hb_dir))?;
            for (i, child) in hb.children.iter().enumerate() {
                let rp = w.addr(hb.bus, u8::try_from(i + 1).unwrap_or(0x1f).min(0x1f), 0);
                let rp_dir = w.bridge(&hb_dir, &rp, 0x2030, &LinkModel::default(), false)?;
                let sec = w.alloc_bus()?;
                w.node(&rp_dir, sec, child)?;
            }
        }
    }
    // Platform.
    let p = &model.platform;
    let s = &model.software;
    let cmdline = p.cmdline.clone().unwrap_or_else(|| {
        let base = format!(
            "BOOT_IMAGE=/boot/vmlinuz-{} root=/dev/nvme0n1p2 ro",
            s.kernel
        );
        match p.iommu {
            IommuMode::Off => base,
            IommuMode::Passthrough => format!("{base} intel_iommu=on iommu=pt"),
            IommuMode::Translated => format!("{base} intel_iommu=on"),
        }
    });
    write(&root.join("proc/cmdline"), format!("{cmdline}\n"))?;
    write(
        &root.join("proc/sys/kernel/osrelease"),
        format!("{}\n", s.kernel),
    )?;
    if p.iommu != IommuMode::Off {
        for (i, _) in model.sockets.iter().enumerate() {
            let unit = format!("dmar{i}");
            let target = root.join("sys/devices/virtual/iommu").join(&unit);
            fs::create_dir_all(&target).map_err(io(&target))?;
            symlink(
                &Path::new("../../devices/virtual/iommu").join(&unit),
                &root.join("sys/class/iommu").join(&unit),
            )?;
        }
    }
    if p.nvidia_driver {
        write(
            &root.join("sys/module/nvidia/version"),
            format!("{}\n", s.driver),
        )?;
        let flavour = if p.open_kernel_module {
            "NVIDIA UNIX Open Kernel Module for x86_64"
        } else {
            "NVIDIA UNIX x86_64 Kernel Module"
        };
        write(
            &root.join("proc/driver/nvidia/version"),
            format!(
                "NVRM version: {flavour}  {}  Release Build\nGCC version:  gcc version 12.3.0\n",
                s.driver
            ),
        )?;
    }
    if p.nvidia_peermem {
        write(
            &root.join("sys/module/nvidia_peermem/version"),
            format!("{}\n", s.driver),
        )?;
    }
    let mut resolved = model.clone();
    resolved.base = None;
    resolved.faults.clear();
    let yaml = serde_yaml_ng::to_string(&resolved).map_err(|source| ModelError::Yaml {
        path: SIM_MODEL_PATH.into(),
        source,
    })?;
    write(&root.join(SIM_MODEL_PATH), yaml)?;
    Ok(w.tree)
}

/// Where a simulated tree keeps its resolved node model, relative to the tree's root.
pub const SIM_MODEL_PATH: &str = "railguard-sim/model.yaml";

/// Adds each port's `counter_growth` once to its counter files (one simulated run).
pub fn bump_counters(model: &NodeModel, root: &Path) -> Result<(), ModelError> {
    for h in model.hcas() {
        for p in &h.ports {
            let pd = root
                .join("sys/class/infiniband")
                .join(&h.name)
                .join("ports")
                .join(p.port.to_string());
            for (counter, growth) in &p.counter_growth {
                let hw = pd.join("hw_counters").join(counter);
                let file = if hw.exists() {
                    hw
                } else {
                    pd.join("counters").join(counter)
                };
                let now: u64 = fs::read_to_string(&file)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                write(&file, format!("{}\n", now.saturating_add(*growth)))?;
            }
        }
    }
    Ok(())
}
