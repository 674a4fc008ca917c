//! Loading models (with `base:` overlays), applying faults, validating.

use std::collections::BTreeSet;
use std::path::Path;

use super::builtin::{builtin_model, builtin_names};
use super::model::{
    Fault, GpuModel, HcaModel, ModelPortState, NodeModel, PciNodeModel, PortModel, SwitchModel,
};
use super::sysfs::HW_COUNTERS;
use super::ModelError;

impl NodeModel {
    /// Loads a model file, resolving `base:` (relative to the file) and applying `faults:`.
    /// The result has no `base` and no pending `faults`.
    pub fn load(path: &Path) -> Result<NodeModel, ModelError> {
        load_file(path, 0)
    }

    /// Loads a model built into this crate ([`crate::BUILTIN_MODELS`]) by name, resolving
    /// `base:` among the built-in models and applying `faults:`.
    pub fn builtin(name: &str) -> Result<NodeModel, ModelError> {
        load_builtin(name, 0)
    }

    /// Parses a self-contained model (no `base:`) and applies its faults.
    pub fn from_yaml(text: &str) -> Result<NodeModel, ModelError> {
        let m: NodeModel = serde_yaml_ng::from_str(text).map_err(|source| ModelError::Yaml {
            path: "<inline>".into(),
            source,
        })?;
        if m.base.is_some() {
            return Err(ModelError::Invalid {
                model: m.name,
                message: "a model with base: must be loaded from a file".into(),
            });
        }
        m.settle()
    }

