//! The PCI tree from sysfs: every device under `sys/bus/pci/devices`, its bridge path from
//! the canonical path of its directory, link status, NUMA node and (for bridges) ACS state.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use railguard_api::PathType;
use serde::{Deserialize, Serialize};

use super::attr::{read_attr, Attr};
use super::{DiscoverError, Finding, FindingKind, Severity};

/// PCIe link status of a device (`None` = file missing or unreadable).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PcieLink {
    pub current_speed_gts: Option<f64>,
    pub current_width: Option<u32>,
    pub max_speed_gts: Option<f64>,
    pub max_width: Option<u32>,
}

impl PcieLink {
    /// Whether the link trained below its maximum width or speed (only when both are known).
    pub fn is_downgraded(&self) -> bool {
        let width = matches!((self.current_width, self.max_width), (Some(c), Some(m)) if c < m);
        let speed = matches!((self.current_speed_gts, self.max_speed_gts), (Some(c), Some(m)) if c + 0.01 < m);
        width || speed
    }
}

/// ACS state of a bridge, from the ACS extended capability in `config`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum AcsState {
    /// Capability present, P2P Request and Completion Redirect both off.
    Disabled,
    /// Request Redirect or Completion Redirect on: peer-to-peer goes up to the root complex.
    Redirect { control: u16 },
    /// No ACS capability on this bridge.
    NotSupported,
    /// Extended config space not readable (needs root) or malformed.
    Unknown { reason: String },
}

/// A PCI device as read from sysfs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciDevice {
    /// Address, e.g. `0000:1b:00.0`.
    pub address: String,
    pub vendor: Option<u16>,
    pub device: Option<u16>,
    /// 24-bit class code, e.g. 0x030200.
    pub class: Option<u32>,
    /// `None` for -1 (unknown), an unreadable file, or a bridge (not read).
    pub numa: Option<u32>,
    /// Host bridge directory, e.g. `pci0000:15`.
    pub host_bridge: String,
    /// Bridges from the root port down to (not including) this device.
    pub bridges: Vec<String>,
    /// Not read for bridges (left unknown).
    pub link: PcieLink,
    /// Only read for bridges (class 0x0604).
    pub acs: Option<AcsState>,
}

impl PciDevice {
    /// NVIDIA display or 3D controller.
    pub fn is_gpu(&self) -> bool {
        self.vendor == Some(0x10de)
            && matches!(self.class.map(|c| c >> 8), Some(0x0300) | Some(0x0302))
    }

    /// PCI-to-PCI bridge.
    pub fn is_bridge(&self) -> bool {
        self.class.map(|c| c >> 8) == Some(0x0604)
    }
}

/// PCIe distance between two devices, as NCCL and `nvidia-smi topo -m` classify it.
///
/// Switch ports show up in sysfs as bridges (one upstream port, one per downstream port),
/// so a path through one switch crosses at most three bridges (down port, up port, down
/// port): PIX. More bridges below a common one: PXB. No common bridge on one host bridge:
/// PHB. Different host bridges: NODE when both NUMA nodes are known and equal, else SYS
/// (an unknown NUMA node is never assumed local).
pub fn classify_path(a: &PciDevice, b: &PciDevice) -> PathType {
    if a.host_bridge != b.host_bridge {
        return match (a.numa, b.numa) {
            (Some(x), Some(y)) if x == y => PathType::Node,
            _ => PathType::Sys,
        };
    }
    let common = a
        .bridges
        .iter()
        .zip(&b.bridges)
        .take_while(|(x, y)| x == y)
        .count();
    if common == 0 {
        return PathType::Phb;
    }
    // Bridges crossed: the ones below the common bridge on each side, plus the common one.
    let crossed = (a.bridges.len() - common) + (b.bridges.len() - common) + 1;
    if crossed <= 3 {
        PathType::Pix
    } else {
        PathType::Pxb
    }
}

/// A file that holds something discovery does not understand: a `sysfs-unreadable` finding
/// naming the file, what was expected and what it holds.
pub(crate) fn junk_file(subject: &str, path: &Path, expected: &str, content: &str) -> Finding {
    Finding {
        kind: FindingKind::SysfsUnreadable,
        severity: Severity::Warning,
        subject: subject.to_string(),
        message: format!("{} is not {expected}: {content:?}", path.display()),
        evidence: vec![format!("{} = {content:?}", path.display())],
    }
}

