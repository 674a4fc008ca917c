//! The node file the NCCL environment plugin reads (`/run/railguard/nccl.json`, the model is
//! [`railguard_nccl_env::NodeFile`]): what the Node's certificate says about each rail, where
//! each rail is on this machine (PCI address, netdev, from discovery), which rail serves each
//! GPU, and the profile's NCCL settings.
//!
//! [`nccl_node_file`] is pure; [`write_if_changed`] is the one IO step the daemon runs after
//! every step: an atomic replace (temp file in the same directory, fsync, rename), so a
//! training process opening the file mid-write reads the old content or the new, never half.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use railguard_api::profile::OnUnhealthy;
use railguard_api::{Certificate, FabricProfile, RailVerdict, Verdict};
use railguard_nccl_env as nccl_env;

use crate::discover::Discovery;

/// Where one rail is on this machine, as discovery found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailFacts {
    pub hca: String,
    pub port: u32,
    /// PCI address of the HCA's function on the host (a PF: the prober runs on the host's
    /// sysfs, where a container's VF finds it through its `physfn` link).
    pub pci_address: Option<String>,
    /// The port's netdev on the host.
    pub netdev: Option<String>,
    /// A GID index the prober proved on this rail; `None` leaves NCCL's own choice.
    pub gid_index: Option<u32>,
}

/// What the node file says about this machine beyond the certificate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub rails: Vec<RailFacts>,
    /// GPU index to `GPU-…` UUID, where known (lets the plugin resolve UUIDs in
    /// `NVIDIA_VISIBLE_DEVICES`).
    pub gpu_uuids: BTreeMap<u32, String>,
}

impl NodeFacts {
    /// Pure: every port of every HCA discovery found (the certificate picks the rails).
    pub fn of(discovery: &Discovery) -> NodeFacts {
        let rails = discovery
            .hcas
            .iter()
            .flat_map(|h| {
                h.ports.iter().map(|p| RailFacts {
                    hca: h.name.clone(),
                    port: p.port,
                    pci_address: h.pci_bus_id.clone(),
                    netdev: p.netdev.clone(),
                    // NCCL's own choice on this RoCE port, the GID the RDMA tests ran on:
                    // proven on every rail the certificate calls healthy.
                    gid_index: discovery
                        .rails
                        .iter()
                        .find(|r| r.hca == h.name && r.port == p.port)
                        .and_then(|r| r.gid_index),
                })
            })
            .collect();
        NodeFacts {
            rails,
            gpu_uuids: discovery
                .gpus
                .iter()
                .filter_map(|g| Some((g.index, g.uuid.clone()?)))
                .collect(),
        }
    }
}