    /// Applies one fault.
    pub fn apply(&mut self, fault: &Fault) -> Result<(), ModelError> {
        let name = self.name.clone();
        let missing = |what: &str| ModelError::Invalid {
            model: name.clone(),
            message: format!("fault {fault:?}: no {what} in the model"),
        };
        match fault {
            Fault::HcaFarSocket { hca } => {
                let from = (0..self.sockets.len())
                    .find(|s| {
                        self.sockets[*s]
                            .host_bridges
                            .iter()
                            .any(|hb| hb.children.iter().any(|c| contains_hca(c, hca)))
                    })
                    .ok_or_else(|| missing(&format!("HCA {hca}")))?;
                if self.sockets.len() < 2 {
                    return Err(ModelError::Invalid {
                        model: name,
                        message: "hca-far-socket needs two sockets".into(),
                    });
                }
                let mut taken = None;
                for hb in &mut self.sockets[from].host_bridges {
                    for c in &mut hb.children {
                        if taken.is_none() {
                            taken = take_hca(c, hca);
                        }
                    }
                    if taken.is_none() {
                        if let Some(i) = hb.children.iter().position(|c| is_hca_node(c, hca)) {
                            taken = Some(hb.children.remove(i));
                        }
                    }
                }
                let node = taken.ok_or_else(|| missing(&format!("HCA {hca}")))?;
                let to = (from + 1) % self.sockets.len();
                let hb = self.sockets[to]
                    .host_bridges
                    .first_mut()
                    .ok_or_else(|| missing("host bridge on the far socket"))?;
                hb.children.push(node);
            }
            Fault::PortDown { hca, port } => {
                let p = self
                    .port_mut(hca, *port)
                    .ok_or_else(|| missing(&format!("{hca}:{port}")))?;
                p.state = ModelPortState::Down;
            }
            Fault::PortRate {
                hca,
                port,
                rate_gbps,
            } => {
                let p = self
                    .port_mut(hca, *port)
                    .ok_or_else(|| missing(&format!("{hca}:{port}")))?;
                p.rate_gbps = *rate_gbps;
            }
            Fault::PcieWidth { device, width } => {
                let link = self.link_mut(device).ok_or_else(|| missing(device))?;
                link.width = *width;
            }
            Fault::PcieSpeed { device, speed_gts } => {
                let link = self.link_mut(device).ok_or_else(|| missing(device))?;
                link.speed_gts = *speed_gts;
            }
            Fault::AcsRedirect { switch } => {
                let sw = self
                    .switch_mut(switch)
                    .ok_or_else(|| missing(&format!("switch {switch}")))?;
                sw.acs_redirect = true;
            }
            Fault::NumaUnknown { device } => {
                if let Some(g) = self.gpu_mut(device) {
                    g.numa_node = Some(-1);
                } else if let Some(h) = self.hca_mut(device) {
                    h.numa_node = Some(-1);
                } else {
                    return Err(missing(device));
                }
            }
            Fault::CounterGrowth {
                hca,
                port,
                counter,
                per_run,
            } => {
                let p = self
                    .port_mut(hca, *port)
                    .ok_or_else(|| missing(&format!("{hca}:{port}")))?;
                p.counter_growth.insert(counter.clone(), *per_run);
            }
            Fault::CounterValue {
                hca,
                port,
                counter,
                value,
            } => {
                let p = self
                    .port_mut(hca, *port)
                    .ok_or_else(|| missing(&format!("{hca}:{port}")))?;
                if HW_COUNTERS.contains(&counter.as_str()) {
                    p.hw_counters.insert(counter.clone(), *value);
                } else {
                    p.counters.insert(counter.clone(), *value);
                }
            }
            Fault::NoSubnetManager { hca, port } => {
                let p = self
                    .port_mut(hca, *port)
                    .ok_or_else(|| missing(&format!("{hca}:{port}")))?;
                p.sm_lid = 0;
            }
            Fault::RoceGids { hca, port, gids } => {
                let p = self
                    .port_mut(hca, *port)
                    .ok_or_else(|| missing(&format!("{hca}:{port}")))?;
                p.roce_gids = *gids;
            }
            Fault::GidNetdev { hca, port, netdev } => {
                let p = self
                    .port_mut(hca, *port)
                    .ok_or_else(|| missing(&format!("{hca}:{port}")))?;
                p.gid_netdev = Some(netdev.clone());
            }
            Fault::NetdevMtu { hca, port, mtu } => {
                let p = self
                    .port_mut(hca, *port)
                    .ok_or_else(|| missing(&format!("{hca}:{port}")))?;
                p.mtu = Some(*mtu);
            }
            Fault::PortBandwidth { hca, port, percent } => {
                if !(percent.is_finite() && *percent > 0.0 && *percent <= 100.0) {
                    return Err(ModelError::Invalid {
                        model: name.clone(),
                        message: format!(
                            "port-bandwidth on {hca}:{port}: percent must be in (0, 100], got {percent}"
                        ),
                    });
                }
                let p = self
                    .port_mut(hca, *port)
                    .ok_or_else(|| missing(&format!("{hca}:{port}")))?;
                let share = percent / 100.0;
                p.write_bw_gbps.host = Some(p.simulated_write_bw_gbps(false) * share);
                p.write_bw_gbps.gpu = Some(p.simulated_write_bw_gbps(true) * share);
            }
        }
        Ok(())
    }