/// Reads and parses an attribute: `None` when absent or when `parse` says the value means
/// "not known" (`Ok(None)`); junk or text `parse` rejects is a [`junk_file`] finding (and
/// `None`), never a silent unknown.
pub(crate) fn read_parsed<T>(
    path: &Path,
    subject: &str,
    expected: &str,
    problems: &mut Vec<Finding>,
    parse: impl FnOnce(&str) -> Result<Option<T>, ()>,
) -> Option<T> {
    let text = match read_attr(path) {
        Attr::Absent => return None,
        Attr::Junk(j) => {
            problems.push(junk_file(subject, path, expected, &j));
            return None;
        }
        Attr::Value(text) => text,
    };
    match parse(&text) {
        Ok(v) => v,
        Err(()) => {
            problems.push(junk_file(subject, path, expected, &text));
            None
        }
    }
}

/// Reads a text attribute (firmware version, GUID, `phys_state`): `None` when absent; junk
/// (not UTF-8, unreadable) is a [`junk_file`] finding.
pub(crate) fn read_text(path: &Path, subject: &str, problems: &mut Vec<Finding>) -> Option<String> {
    read_parsed(path, subject, "text", problems, |t| Ok(Some(t.to_string())))
}

fn parse_hex_u32(s: &str) -> Option<u32> {
    let s = s.trim();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u32::from_str_radix(s, 16).ok()
}

/// `32.0 GT/s PCIe`, `16 GT/s`, `2.5 GT/s` -> GT/s; `Unknown speed` -> None.
pub(crate) fn parse_link_speed(s: &str) -> Option<f64> {
    let first = s.split_whitespace().next()?;
    let v: f64 = first.parse().ok()?;
    (v.is_finite() && v > 0.0).then_some(v)
}

/// A `*_link_speed` file: GT/s, `Ok(None)` for the kernel's `Unknown` / `Unknown speed`
/// (`pci_speed_string`), `Err` for anything else.
fn link_speed(s: &str) -> Result<Option<f64>, ()> {
    if s == "Unknown" || s == "Unknown speed" {
        return Ok(None);
    }
    let unit = s.split_whitespace().nth(1);
    match parse_link_speed(s) {
        Some(v) if unit == Some("GT/s") => Ok(Some(v)),
        _ => Err(()),
    }
}

/// A `*_link_width` file: lanes, `Ok(None)` for 0 (the kernel prints the field as read; 0 is
/// no link trained), `Err` for anything but a number.
fn link_width(s: &str) -> Result<Option<u32>, ()> {
    match s.parse::<u32>() {
        Ok(0) => Ok(None),
        Ok(w) => Ok(Some(w)),
        Err(_) => Err(()),
    }
}

/// Whether a name is a PCI address `dddd:bb:dd.f`.
pub(crate) fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// Resolves a sysfs symlink lexically (one `readlink` instead of a `canonicalize` walk over
/// a dozen components); sysfs links are relative and point at real directories. Falls back
/// to `canonicalize` for anything unusual.
pub(crate) fn resolve_link(link: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let Ok(target) = fs::read_link(link) else {
        return fs::canonicalize(link).ok();
    };
    if target.is_absolute() {
        return fs::canonicalize(link).ok();
    }
    let mut out = link.parent()?.to_path_buf();
    for c in target.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    Some(out)
}

/// Where a canonical sysfs device path sits in the PCI tree: host bridge and bridges.
fn tree_position(rel: &Path) -> Option<(String, Vec<String>)> {
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let hb = parts
        .iter()
        .position(|p| p.starts_with("pci") && p.contains(':'))?;
    let chain: Vec<String> = parts[hb + 1..]
        .iter()
        .filter(|p| is_pci_address(p))
        .cloned()
        .collect();
    let (_, bridges) = chain.split_last()?;
    Some((parts[hb].clone(), bridges.to_vec()))
}

/// Reads the ACS control register from a `config` file's extended capabilities.
pub fn acs_from_config(config: &[u8]) -> AcsState {
    if config.len() < 0x104 {
        return AcsState::Unknown {
            reason: format!(
                "only {} bytes of config space readable (extended space needs CAP_SYS_ADMIN)",
                config.len()
            ),
        };
    }
    let mut offset = 0x100usize;
    // Bounded walk: at most 64 capabilities, offsets must move forward and stay in range.
    for _ in 0..64 {
        if offset + 8 > config.len() {
            return AcsState::Unknown {
                reason: format!("extended capability at {offset:#x} runs past config space"),
            };
        }
        let header = u32::from_le_bytes([
            config[offset],
            config[offset + 1],
            config[offset + 2],
            config[offset + 3],
        ]);
        let id = header & 0xffff;
        if header == 0 || header == 0xffff_ffff {
            return AcsState::NotSupported;
        }
        if id == 0x000d {
            let control = u16::from_le_bytes([config[offset + 6], config[offset + 7]]);
            // Bit 2: P2P Request Redirect, bit 3: P2P Completion Redirect.
            return if control & 0b1100 != 0 {
                AcsState::Redirect { control }
            } else {
                AcsState::Disabled
            };
        }
        let next = (header >> 20) as usize & 0xffc;
        if next == 0 {
            return AcsState::NotSupported;
        }
        if next <= offset {
            return AcsState::Unknown {
                reason: format!("extended capability list loops at {offset:#x}"),
            };
        }
        offset = next;
    }
    AcsState::Unknown {
        reason: "extended capability list too long".into(),
    }
}

