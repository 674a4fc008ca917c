//! The plugin's decisions: what to answer NCCL for each variable, from plain data only.

use std::collections::{BTreeMap, BTreeSet};

use crate::gpus::visible_gpus;
use crate::node_file::{normalize_pci_address, NodeFile, OnUnhealthy, Rail, RailHealth, Verdict};
use crate::view::{natural_key, ContainerView, RdmaDevice};

/// `NCCL_IB_HCA`: the answered rails in exact-match form.
pub const NCCL_IB_HCA: &str = "NCCL_IB_HCA";
pub const NCCL_IB_GID_INDEX: &str = "NCCL_IB_GID_INDEX";
pub const NCCL_SOCKET_IFNAME: &str = "NCCL_SOCKET_IFNAME";
pub const NCCL_IB_TC: &str = "NCCL_IB_TC";
pub const NCCL_IB_SL: &str = "NCCL_IB_SL";

/// How loud a message is; the FFI shell maps it onto NCCL's logger levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub level: Level,
    pub text: String,
}

/// A rail the plugin answers: the node file's rail and the device that reaches it here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnsweredRail {
    /// The node file's rail id (host names), `mlx5_0:1`.
    pub rail: String,
    /// The RDMA device as this container names it.
    pub device: String,
    pub port: u32,
}

/// Everything `init` decides, cached for `getEnv`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers {
    /// The variables the plugin answers itself; every other one is the process environment's.
    pub values: BTreeMap<String, String>,
    /// The rails behind `NCCL_IB_HCA` (empty when nothing is answered).
    pub rails: Vec<AnsweredRail>,
    /// What to log at `init`.
    pub messages: Vec<Message>,
    /// `Some(reason)`: `init` fails (`onUnhealthy: Fail`).
    pub init_error: Option<String>,
}

impl Answers {
    /// The plugin's own answer for `name`, `None` for the process environment's.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Answers nothing itself, after one warning: the shell's answer to any error.
    pub fn pass_through(warning: String) -> Answers {
        Answers {
            messages: vec![Message {
                level: Level::Warn,
                text: warning,
            }],
            ..Answers::default()
        }
    }

    fn info(&mut self, text: String) {
        self.messages.push(Message {
            level: Level::Info,
            text,
        });
    }

    fn warn(&mut self, text: String) {
        self.messages.push(Message {
            level: Level::Warn,
            text,
        });
    }
}