    /// Checks the model for mistakes the generator cannot recover from.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |message: String| ModelError::Invalid {
            model: self.name.clone(),
            message,
        };
        if self.sockets.is_empty() {
            return Err(bad("no sockets".into()));
        }
        let mut numas = BTreeSet::new();
        let mut buses = BTreeSet::new();
        for s in &self.sockets {
            if !numas.insert(s.numa) {
                return Err(bad(format!("NUMA node {} listed twice", s.numa)));
            }
            for hb in &s.host_bridges {
                if !buses.insert((hb.domain, hb.bus)) {
                    return Err(bad(format!(
                        "host bridge {:04x}:{:02x} listed twice",
                        hb.domain, hb.bus
                    )));
                }
            }
        }
        let mut gpus = BTreeSet::new();
        for g in self.gpus() {
            if !gpus.insert(g.index) {
                return Err(bad(format!("GPU index {} used twice", g.index)));
            }
        }
        if let Some(max) = gpus.iter().next_back() {
            if (*max as usize) + 1 != gpus.len() {
                return Err(bad("GPU indices must be 0..n without gaps".into()));
            }
        }
        let mut hcas = BTreeSet::new();
        for h in self.hcas() {
            if !hcas.insert(h.name.clone()) {
                return Err(bad(format!("HCA {} listed twice", h.name)));
            }
            if h.name.is_empty() || h.name.contains('/') {
                return Err(bad(format!("invalid HCA name {:?}", h.name)));
            }
            let mut ports = BTreeSet::new();
            for p in &h.ports {
                if p.port == 0 || !ports.insert(p.port) {
                    return Err(bad(format!(
                        "{}: port {} invalid or repeated",
                        h.name, p.port
                    )));
                }
            }
        }
        Ok(())
    }

    /// Every GPU, in tree order.
    pub fn gpus(&self) -> Vec<&GpuModel> {
        let mut out = Vec::new();
        for s in &self.sockets {
            for hb in &s.host_bridges {
                for c in &hb.children {
                    walk(c, &mut |n| {
                        if let PciNodeModel::Gpu(g) = n {
                            out.push(g);
                        }
                    });
                }
            }
        }
        out
    }

    /// Every HCA (each function of a multi-function NIC), in tree order.
    pub fn hcas(&self) -> Vec<&HcaModel> {
        let mut out = Vec::new();
        for s in &self.sockets {
            for hb in &s.host_bridges {
                for c in &hb.children {
                    walk(c, &mut |n| match n {
                        PciNodeModel::Hca(h) => out.push(h),
                        PciNodeModel::Nic(nic) => out.extend(nic.functions.iter()),
                        _ => {}
                    });
                }
            }
        }
        out
    }

    /// A port by HCA name and number.
    pub fn port(&self, hca: &str, port: u32) -> Option<&PortModel> {
        self.hcas()
            .into_iter()
            .find(|h| h.name == hca)
            .and_then(|h| h.ports.iter().find(|p| p.port == port))
    }

    fn roots_mut(&mut self) -> impl Iterator<Item = &mut PciNodeModel> {
        self.sockets
            .iter_mut()
            .flat_map(|s| s.host_bridges.iter_mut())
            .flat_map(|hb| hb.children.iter_mut())
    }

    fn gpu_mut(&mut self, device: &str) -> Option<&mut GpuModel> {
        let idx: u32 = device.strip_prefix("gpu")?.parse().ok()?;
        self.roots_mut().find_map(|c| gpu_in(c, idx))
    }

    fn hca_mut(&mut self, name: &str) -> Option<&mut HcaModel> {
        self.roots_mut().find_map(|c| hca_in(c, name))
    }

    fn switch_mut(&mut self, name: &str) -> Option<&mut SwitchModel> {
        self.roots_mut().find_map(|c| switch_in(c, name))
    }

    fn port_mut(&mut self, hca: &str, port: u32) -> Option<&mut PortModel> {
        self.hca_mut(hca)?.ports.iter_mut().find(|p| p.port == port)
    }

    fn link_mut(&mut self, device: &str) -> Option<&mut super::model::LinkModel> {
        // Decide which kind first (shared borrows), then borrow mutably once.
        let is_gpu = self
            .gpus()
            .iter()
            .any(|g| device.strip_prefix("gpu").and_then(|n| n.parse().ok()) == Some(g.index));
        let is_hca = self.hcas().iter().any(|h| h.name == device);
        if is_gpu {
            self.gpu_mut(device).map(|g| &mut g.link)
        } else if is_hca {
            self.hca_mut(device).map(|h| &mut h.link)
        } else {
            self.switch_mut(device).map(|s| &mut s.link)
        }
    }
}

fn walk<'a>(n: &'a PciNodeModel, f: &mut impl FnMut(&'a PciNodeModel)) {
    f(n);
    if let PciNodeModel::Switch(s) = n {
        for c in &s.children {
            walk(c, f);
        }
    }
}

fn gpu_in(n: &mut PciNodeModel, idx: u32) -> Option<&mut GpuModel> {
    match n {
        PciNodeModel::Gpu(g) if g.index == idx => Some(g),
        PciNodeModel::Switch(s) => s.children.iter_mut().find_map(|c| gpu_in(c, idx)),
        _ => None,
    }
}