/// Pure: the node file for `node` from the Node's certificate (`None`: not certified yet),
/// the profile the daemon certifies against and where the rails are here.
///
/// - `certificate`: generation, verdict, `expiresAt`. No certificate, or one issued for
///   another profile (its rails are not this profile's), is `pending` expiring `now`, so the
///   plugin warns instead of answering from a certificate that does not apply.
/// - `rails`: the certificate's rails with their verdicts as `health`, and the PCI address
///   and netdev of the same HCA port from `facts` (left out when unknown or not a PCI
///   address).
/// - `gpus`: the certificate's affinity map, each GPU with the rail it prefers (left out
///   when that rail is not in the certificate).
/// - `nccl`: `spec.nccl.socketIfname`; `NCCL_IB_TC`/`NCCL_IB_SL` of `spec.nccl.env` as
///   `trafficClass`/`serviceLevel`; `crossNic` as `NCCL_CROSS_NIC`; the other `NCCL_*` pairs.
///   The plugin computes `NCCL_IB_HCA` and `NCCL_IB_GID_INDEX` itself, so the profile's are
///   left out, as is anything the node file format rejects (a value that is not a number
///   where one is needed, a name that is not `NCCL_*`): the webhook still injects those.
///   `enforce`, `onUnhealthy` and `consistentRails` are the profile's (`spec.nccl`).
/// - `fleet.consistentRailCount` (with `consistentRails`): `fleet_rail_count`, the fleet
///   controller's `status.fleet.consistentRailCount` (the fewest healthy rails of a
///   certified node of the profile) as the daemon last read it; before the controller has
///   published one (or for a count of 0, which the plugin cannot hold nodes to), the
///   profile's rail count: every node answers all of the profile's rails, and one with
///   fewer usable rails is unhealthy.
pub fn nccl_node_file(
    node: &str,
    certificate: Option<&Certificate>,
    profile: &FabricProfile,
    fleet_rail_count: Option<u32>,
    facts: &NodeFacts,
    now: Timestamp,
) -> nccl_env::NodeFile {
    let nccl = nccl_profile(profile);
    let profile_name = profile.name().to_string();
    let cert = match certificate.filter(|c| c.profile == profile_name) {
        Some(c) => c,
        None => {
            return nccl_env::NodeFile {
                version: nccl_env::NODE_FILE_VERSION,
                node: Some(node.to_string()),
                profile: Some(profile_name),
                certificate: nccl_env::CertificateSummary {
                    generation: certificate.map_or(0, |c| c.generation),
                    verdict: nccl_env::Verdict::Pending,
                    expires_at: now,
                },
                rails: Vec::new(),
                gpus: Vec::new(),
                fleet: fleet_view(profile, fleet_rail_count, &nccl),
                nccl,
            }
        }
    };
    let mut rails: Vec<nccl_env::Rail> = Vec::new();
    for r in &cert.rails {
        // The format names each rail once; a certificate never repeats one, but a hand-made
        // annotation could.
        if rails.iter().any(|x| x.hca == r.hca && x.port == r.port) {
            continue;
        }
        let here = facts
            .rails
            .iter()
            .find(|f| f.hca == r.hca && f.port == r.port);
        rails.push(nccl_env::Rail {
            hca: r.hca.clone(),
            port: r.port,
            pci_address: here
                .and_then(|f| f.pci_address.clone())
                .filter(|a| is_pci_address(a)),
            netdev: here.and_then(|f| f.netdev.clone()),
            gid_index: here.and_then(|f| f.gid_index),
            health: match r.verdict {
                RailVerdict::Healthy => nccl_env::RailHealth::Healthy,
                RailVerdict::Degraded => nccl_env::RailHealth::Degraded,
                RailVerdict::Failed => nccl_env::RailHealth::Failed,
            },
        });
    }
    let mut gpus: Vec<nccl_env::Gpu> = Vec::new();
    for g in &cert.gpus {
        if gpus.iter().any(|x| x.index == g.gpu) {
            continue;
        }
        // A GPU's preferred HCA without a port (a saved `topo -m`) is its only port, if one.
        let serving: Vec<&nccl_env::Rail> = rails
            .iter()
            .filter(|r| r.hca == g.preferred_hca && g.port.is_none_or(|p| p == r.port))
            .collect();
        gpus.push(nccl_env::Gpu {
            index: g.gpu,
            uuid: facts.gpu_uuids.get(&g.gpu).cloned(),
            pci_bus_id: g.pci_bus_id.clone().filter(|a| is_pci_address(a)),
            rail: match serving.as_slice() {
                [one] => Some(one.id()),
                _ => None,
            },
        });
    }
    nccl_env::NodeFile {
        version: nccl_env::NODE_FILE_VERSION,
        node: Some(node.to_string()),
        profile: Some(profile_name),
        certificate: nccl_env::CertificateSummary {
            generation: cert.generation,
            verdict: match cert.verdict {
                Verdict::Certified => nccl_env::Verdict::Certified,
                Verdict::Degraded => nccl_env::Verdict::Degraded,
                Verdict::Failed => nccl_env::Verdict::Failed,
                Verdict::Pending => nccl_env::Verdict::Pending,
            },
            expires_at: cert.expires_at,
        },
        rails,
        gpus,
        fleet: fleet_view(profile, fleet_rail_count, &nccl),
        nccl,
    }
}

