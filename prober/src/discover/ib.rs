//! RDMA devices from `sys/class/infiniband`: PCI parent, ports, netdevs, counters.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use railguard_api::LinkLayer;

use super::pci::{is_pci_address, junk_file, read_parsed, read_text};
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
        let fw_ver = read_text(&hdir.join("fw_ver"), &name, &mut problems);
        let node_guid = read_text(&hdir.join("node_guid"), &name, &mut problems);
        let sriov_vfs = read_virtfns(&device_link);
        hcas.push(Hca {
            name: name.clone(),
            pci_bus_id,
            numa,
            fw_ver,
            node_guid,
            ports,
            sriov_vfs,
        });
    }
    (hcas, problems)
}

/// The PCI addresses of a physical function's SR-IOV virtual functions: the kernel links
/// each as `virtfn<N>` in the PF's device directory (`drivers/pci/iov.c`,
/// `pci_iov_sysfs_link`), in VF-number order.
fn read_virtfns(device: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(device) else {
        return Vec::new();
    };
    let mut vfs: Vec<(u64, String)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n: u64 = name.strip_prefix("virtfn")?.parse().ok()?;
            let target = fs::read_link(e.path()).ok()?;
            let addr = target.file_name()?.to_string_lossy().into_owned();
            is_pci_address(&addr).then_some((n, addr))
        })
        .collect();
    vfs.sort();
    vfs.into_iter().map(|(_, a)| a).collect()
}

/// `mlx5_10` sorts after `mlx5_9`.
pub(crate) fn natural_key(s: &str) -> (String, u64) {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = s.split_at(s.len() - digits);
    (head.to_string(), tail.parse().unwrap_or(0))
}

/// The counters under `dir`. A counter the kernel cannot read (`N/A (no PMA)`) is left out;
/// one that holds anything but a number is a finding, never a silent gap (the physical-layer
/// counters are judged, junk included, by the fabric checks of the rails: not twice).
fn read_counters(dir: &Path, subject: &str, problems: &mut Vec<Finding>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let physical = dir.ends_with("counters")
                && super::fabric::PHYSICAL_COUNTERS
                    .iter()
                    .any(|c| c.name == name);
            let mut ignored = Vec::new();
            let report = if physical {
                &mut ignored
            } else {
                &mut *problems
            };
            let value = read_parsed(&e.path(), subject, "a counter", report, |t| {
                if t.starts_with("N/A") {
                    return Ok(None);
                }
                t.parse::<u64>().map(Some).map_err(|_| ())
            });
            if let Some(v) = value {
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
    let subject = format!("{hca}:{port}");
    let state = read_parsed(
        &pdir.join("state"),
        &subject,
        "a port state",
        problems,
        |t| {
            match PortState::from_sysfs(t) {
                // `0: NOP` is the kernel's own "no state".
                PortState::Unknown if t.rsplit(':').next().map(str::trim) == Some("NOP") => {
                    Ok(None)
                }
                PortState::Unknown => Err(()),
                s => Ok(Some(s)),
            }
        },
    )
    .unwrap_or(PortState::Unknown);
    let rate_gbps = read_parsed(&pdir.join("rate"), &subject, "a link rate", problems, |t| {
        parse_rate(t).map(Some).ok_or(())
    });
    let link_layer = read_parsed(
        &pdir.join("link_layer"),
        &subject,
        "a link layer",
        problems,
        |t| {
            match LinkLayer::from_sysfs(t) {
                Some(l) => Ok(Some(l)),
                // ib_core's own answer for a port it cannot tell.
                None if t == "Unknown" => Ok(None),
                None => Err(()),
            }
        },
    );
    let netdev = netdev_for_port(hdir, port, &subject, problems);
    let fabric = super::fabric::read_port_fabric(root, hdir, &pdir, link_layer, netdev.as_deref());
    HcaPort {
        port,
        state,
        phys_state: read_text(&pdir.join("phys_state"), &subject, problems),
        rate_gbps,
        link_layer,
        gid0: read_text(&pdir.join("gids/0"), &subject, problems),
        netdev,
        counters: read_counters(&pdir.join("counters"), &subject, problems),
        hw_counters: read_counters(&pdir.join("hw_counters"), &subject, problems),
        fabric,
    }
}

/// The netdev under `device/net` whose `dev_port` (0-based) matches the port; with a single
/// netdev and no readable `dev_port`, that one. A `dev_port` that is not a number is a
/// [`junk_file`] finding.
fn netdev_for_port(
    hdir: &Path,
    port: u32,
    subject: &str,
    problems: &mut Vec<Finding>,
) -> Option<String> {
    let entries = fs::read_dir(hdir.join("device/net")).ok()?;
    let mut all: Vec<(String, Option<u32>)> = entries
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let dev_port = read_parsed(
                &e.path().join("dev_port"),
                subject,
                "a port number",
                problems,
                |t| t.parse().map(Some).map_err(|_| ()),
            );
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

/// Reads one port of one RDMA device (for passive rail checks). A file of the port that
/// holds junk (a rate, state, link layer or counter that does not parse, a file that is not
/// UTF-8) is an error naming the file and its content; absent files are `None` or left out.
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
    let mut problems = Vec::new();
    let read = read_port_dir(root, &hdir, hca, port, &mut problems);
    // The physical-layer counters are read (and reported) by the fabric checks.
    let counters = hdir.join("ports").join(port.to_string()).join("counters");
    for (name, value) in &read.fabric.physical_counters {
        if let super::attr::Attr::Junk(text) = value {
            problems.push(junk_file(hca, &counters.join(name), "a counter", text));
        }
    }
    match problems.into_iter().next() {
        None => Ok(read),
        Some(f) => Err(DiscoverError::Junk { message: f.message }),
    }
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