fn hca_in<'a>(n: &'a mut PciNodeModel, name: &str) -> Option<&'a mut HcaModel> {
    match n {
        PciNodeModel::Hca(h) if h.name == name => Some(h),
        PciNodeModel::Nic(nic) => nic.functions.iter_mut().find(|h| h.name == name),
        PciNodeModel::Switch(s) => s.children.iter_mut().find_map(|c| hca_in(c, name)),
        _ => None,
    }
}

fn switch_in<'a>(n: &'a mut PciNodeModel, name: &str) -> Option<&'a mut SwitchModel> {
    match n {
        PciNodeModel::Switch(s) => {
            if s.name == name {
                return Some(s);
            }
            s.children.iter_mut().find_map(|c| switch_in(c, name))
        }
        _ => None,
    }
}

fn is_hca_node(n: &PciNodeModel, hca: &str) -> bool {
    match n {
        PciNodeModel::Hca(h) => h.name == hca,
        PciNodeModel::Nic(nic) => nic.functions.iter().any(|h| h.name == hca),
        _ => false,
    }
}

fn contains_hca(n: &PciNodeModel, hca: &str) -> bool {
    let mut found = false;
    walk(n, &mut |c| found |= is_hca_node(c, hca));
    found
}

fn take_hca(n: &mut PciNodeModel, hca: &str) -> Option<PciNodeModel> {
    let PciNodeModel::Switch(s) = n else {
        return None;
    };
    if let Some(i) = s.children.iter().position(|c| is_hca_node(c, hca)) {
        return Some(s.children.remove(i));
    }
    s.children.iter_mut().find_map(|c| take_hca(c, hca))
}

fn deep_merge(base: &mut serde_yaml_ng::Value, over: serde_yaml_ng::Value) {
    match (base, over) {
        (serde_yaml_ng::Value::Mapping(b), serde_yaml_ng::Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => deep_merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

fn load_file(path: &Path, depth: u32) -> Result<NodeModel, ModelError> {
    let shown = path.display().to_string();
    check_depth(&shown, depth)?;
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Read {
        path: shown.clone(),
        source,
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    overlay(&shown, &text, |base| load_file(&dir.join(base), depth + 1))
}

fn load_builtin(name: &str, depth: u32) -> Result<NodeModel, ModelError> {
    check_depth(name, depth)?;
    let text = builtin_model(name).ok_or_else(|| ModelError::Unknown {
        name: name.to_string(),
        known: builtin_names(),
    })?;
    overlay(name, text, |base| load_builtin(base, depth + 1))
}

fn check_depth(shown: &str, depth: u32) -> Result<(), ModelError> {
    if depth > 8 {
        return Err(ModelError::Invalid {
            model: shown.to_string(),
            message: "base: chain deeper than 8 (a cycle?)".into(),
        });
    }
    Ok(())
}

/// Parses `text` (shown as `shown` in errors), merges it over its `base:` (loaded by
/// `load_base`) and applies its faults.
fn overlay(
    shown: &str,
    text: &str,
    load_base: impl FnOnce(&str) -> Result<NodeModel, ModelError>,
) -> Result<NodeModel, ModelError> {
    let yaml_err = |source| ModelError::Yaml {
        path: shown.to_string(),
        source,
    };
    let mut over: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(yaml_err)?;
    let base_name = over
        .get("base")
        .and_then(|b| b.as_str())
        .map(str::to_string);
    let merged = match base_name {
        Some(b) => {
            let base = load_base(&b)?;
            let mut value = serde_yaml_ng::to_value(&base).map_err(yaml_err)?;
            if let serde_yaml_ng::Value::Mapping(m) = &mut over {
                m.remove("base");
            }
            deep_merge(&mut value, over);
            value
        }
        None => over,
    };
    let mut m: NodeModel = serde_yaml_ng::from_value(merged).map_err(yaml_err)?;
    m.base = None;
    m.settle()
}

impl NodeModel {
    /// Applies the pending `faults:` and validates the result.
    fn settle(mut self) -> Result<NodeModel, ModelError> {
        let faults = std::mem::take(&mut self.faults);
        for f in &faults {
            self.apply(f)?;
        }
        self.validate()?;
        Ok(self)
    }
}
