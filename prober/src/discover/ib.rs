//! RDMA devices from `sys/class/infiniband`: PCI parent, ports, netdevs, counters.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use railguard_api::LinkLayer;

use super::pci::{is_pci_address, read_trimmed};
use super::{DiscoverError, Finding, FindingKind, Hca, HcaPort, PciDevice, PortState, Severity};

/// `400 Gb/sec (4X NDR)` -> 400.0; `2.5 Gb/sec (1X SDR)` -> 2.5.
pub(crate) fn parse_rate(s: &str) -> Option<f64> {
    let mut it = s.split_whitespace();
    let v: f64 = it.next()?.parse().ok()?;
    let unit = it.next()?;
    if !unit.starts_with("Gb/s") || !v.is_finite() || v < 0.0 {
        return None;
    }
    Some(v)
}

/// Reads every RDMA device under `root` (PCI addresses resolved; NUMA from the PCI device).
pub fn read_hcas(root: &Path) -> Result<Vec<Hca>, DiscoverError> {
    let (pci, _) = super::pci::read_pci_devices(root)?;
    Ok(read_hcas_with_problems(root, &pci).0)
}

pub(crate) fn read_hcas_with_problems(
    root: &Path,
    pci: &BTreeMap<String, PciDevice>,
) -> (Vec<Hca>, Vec<Finding>) {
    let dir = root.join("sys/class/infiniband");
    let mut hcas = Vec::new();
    let mut problems = Vec::new();
    let Ok(entries) = fs::read_dir(&dir) else {
        return (hcas, problems);
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort_by_key(|a| natural_key(a));
    for name in names {
        let hdir = dir.join(&name);
        // Only the PCI address (the link's last component) is needed: one readlink.
        let device_link = hdir.join("device");
        let pci_bus_id = fs::read_link(&device_link)
            .ok()
            .or_else(|| fs::canonicalize(&device_link).ok())
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .filter(|n| is_pci_address(n));
        let numa = pci_bus_id
            .as_ref()
            .and_then(|a| pci.get(a))
            .and_then(|d| d.numa);
        let mut ports = Vec::new();
        match fs::read_dir(hdir.join("ports")) {
            Ok(entries) => {
                let mut nums: Vec<u32> = entries
                    .flatten()
                    .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
                    .collect();
                nums.sort_unstable();
                for n in nums {
                    ports.push(read_port_dir(root, &hdir, &name, n, &mut problems));
                }
            }
            Err(e) => problems.push(Finding {
                kind: FindingKind::SysfsUnreadable,
                severity: Severity::Warning,
                subject: name.clone(),
                message: format!("RDMA device {name} has no readable ports directory"),
                evidence: vec![format!("{}/ports ({e})", hdir.display())],
            }),
        }
        hcas.push(Hca {
            name: name.clone(),
            pci_bus_id,
            numa,
            fw_ver: read_trimmed(&hdir.join("fw_ver")),
            node_guid: read_trimmed(&hdir.join("node_guid")),
            ports,
        });
    }
    (hcas, problems)
}

/// `mlx5_10` sorts after `mlx5_9`.
pub(crate) fn natural_key(s: &str) -> (String, u64) {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = s.split_at(s.len() - digits);
    (head.to_string(), tail.parse().unwrap_or(0))
}

fn read_counters(dir: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(v) = read_trimmed(&e.path()).and_then(|s| s.parse::<u64>().ok()) {
                out.insert(name, v);
            }
        }
    }
    out
}

fn read_port_dir(
    root: &Path,
    hdir: &Path,
    hca: &str,
    port: u32,
    problems: &mut Vec<Finding>,
) -> HcaPort {
    let pdir = hdir.join("ports").join(port.to_string());
    let state = read_trimmed(&pdir.join("state"))
        .map(|s| PortState::from_sysfs(&s))
        .unwrap_or(PortState::Unknown);
    let rate_text = read_trimmed(&pdir.join("rate"));
    let rate_gbps = rate_text.as_deref().and_then(parse_rate);
    if let (Some(text), None) = (&rate_text, rate_gbps) {
        problems.push(Finding {
            kind: FindingKind::SysfsUnreadable,
            severity: Severity::Warning,
            subject: format!("{hca}:{port}"),
            message: format!("rate of {hca}:{port} is not understood"),
            evidence: vec![format!("{}/rate = {text:?}", pdir.display())],
        });
    }
    let link_layer = read_trimmed(&pdir.join("link_layer")).and_then(|s| LinkLayer::from_sysfs(&s));
    let netdev = netdev_for_port(hdir, port);
    let fabric = super::fabric::read_port_fabric(root, hdir, &pdir, link_layer, netdev.as_deref());
    HcaPort {
        port,
        state,
        phys_state: read_trimmed(&pdir.join("phys_state")),
        rate_gbps,
        link_layer,
        gid0: read_trimmed(&pdir.join("gids/0")),
        netdev,
        counters: read_counters(&pdir.join("counters")),
        hw_counters: read_counters(&pdir.join("hw_counters")),
        fabric,
    }
}

/// The netdev under `device/net` whose `dev_port` (0-based) matches the port; with a single
/// netdev and no `dev_port`, that one.
fn netdev_for_port(hdir: &Path, port: u32) -> Option<String> {
    let entries = fs::read_dir(hdir.join("device/net")).ok()?;
    let mut all: Vec<(String, Option<u32>)> = entries
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let dev_port = read_trimmed(&e.path().join("dev_port")).and_then(|s| s.parse().ok());
            (name, dev_port)
        })
        .collect();
    all.sort();
    if let Some((name, _)) = all.iter().find(|(_, p)| *p == Some(port.saturating_sub(1))) {
        return Some(name.clone());
    }
    match all.as_slice() {
        [(name, None)] => Some(name.clone()),
        _ => None,
    }
}

/// Reads one port of one RDMA device (for passive rail checks).
pub fn read_port(root: &Path, hca: &str, port: u32) -> Result<HcaPort, DiscoverError> {
    let hdir = root.join("sys/class/infiniband").join(hca);
    if !hdir.is_dir() {
        return Err(DiscoverError::NoSuchHca {
            hca: hca.to_string(),
            path: hdir.display().to_string(),
        });
    }
    if !hdir.join("ports").join(port.to_string()).is_dir() {
        return Err(DiscoverError::NoSuchPort {
            hca: hca.to_string(),
            port,
        });
    }
    let mut ignored = Vec::new();
    Ok(read_port_dir(root, &hdir, hca, port, &mut ignored))
}

/// `counters/*` and `hw_counters/*` of a port in one map (hw counters prefixed `hw_` only
/// when a name exists in both).
pub fn read_port_counters(
    root: &Path,
    hca: &str,
    port: u32,
) -> Result<BTreeMap<String, u64>, DiscoverError> {
    let p = read_port(root, hca, port)?;
    let mut out = p.counters;
    for (k, v) in p.hw_counters {
        if out.contains_key(&k) {
            out.insert(format!("hw_{k}"), v);
        } else {
            out.insert(k, v);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("400 Gb/sec (4X NDR)"), Some(400.0));
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)"), Some(2.5));
        assert_eq!(parse_rate("fast"), None);
        assert_eq!(parse_rate("400"), None);
    }

    #[test]
    fn names_sort_naturally() {
        let mut v = vec!["mlx5_10", "mlx5_9", "mlx5_1"];
        v.sort_by_key(|a| natural_key(a));
        assert_eq!(v, ["mlx5_1", "mlx5_9", "mlx5_10"]);
    }
}
