//! Pure decisions: NIC roles (compute vs storage), the GPU-to-NIC affinity map, the rails.
//! Shared by sysfs discovery and by the `topo -m` parser.

use std::collections::BTreeMap;

use railguard_api::{LinkLayer, PathType};
use serde::{Deserialize, Serialize};

use super::ib::natural_key;
use super::pci::classify_path;
use super::{
    readiness, AffinityMap, AlternateNic, Discovery, Finding, FindingKind, GpuAffinityEntry,
    Inventory, NicChoice, NicRole, NicSummary, PortState, Rail, Severity,
};

/// The PCIe distance between one GPU and one NIC port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairPath {
    pub gpu: u32,
    pub hca: String,
    pub port: Option<u32>,
    pub path: PathType,
}

/// What the affinity decision knows about a NIC port (`None` = unknown, as from `topo -m`).
#[derive(Clone, Debug, PartialEq)]
pub struct NicCandidate {
    pub hca: String,
    pub port: Option<u32>,
    pub active: Option<bool>,
    pub rate_gbps: Option<f64>,
    pub link_layer: Option<LinkLayer>,
}

/// A GPU as the affinity decision sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuRef {
    pub index: u32,
    pub numa: Option<u32>,
    pub pci_bus_id: Option<String>,
}

fn most_common<T: Ord + Copy>(items: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: BTreeMap<T, usize> = BTreeMap::new();
    for i in items {
        *counts.entry(i).or_default() += 1;
    }
    counts.into_iter().max_by_key(|(_, c)| *c).map(|(v, _)| v)
}

/// Tells compute rails from storage/management NICs.
///
/// A port is "near" when it is within one PCIe switch tree of some GPU (PIX/PXB; if no port
/// is, the closest distance any GPU has). The compute link layer is the most common one
/// among near ports, the compute rate the highest near active rate. A port is compute when
/// its link layer matches (or is unknown) and it is near a GPU, or it runs at the compute
/// rate (an HCA that moved away from its GPU is still a compute rail, just a badly placed
/// one). Everything else is storage.
///
/// `matrix[g][n]` is the path from GPU `g` (position) to NIC port `n`.
pub fn classify_nics(nics: &[NicCandidate], matrix: &[Vec<PathType>]) -> Vec<NicRole> {
    let min_any = matrix.iter().flatten().min().copied();
    let threshold = match min_any {
        Some(p) if p > PathType::Pxb => p,
        _ => PathType::Pxb,
    };
    let near: Vec<bool> = (0..nics.len())
        .map(|n| {
            matrix
                .iter()
                .any(|row| row.get(n).is_some_and(|p| *p <= threshold))
        })
        .collect();
    let compute_ll = most_common(
        nics.iter()
            .zip(&near)
            .filter(|(_, near)| **near)
            .filter_map(|(n, _)| n.link_layer),
    );
    let compute_rate = nics
        .iter()
        .zip(&near)
        .filter(|(n, near)| **near && n.active != Some(false))
        .filter_map(|(n, _)| n.rate_gbps)
        .fold(None, |acc: Option<f64>, r| {
            Some(acc.map_or(r, |a| a.max(r)))
        });
    nics.iter()
        .zip(&near)
        .map(|(n, near)| {
            let ll_ok = match (n.link_layer, compute_ll) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            let at_rate = matches!((n.rate_gbps, compute_rate), (Some(r), Some(c)) if r >= c)
                && n.active != Some(false);
            if ll_ok && (*near || at_rate) {
                NicRole::Compute
            } else {
                NicRole::Storage
            }
        })
        .collect()
}