/// `consistentRails` needs a count (see [`nccl_node_file`]); without one it is off.
fn fleet_view(
    profile: &FabricProfile,
    fleet_rail_count: Option<u32>,
    nccl: &nccl_env::NcclProfile,
) -> Option<nccl_env::FleetView> {
    let count = fleet_rail_count
        .filter(|n| *n > 0)
        .or_else(|| u32::try_from(profile.spec.rails.len()).ok())
        .filter(|n| *n > 0)?;
    nccl.consistent_rails.then_some(nccl_env::FleetView {
        consistent_rail_count: count,
    })
}

/// The profile's NCCL settings in the node file's terms (see [`nccl_node_file`]).
fn nccl_profile(profile: &FabricProfile) -> nccl_env::NcclProfile {
    let settings = &profile.spec.nccl;
    let mut out = nccl_env::NcclProfile {
        socket_ifname: settings.socket_ifname.clone(),
        enforce: settings.enforce,
        on_unhealthy: match settings.on_unhealthy {
            OnUnhealthy::Warn => nccl_env::OnUnhealthy::Warn,
            OnUnhealthy::Fail => nccl_env::OnUnhealthy::Fail,
        },
        // Off without a count to hold the nodes to (a profile without rails).
        consistent_rails: settings.consistent_rails && !profile.spec.rails.is_empty(),
        ..nccl_env::NcclProfile::default()
    };
    if let Some(x) = settings.cross_nic {
        out.env.insert("NCCL_CROSS_NIC".into(), x.to_string());
    }
    for (k, v) in &settings.env {
        match k.as_str() {
            nccl_env::NCCL_IB_TC => out.traffic_class = v.trim().parse().ok(),
            nccl_env::NCCL_IB_SL => {
                out.service_level = v.trim().parse().ok().filter(|sl: &u8| *sl <= 15);
            }
            nccl_env::NCCL_SOCKET_IFNAME if out.socket_ifname.is_none() => {
                out.socket_ifname = Some(v.clone());
            }
            // Computed by the plugin, or given by socketIfname already.
            nccl_env::NCCL_IB_HCA | nccl_env::NCCL_IB_GID_INDEX | nccl_env::NCCL_SOCKET_IFNAME => {}
            _ if is_nccl_name(k) && !v.contains('\0') => {
                out.env.insert(k.clone(), v.clone());
            }
            _ => {}
        }
    }
    // An interface list the format rejects is left to the webhook's injection.
    out.socket_ifname = out
        .socket_ifname
        .filter(|s| !s.trim().is_empty() && !s.contains(char::is_whitespace) && !s.contains('\0'));
    out
}

