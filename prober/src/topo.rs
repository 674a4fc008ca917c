//! Parser for saved `nvidia-smi topo -m` output, and the affinity map built from it.
//!
//! Handles tab- or space-separated matrices, trailing whitespace, the `NIC Legend`
//! (NICn -> device name), and the CPU / NUMA affinity columns.

use railguard_api::PathType;
use serde::{Deserialize, Serialize};

use crate::discover::AffinityMap;

/// One cell of the matrix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TopoLink {
    /// `X`
    SelfLink,
    /// `PIX`, `PXB`, `PHB`, `NODE`, `SYS`
    Pci(PathType),
    /// `NV#`: bonded NVLinks.
    NvLink(u32),
    /// Anything else, kept verbatim.
    Other(String),
}

/// A GPU row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopoGpu {
    pub index: u32,
    /// CPU affinity list, when the column is present.
    pub cpu_affinity: Option<String>,
    /// NUMA node; `None` when absent or `N/A`.
    pub numa: Option<u32>,
    /// Links to every column device (GPUs then NICs), by column label.
    pub links: Vec<(String, TopoLink)>,
}

/// A NIC column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopoNic {
    /// Column label, e.g. `NIC0` (or the device name when the matrix uses names).
    pub label: String,
    /// Device name from the NIC legend (`mlx5_0`), or the label when there is no legend.
    pub name: String,
}

/// A parsed `nvidia-smi topo -m`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Topo {
    pub gpus: Vec<TopoGpu>,
    pub nics: Vec<TopoNic>,
}

/// The input is not a usable `nvidia-smi topo -m`.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopoError {
    #[error("no header row with GPU columns found")]
    NoHeader,
    #[error("line {line}: {message}")]
    Malformed { line: usize, message: String },
    #[error("matrix is incomplete: {0}")]
    Incomplete(String),
}

use crate::discover::{
    affinity_findings, affinity_map, classify_nics, Finding, GpuRef, NicCandidate, NicRole,
};

fn parse_cell(tok: &str) -> TopoLink {
    match tok {
        "X" => TopoLink::SelfLink,
        // Older nvidia-smi printed SOC for what is now SYS.
        "SOC" => TopoLink::Pci(PathType::Sys),
        t => {
            if let Some(p) = PathType::parse(t) {
                TopoLink::Pci(p)
            } else if let Some(n) = t.strip_prefix("NV").and_then(|n| n.parse().ok()) {
                TopoLink::NvLink(n)
            } else {
                TopoLink::Other(t.to_string())
            }
        }
    }
}

fn is_gpu_label(s: &str) -> Option<u32> {
    s.strip_prefix("GPU").and_then(|n| n.parse().ok())
}

/// Parses `nvidia-smi topo -m` text.
pub fn parse(text: &str) -> Result<Topo, TopoError> {
    let lines: Vec<&str> = text.lines().collect();
    let (header_at, columns) = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with('#'))
        .find_map(|(i, l)| {
            let toks: Vec<&str> = l.split_whitespace().collect();
            (toks.first().and_then(|t| is_gpu_label(t)).is_some()
                && l.starts_with(char::is_whitespace))
            .then(|| {
                // Device columns run until the affinity columns ("CPU Affinity", ...).
                let cols: Vec<String> = toks
                    .iter()
                    .take_while(|t| !matches!(**t, "CPU" | "NUMA" | "GPU"))
                    .map(|t| t.to_string())
                    .collect();
                (i, cols)
            })
        })
        .ok_or(TopoError::NoHeader)?;
    let header_toks: Vec<&str> = lines[header_at].split_whitespace().collect();
    let has_cpu = header_toks.windows(2).any(|w| w == ["CPU", "Affinity"]);
    let has_numa = header_toks.windows(2).any(|w| w == ["NUMA", "Affinity"]);
    let gpu_cols: Vec<u32> = columns.iter().filter_map(|c| is_gpu_label(c)).collect();
    let nic_labels: Vec<String> = columns
        .iter()
        .filter(|c| is_gpu_label(c).is_none())
        .cloned()
        .collect();

    let mut gpus = Vec::new();
    let mut legend: Vec<(String, String)> = Vec::new();
    let mut in_legend = false;
    let mut matrix_done = false;
    for (i, line) in lines.iter().enumerate().skip(header_at + 1) {
        let lineno = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() {
            if !gpus.is_empty() {
                matrix_done = true;
            }
            continue;
        }
        if trimmed.starts_with("NIC Legend") {
            in_legend = true;
            continue;
        }
        if in_legend {
            if let Some((label, name)) = trimmed.split_once(':') {
                let (label, name) = (label.trim(), name.trim());
                if label.starts_with("NIC")
                    && !name.is_empty()
                    && !name.contains(char::is_whitespace)
                {
                    legend.push((label.to_string(), name.to_string()));
                    continue;
                }
            }
            in_legend = false;
            continue;
        }
        if matrix_done || trimmed.starts_with("Legend") {
            matrix_done = true;
            continue;
        }
        let toks: Vec<&str> = trimmed.split_whitespace().collect();
        let Some(index) = is_gpu_label(toks[0]) else {
            continue; // NIC rows repeat the GPU rows' information
        };
        let cells = &toks[1..];
        if cells.len() < columns.len() {
            return Err(TopoError::Incomplete(format!(
                "line {lineno}: GPU{index} has {} of {} cells",
                cells.len(),
                columns.len()
            )));
        }
        let links: Vec<(String, TopoLink)> = columns
            .iter()
            .zip(cells)
            .map(|(c, t)| (c.clone(), parse_cell(t)))
            .collect();
        let mut rest = cells[columns.len()..].iter();
        let cpu_affinity = if has_cpu {
            rest.next().map(|s| s.to_string())
        } else {
            None
        };
        let numa = if has_numa {
            rest.next().and_then(|s| s.parse::<u32>().ok())
        } else {
            None
        };
        gpus.push(TopoGpu {
            index,
            cpu_affinity,
            numa,
            links,
        });
    }
    if gpus.is_empty() {
        return Err(TopoError::Incomplete("no GPU rows after the header".into()));
    }
    for want in &gpu_cols {
        if !gpus.iter().any(|g| g.index == *want) {
            return Err(TopoError::Incomplete(format!("no row for GPU{want}")));
        }
    }
    // NICn labels need the legend; other labels (older output: mlx5_0) are names already.
    let mut nics = Vec::new();
    for label in &nic_labels {
        let name = match legend.iter().find(|(l, _)| l == label) {
            Some((_, n)) => n.clone(),
            None if label.starts_with("NIC") && label[3..].parse::<u32>().is_ok() => {
                return Err(TopoError::Incomplete(format!(
                    "NIC legend has no entry for {label} (output cut short?)"
                )))
            }
            None => label.clone(),
        };
        nics.push(TopoNic {
            label: label.clone(),
            name,
        });
    }
    for g in &gpus {
        for (label, link) in &g.links {
            let is_nic = nic_labels.contains(label);
            match link {
                TopoLink::Pci(_) => {}
                TopoLink::Other(t) if is_nic => {
                    return Err(TopoError::Malformed {
                        line: 0,
                        message: format!("GPU{} -> {label}: unknown link {t:?}", g.index),
                    })
                }
                _ if is_nic => {
                    return Err(TopoError::Malformed {
                        line: 0,
                        message: format!("GPU{} -> {label}: not a PCIe path", g.index),
                    })
                }
                _ => {}
            }
        }
    }
    Ok(Topo { gpus, nics })
}