/// The affinity map: each GPU's preferred NIC port and its alternates.
///
/// Preferred = the closest compute port; among equally close ones, a port no other GPU has
/// taken yet (so GPUs get distinct rails), then an active port, then the highest rate, then
/// the NIC name. GPUs are served closest-first, and within one distance the GPU with the
/// fewest choices first, so a GPU with a single close NIC is not crowded out. Alternates are
/// the other compute ports at the next smallest distance.
pub fn affinity_map(
    gpus: &[GpuRef],
    nics: &[NicCandidate],
    roles: &[NicRole],
    matrix: &[Vec<PathType>],
) -> AffinityMap {
    let compute: Vec<usize> = (0..nics.len())
        .filter(|n| roles.get(*n) == Some(&NicRole::Compute))
        .collect();
    let path = |g: usize, n: usize| matrix.get(g).and_then(|r| r.get(n)).copied();
    let best: Vec<Option<PathType>> = (0..gpus.len())
        .map(|g| compute.iter().filter_map(|n| path(g, *n)).min())
        .collect();
    let mut order: Vec<usize> = (0..gpus.len()).filter(|g| best[*g].is_some()).collect();
    let choices_at_best = |g: usize| compute.iter().filter(|n| path(g, **n) == best[g]).count();
    order.sort_by_key(|g| (best[*g], choices_at_best(*g), gpus[*g].index));
    let mut usage = vec![0usize; nics.len()];
    let mut chosen: Vec<Option<usize>> = vec![None; gpus.len()];
    for g in order {
        let pick = compute
            .iter()
            .copied()
            .filter(|n| path(g, *n) == best[g])
            .min_by(|a, b| {
                let key = |n: usize| {
                    let c = &nics[n];
                    (
                        usage[n],
                        c.active == Some(false),
                        std::cmp::Reverse(c.rate_gbps.map(|r| (r * 1000.0) as u64).unwrap_or(0)),
                        natural_key(&c.hca),
                        c.port,
                    )
                };
                key(*a).cmp(&key(*b))
            });
        if let Some(n) = pick {
            usage[n] += 1;
            chosen[g] = Some(n);
        }
    }
    let entries = gpus
        .iter()
        .enumerate()
        .map(|(g, gpu)| {
            let preferred = chosen[g].and_then(|n| {
                Some(NicChoice {
                    hca: nics[n].hca.clone(),
                    port: nics[n].port,
                    path: path(g, n)?,
                })
            });
            let others: Vec<usize> = compute
                .iter()
                .copied()
                .filter(|n| Some(*n) != chosen[g])
                .collect();
            let next = others.iter().filter_map(|n| path(g, *n)).min();
            let mut alternates: Vec<(usize, PathType)> = others
                .iter()
                .filter_map(|n| path(g, *n).map(|p| (*n, p)))
                .filter(|(_, p)| Some(*p) == next)
                .collect();
            alternates.sort_by_key(|(n, _)| (natural_key(&nics[*n].hca), nics[*n].port));
            GpuAffinityEntry {
                index: gpu.index,
                numa: gpu.numa,
                pci_bus_id: gpu.pci_bus_id.clone(),
                preferred,
                alternates: alternates
                    .into_iter()
                    .map(|(n, p)| AlternateNic {
                        hca: nics[n].hca.clone(),
                        port: nics[n].port,
                        path: p,
                    })
                    .collect(),
            }
        })
        .collect();
    AffinityMap { gpus: entries }
}

/// Findings about the map itself: no compute NIC, GPUs sharing a rail while another idles,
/// GPUs far from their NIC.
pub fn affinity_findings(
    map: &AffinityMap,
    nics: &[NicCandidate],
    roles: &[NicRole],
) -> Vec<Finding> {
    let mut out = Vec::new();
    if map.gpus.is_empty() {
        return out;
    }
    let compute: Vec<&NicCandidate> = nics
        .iter()
        .zip(roles)
        .filter(|(_, r)| **r == NicRole::Compute)
        .map(|(n, _)| n)
        .collect();
    if compute.is_empty() {
        out.push(Finding {
            kind: FindingKind::NoComputeNic,
            severity: Severity::Critical,
            subject: "node".into(),
            message: "no compute RDMA NIC found for the GPUs".into(),
            evidence: nics
                .iter()
                .map(|n| format!("{} classified storage", id(n)))
                .collect(),
        });
        return out;
    }
    let mut users: BTreeMap<(String, Option<u32>), Vec<u32>> = BTreeMap::new();
    for n in &compute {
        users.entry((n.hca.clone(), n.port)).or_default();
    }
    for e in &map.gpus {
        if let Some(p) = &e.preferred {
            users
                .entry((p.hca.clone(), p.port))
                .or_default()
                .push(e.index);
        }
    }
    let idle: Vec<String> = users
        .iter()
        .filter(|(_, g)| g.is_empty())
        .map(|((h, p), _)| port_id(h, *p))
        .collect();
    if !idle.is_empty() {
        for ((h, p), g) in users.iter().filter(|(_, g)| g.len() > 1) {
            out.push(Finding {
                kind: FindingKind::SharedRail,
                severity: Severity::Warning,
                subject: port_id(h, *p),
                message: format!(
                    "GPUs {g:?} share rail {} while compute rail(s) {} serve no GPU",
                    port_id(h, *p),
                    idle.join(", ")
                ),
                evidence: vec![format!("idle: {}", idle.join(", "))],
            });
        }
    }
    let typical = most_common(
        map.gpus
            .iter()
            .filter_map(|e| e.preferred.as_ref().map(|p| p.path)),
    );
    for e in &map.gpus {
        let Some(p) = &e.preferred else { continue };
        let far = p.path == PathType::Sys || typical.is_some_and(|t| p.path > t);
        if far {
            out.push(Finding {
                kind: FindingKind::FarNic,
                severity: if p.path == PathType::Sys {
                    Severity::Critical
                } else {
                    Severity::Warning
                },
                subject: format!("GPU{}", e.index),
                message: format!(
                    "GPU{}'s closest compute NIC {} is {} away (other GPUs: {})",
                    e.index,
                    port_id(&p.hca, p.port),
                    p.path,
                    typical.map_or("-".to_string(), |t| t.to_string())
                ),
                evidence: vec![format!("GPU{} -> {} = {}", e.index, p.hca, p.path)],
            });
        }
    }
    out
}