fn is_nccl_name(k: &str) -> bool {
    k.starts_with("NCCL_") && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `0000:0c:00.0` (or NVML's eight-digit domain): what the format accepts as a PCI address.
fn is_pci_address(s: &str) -> bool {
    let parts: Vec<&str> = s.trim().split([':', '.']).collect();
    let hex =
        |p: &str, n: &[usize]| n.contains(&p.len()) && p.bytes().all(|b| b.is_ascii_hexdigit());
    match parts.as_slice() {
        [domain, bus, dev, func] => {
            hex(domain, &[4, 8])
                && (domain.len() == 4 || domain.starts_with("0000"))
                && hex(bus, &[2])
                && hex(dev, &[2])
                && matches!(func.as_bytes(), [b'0'..=b'7'])
        }
        _ => false,
    }
}

/// Why a file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteFileError {
    #[error("{path} has no parent directory")]
    NoDirectory { path: PathBuf },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Replaces `path` with `content` (mode `mode`) unless it already holds exactly that:
/// `Ok(true)` when it was written. Atomic: a temp file in the same directory, fsynced, then
/// renamed over `path`, so readers see the old file or the new one, and a process that has
/// the old one open (or mapped: the plugin library) keeps its inode. An unchanged file is not
/// touched (same inode, same mtime), so a daemon step every few seconds costs one read.
pub fn write_if_changed(path: &Path, content: &[u8], mode: u32) -> Result<bool, WriteFileError> {
    if fs::read(path).is_ok_and(|old| old == content) {
        return Ok(false);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        Some(_) => Path::new("."),
        None => {
            return Err(WriteFileError::NoDirectory {
                path: path.to_path_buf(),
            })
        }
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| WriteFileError::NoDirectory {
            path: path.to_path_buf(),
        })?;
    // A dot name the plugin never opens; the pid keeps two writers apart.
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let written = (|| -> io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(content)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        // The rename itself survives a crash only once the directory is synced.
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    match written {
        Ok(()) => Ok(true),
        Err(source) => {
            let _ = fs::remove_file(&tmp);
            Err(WriteFileError::Write {
                path: path.to_path_buf(),
                source,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn profile(nccl: serde_json::Value) -> FabricProfile {
        let mut p = railguard_api::profiles_from_yaml(include_str!(
            "../../../api/fixtures/profiles/dgx-h100-ndr.yaml"
        ))
        .unwrap()
        .remove(0);
        p.spec.nccl = serde_json::from_value(nccl).unwrap();
        p
    }

    fn cert(profile: &str, verdict: &str, rails: &[(&str, &str)]) -> Certificate {
        serde_json::from_value(serde_json::json!({
            "version": 1, "generation": 7,
            "issuedAt": "2026-12-01T10:00:00Z", "expiresAt": "2026-12-24T10:00:00Z",
            "profile": profile, "signature": "sig", "verdict": verdict,
            "rails": rails.iter().map(|(hca, v)| serde_json::json!({
                "hca": hca, "port": 1, "verdict": v})).collect::<Vec<_>>(),
            "gpus": [
                {"gpu": 0, "pciBusId": "0000:19:00.0", "preferredHca": "mlx5_0", "port": 1, "path": "PIX"},
                {"gpu": 1, "pciBusId": "0000:3b:00.0", "preferredHca": "mlx5_1", "path": "PIX"},
                {"gpu": 2, "preferredHca": "mlx5_9", "port": 1, "path": "PIX"},
            ],
        }))
        .unwrap()
    }

    fn facts() -> NodeFacts {
        let rail = |hca: &str, pci: &str, netdev: &str| RailFacts {
            hca: hca.into(),
            port: 1,
            pci_address: Some(pci.into()),
            netdev: Some(netdev.into()),
            gid_index: None,
        };
        NodeFacts {
            rails: vec![
                rail("mlx5_0", "0000:0c:00.0", "ibp12s0"),
                rail("mlx5_1", "0000:2a:00.0", "ibp42s0"),
                rail("rxe0", "not-pci", "eth9"),
            ],
            gpu_uuids: [(0, "GPU-aaaa".to_string())].into(),
        }
    }

    fn now() -> Timestamp {
        "2026-12-02T00:00:00Z".parse().unwrap()
    }

    fn file(c: Option<&Certificate>, p: &FabricProfile) -> nccl_env::NodeFile {
        let f = nccl_node_file("gpu-a1", c, p, None, &facts(), now());
        // What is written is always what the plugin accepts.
        assert_eq!(nccl_env::NodeFile::parse(&f.to_json()).unwrap(), f);
        f
    }

    #[test]
    fn rails_carry_their_verdict_pci_address_and_netdev() {
        let p = profile(serde_json::json!({"socketIfname": "=eth0"}));
        let c = cert(
            p.name(),
            "degraded",
            &[
                ("mlx5_0", "healthy"),
                ("mlx5_1", "failed"),
                ("mlx5_2", "degraded"),
            ],
        );
        let f = file(Some(&c), &p);
        assert_eq!(f.node.as_deref(), Some("gpu-a1"));
        assert_eq!(f.certificate.generation, 7);
        assert_eq!(f.certificate.verdict, nccl_env::Verdict::Degraded);
        assert_eq!(f.certificate.expires_at, c.expires_at);
        let health: Vec<_> = f.rails.iter().map(|r| (r.id(), r.health)).collect();
        assert_eq!(
            health,
            [
                ("mlx5_0:1".to_string(), nccl_env::RailHealth::Healthy),
                ("mlx5_1:1".to_string(), nccl_env::RailHealth::Failed),
                ("mlx5_2:1".to_string(), nccl_env::RailHealth::Degraded),
            ]
        );
        assert_eq!(f.rails[0].pci_address.as_deref(), Some("0000:0c:00.0"));
        assert_eq!(f.rails[1].netdev.as_deref(), Some("ibp42s0"));
        // Not discovered here: the rail is still named, without a location.
        assert_eq!(
            (f.rails[2].pci_address.as_ref(), f.rails[2].netdev.as_ref()),
            (None, None)
        );
        assert_eq!(f.rails[0].gid_index, None);
        assert_eq!(f.nccl.socket_ifname.as_deref(), Some("=eth0"));
    }

    #[test]
    fn gpus_name_the_rail_serving_them() {
        let p = profile(serde_json::json!({}));
        let c = cert(
            p.name(),
            "certified",
            &[("mlx5_0", "healthy"), ("mlx5_1", "healthy")],
        );
        let f = file(Some(&c), &p);
        let g: Vec<_> = f
            .gpus
            .iter()
            .map(|g| {
                (
                    g.index,
                    g.uuid.as_deref(),
                    g.pci_bus_id.as_deref(),
                    g.rail.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            g,
            [
                (0, Some("GPU-aaaa"), Some("0000:19:00.0"), Some("mlx5_0:1")),
                // No port in the affinity: the HCA's only port.
                (1, None, Some("0000:3b:00.0"), Some("mlx5_1:1")),
                // A preferred HCA that is no rail of the certificate: no rail.
                (2, None, None, None),
            ]
        );
    }

    #[test]
    fn an_expired_or_failed_certificate_is_passed_on_for_the_plugin_to_judge() {
        let p = profile(serde_json::json!({}));
        let mut c = cert(p.name(), "failed", &[("mlx5_0", "failed")]);
        c.expires_at = "2026-11-01T00:00:00Z".parse().unwrap();
        let f = file(Some(&c), &p);
        assert_eq!(f.certificate.verdict, nccl_env::Verdict::Failed);
        assert_eq!(f.certificate.expires_at, c.expires_at);
        // And the plugin's own rules call it unhealthy.
        let a = nccl_env::answer(&f, &nccl_env::ContainerView::default(), &|_| None, now());
        assert!(a.values.is_empty());
        assert!(
            a.messages
                .iter()
                .any(|m| m.text.contains("expired at 2026-11-01T00:00:00Z")),
            "{:?}",
            a.messages
        );
    }

    #[test]
    fn no_certificate_or_another_profiles_is_pending_now() {
        let p = profile(serde_json::json!({}));
        let f = file(None, &p);
        assert_eq!(f.certificate.verdict, nccl_env::Verdict::Pending);
        assert_eq!(f.certificate.expires_at, now());
        assert!(f.rails.is_empty());
        let other = cert("other-profile", "certified", &[("mlx5_0", "healthy")]);
        let f = file(Some(&other), &p);
        assert_eq!(f.certificate.verdict, nccl_env::Verdict::Pending);
        assert_eq!(f.certificate.generation, 7);
        assert!(f.rails.is_empty());
    }

    #[test]
    fn profile_env_becomes_traffic_class_service_level_and_pairs() {
        let p = profile(serde_json::json!({
            "ibHca": "=mlx5_0:1", "crossNic": 1,
            "env": {"NCCL_IB_TC": "106", "NCCL_IB_SL": "3", "NCCL_IB_GID_INDEX": "3",
                    "NCCL_IB_HCA": "mlx5", "NCCL_IB_QPS_PER_CONNECTION": "2",
                    "NCCL_SOCKET_IFNAME": "=eth1", "LD_PRELOAD": "x.so"}
        }));
        let f = file(None, &p);
        assert_eq!(f.nccl.traffic_class, Some(106));
        assert_eq!(f.nccl.service_level, Some(3));
        assert_eq!(f.nccl.socket_ifname.as_deref(), Some("=eth1"));
        let env: Vec<_> = f.nccl.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(env, ["NCCL_CROSS_NIC=1", "NCCL_IB_QPS_PER_CONNECTION=2"]);
        assert!(!f.nccl.enforce && !f.nccl.consistent_rails);
        assert_eq!(f.nccl.on_unhealthy, nccl_env::OnUnhealthy::Warn);
        assert_eq!(f.fleet, None);
        // The plugin's policy, from the profile.
        let p = profile(serde_json::json!({"delivery": "Plugin", "enforce": true,
            "onUnhealthy": "Fail", "consistentRails": true}));
        let f = file(None, &p);
        assert!(f.nccl.enforce && f.nccl.consistent_rails);
        assert_eq!(f.nccl.on_unhealthy, nccl_env::OnUnhealthy::Fail);
        assert_eq!(
            f.fleet.map(|v| v.consistent_rail_count),
            Some(u32::try_from(p.spec.rails.len()).unwrap())
        );
        // The fleet controller's count, once published, is what every node answers.
        let f = nccl_node_file("gpu-a1", None, &p, Some(3), &facts(), now());
        assert_eq!(f.fleet.map(|v| v.consistent_rail_count), Some(3));
        let f = nccl_node_file("gpu-a1", None, &p, Some(0), &facts(), now());
        assert_eq!(
            f.fleet.map(|v| v.consistent_rail_count),
            Some(u32::try_from(p.spec.rails.len()).unwrap())
        );
        // socketIfname outranks the same variable in env.
        let p = profile(serde_json::json!({"socketIfname": "=eth0",
            "env": {"NCCL_SOCKET_IFNAME": "=eth1"}}));
        let f = file(None, &p);
        assert_eq!(f.nccl.socket_ifname.as_deref(), Some("=eth0"));
        assert!(f.nccl.env.is_empty());
        // Values the format cannot carry are left to the webhook.
        let p = profile(serde_json::json!({"socketIfname": "eth0 eth1",
            "env": {"NCCL_IB_TC": "high", "NCCL_IB_SL": "16"}}));
        let f = file(None, &p);
        assert_eq!(
            (
                f.nccl.traffic_class,
                f.nccl.service_level,
                f.nccl.socket_ifname
            ),
            (None, None, None)
        );
    }

    #[test]
    fn pci_addresses_in_the_formats_form() {
        assert!(is_pci_address("0000:0c:00.0"));
        assert!(is_pci_address("00000000:0C:00.7"));
        for bad in ["", "0c:00.0", "0000:0c:00.8", "1000000:0c:00.0", "not-pci"] {
            assert!(!is_pci_address(bad), "{bad}");
        }
    }

    #[test]
    fn an_unchanged_file_is_not_rewritten_a_changed_one_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nccl.json");
        assert!(write_if_changed(&path, b"one", 0o644).unwrap());
        let first = fs::metadata(&path).unwrap();
        assert_eq!(first.mode() & 0o777, 0o644);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!write_if_changed(&path, b"one", 0o644).unwrap());
        let same = fs::metadata(&path).unwrap();
        assert_eq!(
            (same.ino(), same.mtime_nsec()),
            (first.ino(), first.mtime_nsec())
        );
        // Held open like a reader would: it keeps the old content.
        let mut reader = fs::File::open(&path).unwrap();
        assert!(write_if_changed(&path, b"two", 0o644).unwrap());
        let changed = fs::metadata(&path).unwrap();
        assert_ne!(changed.ino(), first.ino());
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let mut old = String::new();
        io::Read::read_to_string(&mut reader, &mut old).unwrap();
        assert_eq!(old, "one");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["nccl.json"], "no temp file is left");
    }

    #[test]
    fn a_directory_that_is_not_there_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing/nccl.json");
        let e = write_if_changed(&path, b"x", 0o644).unwrap_err();
        assert!(e.to_string().contains("missing/nccl.json"), "{e}");
    }
}