/// Reads every PCI device under `root/sys/bus/pci/devices`. Per-device problems (junk
/// files, broken links) become findings; only a missing directory is an error.
pub fn read_pci_devices(
    root: &Path,
) -> Result<(BTreeMap<String, PciDevice>, Vec<Finding>), DiscoverError> {
    let dir = root.join("sys/bus/pci/devices");
    let entries = fs::read_dir(&dir).map_err(|source| DiscoverError::NoPciTree {
        path: dir.display().to_string(),
        source,
    })?;
    let canon_root = fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let mut devices = BTreeMap::new();
    let mut problems = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_pci_address(&name) {
            continue;
        }
        let link = canon_root.join("sys/bus/pci/devices").join(&name);
        let Some(canon) = resolve_link(&link).filter(|p| p.is_dir()) else {
            problems.push(unreadable(&name, &link, "broken link"));
            continue;
        };
        let rel: PathBuf = canon
            .strip_prefix(&canon_root)
            .map(Path::to_path_buf)
            .unwrap_or_else(|_| canon.clone());
        let Some((host_bridge, bridges)) = tree_position(&rel) else {
            problems.push(unreadable(
                &name,
                &link,
                &format!(
                    "canonical path {} is not under a PCI host bridge",
                    rel.display()
                ),
            ));
            continue;
        };
        let dev = read_device(&canon, name.clone(), host_bridge, bridges, &mut problems);
        devices.insert(name, dev);
    }
    Ok((devices, problems))
}

fn unreadable(subject: &str, path: &Path, why: &str) -> Finding {
    Finding {
        kind: FindingKind::SysfsUnreadable,
        severity: Severity::Warning,
        subject: subject.to_string(),
        message: format!("cannot use {}: {why}", path.display()),
        evidence: vec![format!("{} ({why})", path.display())],
    }
}

fn read_device(
    dir: &Path,
    address: String,
    host_bridge: String,
    bridges: Vec<String>,
    problems: &mut Vec<Finding>,
) -> PciDevice {
    let mut hex = |file: &str| -> Option<u32> {
        read_parsed(&dir.join(file), &address, "a hex number", problems, |t| {
            parse_hex_u32(t).map(Some).ok_or(())
        })
    };
    let vendor = hex("vendor").and_then(|v| u16::try_from(v).ok());
    let device = hex("device").and_then(|v| u16::try_from(v).ok());
    let class = hex("class");
    // Bridges only matter for their place in the tree and their ACS state; their NUMA node
    // and link are not used, so skip those reads (discovery is mostly file opens).
    let is_bridge = class.map(|c| c >> 8) == Some(0x0604);
    let numa = if is_bridge {
        None
    } else {
        read_numa(&dir.join("numa_node"), &address, problems)
    };
    let link = if is_bridge {
        PcieLink::default()
    } else {
        let mut speed = |f: &str| {
            read_parsed(
                &dir.join(f),
                &address,
                "a link speed (GT/s)",
                problems,
                link_speed,
            )
        };
        let (current_speed_gts, max_speed_gts) =
            (speed("current_link_speed"), speed("max_link_speed"));
        let mut width =
            |f: &str| read_parsed(&dir.join(f), &address, "a link width", problems, link_width);
        PcieLink {
            current_speed_gts,
            current_width: width("current_link_width"),
            max_speed_gts,
            max_width: width("max_link_width"),
        }
    };
    let mut dev = PciDevice {
        address,
        vendor,
        device,
        class,
        numa,
        host_bridge,
        bridges,
        link,
        acs: None,
    };
    if dev.is_bridge() {
        dev.acs = Some(match fs::read(dir.join("config")) {
            Ok(bytes) => acs_from_config(&bytes),
            Err(e) => AcsState::Unknown {
                reason: format!("config not readable: {e}"),
            },
        });
    }
    dev
}