fn id(n: &NicCandidate) -> String {
    port_id(&n.hca, n.port)
}

fn port_id(hca: &str, port: Option<u32>) -> String {
    match port {
        Some(p) => format!("{hca}:{p}"),
        None => hca.to_string(),
    }
}

/// Every decision over an inventory.
pub(crate) fn analyze(inv: &Inventory) -> Discovery {
    let gpu_devs: Vec<_> = inv
        .gpus
        .iter()
        .map(|g| inv.pci.get(&g.pci_bus_id))
        .collect();
    let mut nics = Vec::new();
    let mut nic_pci = Vec::new();
    for h in &inv.hcas {
        for p in &h.ports {
            nics.push(NicCandidate {
                hca: h.name.clone(),
                port: Some(p.port),
                active: match p.state {
                    PortState::Active | PortState::ActiveDefer => Some(true),
                    PortState::Unknown => None,
                    _ => Some(false),
                },
                rate_gbps: p.rate_gbps,
                link_layer: p.link_layer,
            });
            nic_pci.push(h.pci_bus_id.clone());
        }
    }
    // A NIC without a PCI parent (software RDMA) or a GPU whose device vanished is SYS: far.
    let matrix: Vec<Vec<PathType>> = gpu_devs
        .iter()
        .map(|g| {
            nic_pci
                .iter()
                .map(|a| match (g, a.as_ref().and_then(|a| inv.pci.get(a))) {
                    (Some(g), Some(n)) => classify_path(g, n),
                    _ => PathType::Sys,
                })
                .collect()
        })
        .collect();
    let roles = classify_nics(&nics, &matrix);
    let refs: Vec<GpuRef> = inv
        .gpus
        .iter()
        .map(|g| GpuRef {
            index: g.index,
            numa: g.numa,
            pci_bus_id: Some(g.pci_bus_id.clone()),
        })
        .collect();
    let affinity = affinity_map(&refs, &nics, &roles, &matrix);
    let mut paths = Vec::new();
    for (g, gpu) in inv.gpus.iter().enumerate() {
        for (n, nic) in nics.iter().enumerate() {
            paths.push(PairPath {
                gpu: gpu.index,
                hca: nic.hca.clone(),
                port: nic.port,
                path: matrix[g][n],
            });
        }
    }
    let mut summaries = Vec::new();
    let mut rails = Vec::new();
    let mut i = 0;
    for h in &inv.hcas {
        for p in &h.ports {
            let role = roles[i];
            i += 1;
            summaries.push(NicSummary {
                hca: h.name.clone(),
                port: p.port,
                role,
                link_layer: p.link_layer,
                state: p.state,
                rate_gbps: p.rate_gbps,
                netdev: p.netdev.clone(),
                pci_bus_id: h.pci_bus_id.clone(),
                numa: h.numa,
            });
            if role == NicRole::Compute {
                let gpus = affinity
                    .gpus
                    .iter()
                    .filter(|e| {
                        e.preferred
                            .as_ref()
                            .is_some_and(|c| c.hca == h.name && c.port == Some(p.port))
                    })
                    .map(|e| e.index)
                    .collect();
                rails.push(Rail {
                    hca: h.name.clone(),
                    port: p.port,
                    link_layer: p.link_layer,
                    state: p.state,
                    rate_gbps: p.rate_gbps,
                    gpus,
                    netdev: p.netdev.clone(),
                    gid_index: match p.link_layer {
                        Some(railguard_api::LinkLayer::Roce) => p
                            .fabric
                            .gids
                            .as_deref()
                            .and_then(super::gid::table_of)
                            .and_then(|t| super::gid::nccl_roce_gid_index(&t)),
                        _ => None,
                    },
                });
            }
        }
    }
    let mut findings = inv.read_problems.clone();
    findings.extend(affinity_findings(&affinity, &nics, &roles));
    findings.extend(readiness::readiness_findings(inv, &affinity, &rails));
    findings.extend(super::fabric::fabric_findings(&inv.hcas, &rails));
    findings.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.kind.cmp(&b.kind)));
    Discovery {
        gpus: inv.gpus.clone(),
        hcas: inv.hcas.clone(),
        index_order: inv.index_order,
        paths,
        nics: summaries,
        affinity,
        rails,
        findings,
        platform: inv.platform.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PathType::*;

    fn nic(
        name: &str,
        rate: Option<f64>,
        ll: Option<LinkLayer>,
        active: Option<bool>,
    ) -> NicCandidate {
        NicCandidate {
            hca: name.into(),
            port: Some(1),
            active,
            rate_gbps: rate,
            link_layer: ll,
        }
    }

    fn gpus(n: u32) -> Vec<GpuRef> {
        (0..n)
            .map(|i| GpuRef {
                index: i,
                numa: Some(0),
                pci_bus_id: None,
            })
            .collect()
    }

    #[test]
    fn equally_close_nics_go_to_distinct_gpus() {
        // Two GPUs, two NICs, all PIX: each GPU gets its own rail.
        let nics = vec![
            nic("mlx5_0", Some(400.0), None, Some(true)),
            nic("mlx5_1", Some(400.0), None, Some(true)),
        ];
        let m = vec![vec![Pix, Pix], vec![Pix, Pix]];
        let roles = classify_nics(&nics, &m);
        let map = affinity_map(&gpus(2), &nics, &roles, &m);
        let pref: Vec<_> = map
            .gpus
            .iter()
            .map(|e| e.preferred.clone().map(|p| p.hca))
            .collect();
        assert_eq!(
            pref,
            [Some("mlx5_0".to_string()), Some("mlx5_1".to_string())]
        );
        assert_eq!(map.gpus[0].alternates[0].hca, "mlx5_1");
    }

    #[test]
    fn constrained_gpu_is_served_first() {
        // GPU0 can use A or B (PIX); GPU1 only A. GPU1 must get A, GPU0 B.
        let nics = vec![
            nic("mlx5_0", None, None, None),
            nic("mlx5_1", None, None, None),
        ];
        let m = vec![vec![Pix, Pix], vec![Pix, Node]];
        let roles = classify_nics(&nics, &m);
        let map = affinity_map(&gpus(2), &nics, &roles, &m);
        assert_eq!(
            map.gpus[0].preferred.as_ref().map(|p| p.hca.as_str()),
            Some("mlx5_1")
        );
        assert_eq!(
            map.gpus[1].preferred.as_ref().map(|p| p.hca.as_str()),
            Some("mlx5_0")
        );
    }

    #[test]
    fn active_fast_port_wins_a_tie() {
        let nics = vec![
            nic("mlx5_0", Some(400.0), Some(LinkLayer::Ib), Some(false)),
            nic("mlx5_1", Some(200.0), Some(LinkLayer::Ib), Some(true)),
            nic("mlx5_2", Some(400.0), Some(LinkLayer::Ib), Some(true)),
        ];
        let m = vec![vec![Pxb, Pxb, Pxb]];
        let roles = classify_nics(&nics, &m);
        let map = affinity_map(&gpus(1), &nics, &roles, &m);
        assert_eq!(
            map.gpus[0].preferred.as_ref().map(|p| p.hca.as_str()),
            Some("mlx5_2")
        );
    }

    #[test]
    fn storage_nics_are_told_apart() {
        let ib = Some(LinkLayer::Ib);
        let eth = Some(LinkLayer::Roce);
        let nics = vec![
            nic("mlx5_0", Some(400.0), ib, Some(true)),  // near GPU0
            nic("mlx5_1", Some(200.0), eth, Some(true)), // storage, far
            nic("mlx5_2", Some(400.0), ib, Some(true)),  // moved away from GPU1, still a rail
            nic("mlx5_3", Some(100.0), ib, Some(true)),  // slow, far: management
        ];
        let m = vec![vec![Pxb, Node, Sys, Node], vec![Sys, Sys, Sys, Sys]];
        let roles = classify_nics(&nics, &m);
        assert_eq!(
            roles,
            [
                NicRole::Compute,
                NicRole::Storage,
                NicRole::Compute,
                NicRole::Storage
            ]
        );
    }

    #[test]
    fn without_compute_nics_there_is_a_critical_finding() {
        let map = affinity_map(&gpus(1), &[], &[], &[vec![]]);
        assert!(map.gpus[0].preferred.is_none());
        let f = affinity_findings(&map, &[], &[]);
        assert_eq!(f[0].kind, FindingKind::NoComputeNic);
        assert_eq!(f[0].severity, Severity::Critical);
    }
}