/// Decides the answers for a process whose environment is `env`, on the node `node_file`
/// describes, in the container `view` shows, at `now`.
///
/// - `NCCL_IB_HCA` = the healthy rails ∩ the rails this container reaches (its own device
///   or an SR-IOV VF of the rail's PF, by PCI address; by netdev where the device's PCI
///   address is unknown) ∩ the rails serving the GPUs this process sees, as `=dev:port,…`
///   in the container's device names, in natural order of the host's HCA names;
/// - `NCCL_IB_GID_INDEX` when every answered rail has the same proven index;
/// - `NCCL_SOCKET_IFNAME`, `NCCL_IB_TC`, `NCCL_IB_SL` and the profile's other pairs;
/// - a variable the container already sets (non-empty) keeps its value unless
///   `nccl.enforce`; then it is replaced, and logged;
/// - a failed, pending or expired certificate, no usable rail, or fewer than the fleet's
///   consistent rail count: a warning, and nothing answered (`Warn`) or `init` failing (`Fail`).
pub fn answer(
    node_file: &NodeFile,
    view: &ContainerView,
    env: &dyn Fn(&str) -> Option<String>,
    now: jiff::Timestamp,
) -> Answers {
    let mut out = Answers::default();
    let cert = &node_file.certificate;
    let mut problems = Vec::new();
    match cert.verdict {
        Verdict::Certified | Verdict::Degraded => {}
        Verdict::Failed => problems.push(format!(
            "certificate generation {} is failed",
            cert.generation
        )),
        Verdict::Pending => problems.push(format!(
            "certificate generation {} is pending (the node is not certified yet)",
            cert.generation
        )),
    }
    if cert.expires_at <= now {
        problems.push(format!(
            "certificate generation {} expired at {}",
            cert.generation, cert.expires_at
        ));
    }

    // Rail ids serving the GPUs this process sees; None: the node file lists no GPUs.
    let served: Option<BTreeSet<&str>> = if node_file.gpus.is_empty() {
        out.info("the node file lists no GPUs: rails are not filtered by GPU visibility".into());
        None
    } else {
        let seen = visible_gpus(&node_file.gpus, env);
        for note in seen.notes {
            out.warn(note);
        }
        Some(
            node_file
                .gpus
                .iter()
                .filter(|g| seen.visible.contains(&g.index))
                .filter_map(|g| g.rail.as_deref())
                .collect(),
        )
    };

    let mut rails: Vec<&Rail> = node_file.rails.iter().collect();
    rails.sort_by_key(|r| (natural_key(&r.hca), r.port));
    let rail_pcis: BTreeSet<String> = rails
        .iter()
        .filter_map(|r| r.pci_address.as_deref().and_then(normalize_pci_address))
        .collect();
    let mut usable: Vec<(&Rail, AnsweredRail)> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for rail in &rails {
        let id = rail.id();
        if rail.health != RailHealth::Healthy {
            skipped.push(format!("{id} ({})", health_word(rail.health)));
            continue;
        }
        if served.as_ref().is_some_and(|s| !s.contains(id.as_str())) {
            skipped.push(format!("{id} (serves no GPU this process sees)"));
            continue;
        }
        match reach(rail, view, &rail_pcis) {
            Ok((device, port)) => usable.push((
                rail,
                AnsweredRail {
                    rail: id,
                    device: device.name.clone(),
                    port,
                },
            )),
            Err(why) => skipped.push(format!("{id} ({why})")),
        }
    }
    if !skipped.is_empty() {
        out.info(format!("rails not answered: {}", skipped.join(", ")));
    }
    if usable.is_empty() {
        problems.push(format!(
            "no rail is healthy, visible in this container and serving a GPU this process sees \
             (container devices: {})",
            device_list(view)
        ));
    } else if node_file.nccl.consistent_rails {
        let fleet = node_file
            .fleet
            .as_ref()
            .map_or(0, |f| f.consistent_rail_count as usize);
        // A process seeing part of the node's GPUs is held to the rails serving them.
        let serving = served.as_ref().map_or(node_file.rails.len(), BTreeSet::len);
        let want = fleet.min(serving);
        if usable.len() < want {
            problems.push(format!(
                "consistentRails: every node of the fleet answers {want} rails, this one has {} usable",
                usable.len()
            ));
        } else if usable.len() > want {
            let dropped: Vec<String> = usable[want..].iter().map(|(_, a)| a.rail.clone()).collect();
            out.info(format!(
                "consistentRails: answering {want} rails like the rest of the fleet, not {}",
                dropped.join(", ")
            ));
            usable.truncate(want);
        }
    }

    let node = node_file.node.as_deref().unwrap_or("this node");
    if !problems.is_empty() {
        let why = format!("railguard: {node}: {}", problems.join("; "));
        match node_file.nccl.on_unhealthy {
            OnUnhealthy::Warn => out.warn(format!(
                "{why}; NCCL gets the process environment unchanged (onUnhealthy: Warn)"
            )),
            OnUnhealthy::Fail => {
                out.warn(format!(
                    "{why}; failing NCCL's initialisation (onUnhealthy: Fail)"
                ));
                out.init_error = Some(why);
            }
        }
        return out;
    }

    let mut wanted: BTreeMap<String, String> = BTreeMap::new();
    let hcas: Vec<String> = usable
        .iter()
        .map(|(_, a)| format!("{}:{}", a.device, a.port))
        .collect();
    // `=`: NCCL matches each name exactly instead of as a prefix (mlx5_1 would take mlx5_10).
    wanted.insert(NCCL_IB_HCA.into(), format!("={}", hcas.join(",")));
    let gids: BTreeSet<Option<u32>> = usable.iter().map(|(r, _)| r.gid_index).collect();
    // A rail without a proven index (None) leaves NCCL's automatic choice, quietly.
    if !gids.contains(&None) {
        let proven: Vec<String> = gids.iter().flatten().map(u32::to_string).collect();
        match proven.as_slice() {
            [one] => {
                wanted.insert(NCCL_IB_GID_INDEX.into(), one.clone());
            }
            many => out.warn(format!(
                "the answered rails have different GID indices ({}): NCCL_IB_GID_INDEX is left to NCCL",
                many.join(", ")
            )),
        }
    }
    let nccl = &node_file.nccl;
    if let Some(s) = &nccl.socket_ifname {
        wanted.insert(NCCL_SOCKET_IFNAME.into(), s.clone());
    }
    if let Some(tc) = nccl.traffic_class {
        wanted.insert(NCCL_IB_TC.into(), tc.to_string());
    }
    if let Some(sl) = nccl.service_level {
        wanted.insert(NCCL_IB_SL.into(), sl.to_string());
    }
    for (k, v) in &nccl.env {
        wanted.insert(k.clone(), v.clone());
    }

    for (name, value) in wanted {
        match env(&name).filter(|v| !v.is_empty()) {
            Some(own) if own == value => {
                out.values.insert(name, value);
            }
            Some(own) if nccl.enforce => {
                out.info(format!(
                    "{name}: the container's {own:?} is replaced by {value:?} (enforce)"
                ));
                out.values.insert(name, value);
            }
            Some(own) => out.info(format!(
                "{name}: the container's {own:?} is kept over the node file's {value:?} (enforce is off)"
            )),
            None => {
                out.values.insert(name, value);
            }
        }
    }
    out.rails = usable.into_iter().map(|(_, a)| a).collect();
    let answered: Vec<String> = out.values.iter().map(|(k, v)| format!("{k}={v}")).collect();
    out.info(format!(
        "railguard: {node}: certificate generation {} ({}, expires {}): {}",
        cert.generation,
        verdict_word(cert.verdict),
        cert.expires_at,
        if answered.is_empty() {
            "answering nothing itself".to_string()
        } else {
            format!("answering {}", answered.join(" "))
        }
    ));
    out
}