fn read_numa(path: &Path, subject: &str, problems: &mut Vec<Finding>) -> Option<u32> {
    // -1: the kernel knows no NUMA node for the device.
    read_parsed(path, subject, "a NUMA node", problems, |t| {
        match t.parse::<i64>() {
            Ok(-1) => Ok(None),
            Ok(n) => u32::try_from(n).map(Some).map_err(|_| ()),
            Err(_) => Err(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(addr: &str, hb: &str, bridges: &[&str], numa: Option<u32>) -> PciDevice {
        PciDevice {
            address: addr.into(),
            vendor: None,
            device: None,
            class: None,
            numa,
            host_bridge: hb.into(),
            bridges: bridges.iter().map(|s| s.to_string()).collect(),
            link: PcieLink::default(),
            acs: None,
        }
    }

    #[test]
    fn path_classes_follow_the_tree() {
        let rp = "0000:15:01.0";
        let up = "0000:16:00.0";
        let gpu = dev(
            "0000:18:00.0",
            "pci0000:15",
            &[rp, up, "0000:17:00.0"],
            Some(0),
        );
        let pix = dev(
            "0000:19:00.0",
            "pci0000:15",
            &[rp, up, "0000:17:01.0"],
            Some(0),
        );
        assert_eq!(classify_path(&gpu, &pix), PathType::Pix);
        let deep = dev(
            "0000:1c:00.0",
            "pci0000:15",
            &[rp, up, "0000:17:02.0", "0000:1a:00.0", "0000:1b:00.0"],
            Some(0),
        );
        assert_eq!(classify_path(&gpu, &deep), PathType::Pxb);
        let other_rp = dev("0000:20:00.0", "pci0000:15", &["0000:15:02.0"], Some(0));
        assert_eq!(classify_path(&gpu, &other_rp), PathType::Phb);
        let other_hb = dev("0000:30:00.0", "pci0000:2f", &["0000:2f:01.0"], Some(0));
        assert_eq!(classify_path(&gpu, &other_hb), PathType::Node);
        let far = dev("0000:90:00.0", "pci0000:8f", &["0000:8f:01.0"], Some(1));
        assert_eq!(classify_path(&gpu, &far), PathType::Sys);
        // Unknown NUMA is never local.
        let unknown = dev("0000:30:00.0", "pci0000:2f", &["0000:2f:01.0"], None);
        assert_eq!(classify_path(&gpu, &unknown), PathType::Sys);
    }

    #[test]
    fn link_speed_and_addresses_parse() {
        assert_eq!(parse_link_speed("32.0 GT/s PCIe"), Some(32.0));
        assert_eq!(parse_link_speed("2.5 GT/s"), Some(2.5));
        assert_eq!(parse_link_speed("Unknown speed"), None);
        assert!(is_pci_address("0000:1b:00.0"));
        assert!(!is_pci_address("pci0000:15"));
        assert!(!is_pci_address("0000:1b:00"));
    }

    fn config_with_acs(control: u16) -> Vec<u8> {
        let mut c = vec![0u8; 4096];
        // First extended cap: AER (id 1) pointing at 0x148 where ACS (id 0xd) sits.
        c[0x100..0x104].copy_from_slice(&(0x0001u32 | (1 << 16) | (0x148 << 20)).to_le_bytes());
        c[0x148..0x14c].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
        c[0x14c..0x14e].copy_from_slice(&0x005fu16.to_le_bytes());
        c[0x14e..0x150].copy_from_slice(&control.to_le_bytes());
        c
    }

    #[test]
    fn acs_redirect_is_read_from_extended_capability() {
        assert_eq!(acs_from_config(&config_with_acs(0)), AcsState::Disabled);
        assert_eq!(
            acs_from_config(&config_with_acs(0x1d)),
            AcsState::Redirect { control: 0x1d }
        );
        assert_eq!(acs_from_config(&config_with_acs(0x01)), AcsState::Disabled);
        assert!(matches!(
            acs_from_config(&[0u8; 64]),
            AcsState::Unknown { .. }
        ));
        assert_eq!(acs_from_config(&vec![0u8; 4096]), AcsState::NotSupported);
        // A capability pointing backwards must not loop forever.
        let mut looped = vec![0u8; 4096];
        looped[0x100..0x104].copy_from_slice(&(0x0001u32 | (0x100 << 20)).to_le_bytes());
        assert!(matches!(acs_from_config(&looped), AcsState::Unknown { .. }));
    }
}