impl Topo {
    /// GPU x NIC path matrix (rows in GPU order, columns in NIC order).
    pub fn matrix(&self) -> Vec<Vec<PathType>> {
        self.gpus
            .iter()
            .map(|g| {
                self.nics
                    .iter()
                    .map(|n| {
                        g.links
                            .iter()
                            .find(|(l, _)| *l == n.label)
                            .and_then(|(_, link)| match link {
                                TopoLink::Pci(p) => Some(*p),
                                _ => None,
                            })
                            .unwrap_or(PathType::Sys)
                    })
                    .collect()
            })
            .collect()
    }

    /// NIC roles (compute when within one PCIe switch tree of a GPU).
    pub fn nic_roles(&self) -> Vec<NicRole> {
        classify_nics(&self.candidates(), &self.matrix())
    }

    fn candidates(&self) -> Vec<NicCandidate> {
        self.nics
            .iter()
            .map(|n| NicCandidate {
                hca: n.name.clone(),
                port: None,
                active: None,
                rate_gbps: None,
                link_layer: None,
            })
            .collect()
    }

    /// The affinity map (ports unknown) and the findings about it.
    pub fn affinity(&self) -> (AffinityMap, Vec<Finding>) {
        let nics = self.candidates();
        let matrix = self.matrix();
        let roles = classify_nics(&nics, &matrix);
        let refs: Vec<GpuRef> = self
            .gpus
            .iter()
            .map(|g| GpuRef {
                index: g.index,
                numa: g.numa,
                pci_bus_id: None,
            })
            .collect();
        let map = affinity_map(&refs, &nics, &roles, &matrix);
        let findings = affinity_findings(&map, &nics, &roles);
        (map, findings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = "\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n\
GPU0\t X \tNV18\tPIX\tSYS\t0-7\t0\t\tN/A\n\
GPU1\tNV18\t X \tSYS\tPIX\t8-15\t1\t\tN/A   \n\
NIC0\tPIX\tSYS\t X \tSYS\n\
NIC1\tSYS\tPIX\tSYS\t X \n\
\n\
Legend:\n\n  X    = Self\n\n\
NIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n";

    #[test]
    fn parses_cells_affinity_columns_and_legend() {
        let t = parse(SMALL).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.gpus.len(), 2);
        assert_eq!(t.gpus[1].numa, Some(1));
        assert_eq!(t.gpus[0].cpu_affinity.as_deref(), Some("0-7"));
        assert_eq!(t.gpus[0].links[1].1, TopoLink::NvLink(18));
        assert_eq!(t.nics[1].name, "mlx5_1");
        let (map, _) = t.affinity();
        let pref: Vec<_> = map
            .gpus
            .iter()
            .map(|g| g.preferred.clone().map(|p| (p.hca, p.port, p.path)))
            .collect();
        assert_eq!(
            pref,
            [
                Some(("mlx5_0".to_string(), None, PathType::Pix)),
                Some(("mlx5_1".to_string(), None, PathType::Pix))
            ]
        );
    }

    #[test]
    fn older_output_names_nics_in_the_header() {
        let text = "        GPU0    mlx5_0  mlx5_1  CPU Affinity\nGPU0     X      PXB     SOC     0-19\nmlx5_0  PXB      X      SOC\n";
        let t = parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.nics[0].name, "mlx5_0");
        assert_eq!(t.matrix()[0], [PathType::Pxb, PathType::Sys]);
    }

    #[test]
    fn cut_input_is_an_error_not_a_panic() {
        for cut in [0, 5, 20, SMALL.len() / 2, SMALL.len() - 20] {
            let r = parse(&SMALL[..cut]);
            assert!(r.is_err(), "cut at {cut} parsed: {r:?}");
        }
        assert_eq!(parse("hello\nworld\n"), Err(TopoError::NoHeader));
    }
}