/// The container device that reaches `rail`, and the port to name.
fn reach<'v>(
    rail: &Rail,
    view: &'v ContainerView,
    rail_pcis: &BTreeSet<String>,
) -> Result<(&'v RdmaDevice, u32), String> {
    let pf = rail.pci_address.as_deref().and_then(normalize_pci_address);
    let by_pci = pf.as_ref().and_then(|pf| {
        view.devices
            .iter()
            .find(|d| d.pci_address.as_ref() == Some(pf) || d.physfn.as_ref() == Some(pf))
    });
    // A netdev only speaks for a device whose PCI function matches no rail at all.
    let by_netdev = || {
        let netdev = rail.netdev.as_ref()?;
        view.devices.iter().find(|d| {
            let pci_known = [&d.pci_address, &d.physfn]
                .iter()
                .any(|a| a.as_ref().is_some_and(|a| rail_pcis.contains(a)));
            !pci_known && d.netdevs.contains(netdev)
        })
    };
    let Some(device) = by_pci.or_else(by_netdev) else {
        return Err("not visible in this container".into());
    };
    if device.ports.is_empty() || device.ports.contains(&rail.port) {
        return Ok((device, rail.port));
    }
    // A VF numbers its one port itself.
    if device.physfn.is_some() && device.ports.len() == 1 {
        return Ok((device, device.ports[0]));
    }
    Err(format!(
        "{} has no port {} in this container",
        device.name, rail.port
    ))
}

fn device_list(view: &ContainerView) -> String {
    if view.devices.is_empty() {
        return "none".into();
    }
    view.devices
        .iter()
        .map(|d| d.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn health_word(h: RailHealth) -> &'static str {
    match h {
        RailHealth::Healthy => "healthy",
        RailHealth::Degraded => "degraded",
        RailHealth::Failed => "failed",
    }
}

fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Certified => "certified",
        Verdict::Degraded => "degraded",
        Verdict::Failed => "failed",
        Verdict::Pending => "pending",
    }
}
