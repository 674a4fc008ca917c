//! A simulated node's RDMA engine: the rails of a node model (rates, latencies, port states
//! and faults of `prober/models/*.yaml`) plus wire faults that only show between nodes (a bad
//! cable behind a rail, a bad path to one peer, given on the command line).

use std::collections::BTreeMap;
use std::path::Path;

use railguard_prober::rdma::RdmaError;

use crate::rdma::{
    SimGidSlot, SimGidTable, SimLinkFault, SimRailModel, SimRdmaModel, SimulatedRdmaEngine,
};
use crate::sysfs::{hca_locations, port_gid_table};
use crate::{ModelPortState, NodeModel};

/// A simulated node's faults or engine could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SimNodeError {
    /// A `--sim-link` or `--sim-wire` value is malformed (the message names the flag).
    #[error("invalid argument: {reason}")]
    Invalid { reason: String },
    #[error("invalid simulated RDMA model")]
    Rdma(#[source] RdmaError),
}

/// The RDMA model of `node_name` from its node model: one rail per HCA port, with the GID
/// table [`crate::write_sysfs`] gives that port.
pub fn rdma_model(model: &NodeModel, node_name: &str) -> SimRdmaModel {
    let gpudirect = model.platform.nvidia_peermem || model.platform.open_kernel_module;
    let locations = hca_locations(model);
    let mut rails = BTreeMap::new();
    for hca in model.hcas() {
        for port in &hca.ports {
            let gids = locations.get(&hca.name).map(|&(bus, func)| SimGidTable {
                roce: port.link_layer == railguard_api::LinkLayer::Roce,
                slots: port_gid_table(port, bus, func)
                    .into_iter()
                    .map(|slot| {
                        slot.map(|(gid, gid_type)| SimGidSlot {
                            gid,
                            gid_type: gid_type.to_string(),
                        })
                    })
                    .collect(),
            });
            let active = port.state == ModelPortState::Active;
            let host = port.simulated_write_bw_gbps(false);
            let gpu = port.simulated_write_bw_gbps(true);
            rails.insert(
                format!("{}:{}", hca.name, port.port),
                SimRailModel {
                    // An inactive port still needs a positive model value; `active` decides.
                    bw_host_gbps: if host > 0.0 { host } else { 1.0 },
                    bw_gpu_gbps: (gpudirect && gpu > 0.0).then_some(gpu),
                    latency_us: if port.latency_us > 0.0 {
                        port.latency_us
                    } else {
                        2.5
                    },
                    active,
                    fault: None,
                    wire: None,
                    gids,
                },
            );
        }
    }
    SimRdmaModel {
        node: node_name.to_string(),
        rails,
        links: BTreeMap::new(),
    }
}

/// Parses a wire fault value: `dead`, or a bandwidth factor in (0, 1].
fn parse_fault(value: &str, what: &str) -> Result<SimLinkFault, SimNodeError> {
    let value = value.trim();
    if value == "dead" {
        return Ok(SimLinkFault {
            bw_factor: 1.0,
            dead: true,
            hcas: vec![],
        });
    }
    match value.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 && f <= 1.0 => Ok(SimLinkFault {
            bw_factor: f,
            dead: false,
            hcas: vec![],
        }),
        _ => Err(SimNodeError::Invalid {
            reason: format!("{what}: {value:?} is neither `dead` nor a factor in (0, 1]"),
        }),
    }
}

/// `--sim-link PEER=dead|FACTOR[@HCA,HCA...]`: the path from this node to PEER.
pub fn parse_link(spec: &str) -> Result<(String, SimLinkFault), SimNodeError> {
    let (peer, rest) = spec.split_once('=').ok_or_else(|| SimNodeError::Invalid {
        reason: format!("--sim-link {spec:?} is not PEER=dead|FACTOR[@HCA,...]"),
    })?;
    let (value, hcas) = match rest.split_once('@') {
        Some((v, h)) => (
            v,
            h.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
        ),
        None => (rest, Vec::new()),
    };
    if peer.trim().is_empty() {
        return Err(SimNodeError::Invalid {
            reason: format!("--sim-link {spec:?} names no peer"),
        });
    }
    let mut fault = parse_fault(value, "--sim-link")?;
    fault.hcas = hcas;
    Ok((peer.trim().to_string(), fault))
}

/// `--sim-wire HCA:PORT=dead|FACTOR`: the cable or switch port behind one rail.
pub fn parse_wire(spec: &str) -> Result<(String, SimLinkFault), SimNodeError> {
    let (rail, value) = spec.split_once('=').ok_or_else(|| SimNodeError::Invalid {
        reason: format!("--sim-wire {spec:?} is not HCA:PORT=dead|FACTOR"),
    })?;
    Ok((rail.trim().to_string(), parse_fault(value, "--sim-wire")?))
}

/// The engine of a simulated node with its wire faults.
pub fn engine(
    model: &NodeModel,
    node_name: &str,
    links: &[String],
    wires: &[String],
) -> Result<SimulatedRdmaEngine, SimNodeError> {
    let mut m = rdma_model(model, node_name);
    for spec in links {
        let (peer, fault) = parse_link(spec)?;
        m.links.insert(peer, fault);
    }
    for spec in wires {
        let (rail, fault) = parse_wire(spec)?;
        let known = m.rails.keys().cloned().collect::<Vec<_>>().join(", ");
        let r = m
            .rails
            .get_mut(&rail)
            .ok_or_else(|| SimNodeError::Invalid {
                reason: format!("--sim-wire names rail {rail}, the model has {known}"),
            })?;
        r.wire = Some(fault);
    }
    SimulatedRdmaEngine::new(m).map_err(SimNodeError::Rdma)
}

/// The file name of the `all_reduce_perf` stand-in (installed next to the prober).
pub const STANDIN_BINARY: &str = "all_reduce_perf_sim";

/// The environment that points the stand-in at the simulated tree of `node` at `root`.
pub fn standin_env(root: &Path, node: &str) -> Vec<(String, String)> {
    vec![
        ("RAILGUARD_SIM_ROOT".into(), root.display().to_string()),
        ("RAILGUARD_SIM_HOSTNAME".into(), node.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn model(name: &str) -> NodeModel {
        NodeModel::builtin(name).unwrap()
    }

    #[test]
    fn rails_follow_the_model_and_its_faults() {
        let healthy = rdma_model(&model("dgx-h100.yaml"), "a");
        let r = &healthy.rails["mlx5_4:1"];
        assert!(r.bw_host_gbps > 380.0 && r.active, "{r:?}");
        let slow = rdma_model(&model("h100-rate-downshift.yaml"), "a");
        assert!(slow.rails["mlx5_4:1"].bw_host_gbps < 200.0);
        assert_eq!(
            slow.rails["mlx5_0:1"].bw_host_gbps,
            healthy.rails["mlx5_0:1"].bw_host_gbps
        );
        // A slow rail links at full rate and moves 85% of a healthy rail's bandwidth.
        let marginal = rdma_model(&model("h100-slow-rail.yaml"), "a");
        let (m, h) = (&marginal.rails["mlx5_4:1"], &healthy.rails["mlx5_4:1"]);
        assert!(m.active);
        assert!(
            (m.bw_host_gbps - h.bw_host_gbps * 0.85).abs() < 1e-9,
            "{m:?}"
        );
        assert!(
            (m.bw_gpu_gbps.unwrap() - h.bw_gpu_gbps.unwrap() * 0.85).abs() < 1e-9,
            "{m:?}"
        );
        assert_eq!(marginal.rails["mlx5_0:1"].bw_host_gbps, h.bw_host_gbps);
        let mut bad = model("dgx-h100.yaml");
        let e = bad
            .apply(&crate::model::Fault::PortBandwidth {
                hca: "mlx5_4".into(),
                port: 1,
                percent: 140.0,
            })
            .unwrap_err();
        assert!(e.to_string().contains("(0, 100]"), "{e}");
    }

    /// The engine runs on the GID the verbs engine would choose on the simulated node: on
    /// mlx5's usual RoCE table (v1, v2 per address, link-local first) the IPv4 v2 entry,
    /// index 3, never the v1 entry of the same address before it.
    #[test]
    fn the_simulated_engine_chooses_its_gid_from_the_nodes_table_as_nccl_does() {
        use railguard_prober::discover::gid::parse_sysfs_gid;
        use railguard_prober::rdma::{MemoryKind, PeerRdmaEngine, RailBenchRequest, RdmaEngine};

        let roce = model("roce-cloud.yaml");
        let dir = tempfile::tempdir().unwrap();
        crate::write_sysfs(&roce, dir.path()).unwrap();
        let e = engine(&roce, "a", &[], &[]).unwrap();
        for hca in ["mlx5_0", "mlx5_5"] {
            let ports = dir
                .path()
                .join("sys/class/infiniband")
                .join(hca)
                .join("ports/1");
            let read = |rel: &str| std::fs::read_to_string(ports.join(rel)).unwrap();
            assert_eq!(read("gid_attrs/types/2").trim(), "IB/RoCE v1");
            assert_eq!(read("gid_attrs/types/3").trim(), "RoCE v2");
            assert_eq!(
                read("gids/2"),
                read("gids/3"),
                "one IPv4 address, v1 then v2"
            );
            let want: String = parse_sysfs_gid(&read("gids/3"))
                .unwrap()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert!(want.starts_with("00000000000000000000ffff"), "{want}");

            let ep = e.open_endpoint(hca, 1, MemoryKind::Host, 4096).unwrap();
            let info = ep.info();
            assert_eq!(
                (info.gid_index, info.gid.as_str()),
                (3, want.as_str()),
                "{hca}"
            );
            let r = e
                .loopback(&RailBenchRequest {
                    sizes: vec![8],
                    iterations: 2,
                    ..RailBenchRequest::host(hca, 1)
                })
                .unwrap();
            assert_eq!(
                (r.gid_index, r.gid.as_deref()),
                (Some(3), Some(want.as_str()))
            );
        }

        // RoCE v2 off (v1 only): NCCL falls back to the IPv4 address's v1 entry.
        let mut v1_only = roce.clone();
        v1_only
            .apply(&crate::model::Fault::RoceGids {
                hca: "mlx5_0".into(),
                port: 1,
                gids: crate::RoceGids::V1Only,
            })
            .unwrap();
        let e = engine(&v1_only, "a", &[], &[]).unwrap();
        let ep = e
            .open_endpoint("mlx5_0", 1, MemoryKind::Host, 4096)
            .unwrap();
        assert_eq!(ep.info().gid_index, 2);

        // InfiniBand: index 0, the port GID (fe80::<node guid>), as the verbs engine.
        let ib = engine(&model("dgx-h100.yaml"), "a", &[], &[]).unwrap();
        let info = ib
            .open_endpoint("mlx5_0", 1, MemoryKind::Host, 4096)
            .unwrap()
            .info();
        assert_eq!(info.gid_index, 0);
        assert!(info.gid.starts_with("fe80000000000000"), "{}", info.gid);
    }

    /// The engine's GID tables are the ones the sysfs writer puts on disk: its layout walk
    /// places every HCA of every shipped model where the writer does.
    #[test]
    fn hca_locations_follow_the_sysfs_writer() {
        for (name, _) in crate::BUILTIN_MODELS {
            let m = NodeModel::builtin(name).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let tree = crate::write_sysfs(&m, dir.path()).unwrap();
            let locations = hca_locations(&m);
            assert_eq!(locations.len(), m.hcas().len(), "{name}");
            for (hca, (bus, func)) in &locations {
                let at = tree.addresses.get(hca).unwrap();
                let want = format!(":{bus:02x}:00.{:x}", (*func).min(7));
                assert!(at.ends_with(&want), "{name} {hca}: {at} vs {want}");
            }
            for (key, rail) in rdma_model(&m, "a").rails {
                let (hca, port) = key.split_once(':').unwrap();
                let dir = dir
                    .path()
                    .join("sys/class/infiniband")
                    .join(hca)
                    .join("ports")
                    .join(port);
                let table = rail.gids.unwrap();
                for (i, slot) in table.slots.iter().enumerate() {
                    let gid =
                        std::fs::read_to_string(dir.join("gids").join(i.to_string())).unwrap();
                    let gid_type =
                        std::fs::read_to_string(dir.join("gid_attrs/types").join(i.to_string()))
                            .ok();
                    match slot {
                        Some(s) => {
                            assert_eq!(s.gid, gid.trim(), "{name} {key} {i}");
                            assert_eq!(
                                Some(s.gid_type.as_str()),
                                gid_type.as_deref().map(str::trim)
                            );
                        }
                        None => assert!(gid_type.is_none(), "{name} {key} {i}"),
                    }
                }
            }
        }
    }

    #[test]
    fn fault_specs_parse_or_explain() {
        let (peer, f) = parse_link("node-b=dead@mlx5_0,mlx5_3").unwrap();
        assert_eq!(peer, "node-b");
        assert!(f.dead);
        assert_eq!(f.hcas, vec!["mlx5_0", "mlx5_3"]);
        let (_, f) = parse_link("node-c=0.5").unwrap();
        assert_eq!(f.bw_factor, 0.5);
        assert!(parse_link("node-c")
            .unwrap_err()
            .to_string()
            .contains("PEER="));
        assert!(parse_link("node-c=1.5")
            .unwrap_err()
            .to_string()
            .contains("(0, 1]"));
        assert!(parse_link("=dead").is_err());
        let (rail, f) = parse_wire("mlx5_0:1=0.3").unwrap();
        assert_eq!((rail.as_str(), f.bw_factor), ("mlx5_0:1", 0.3));
        let e = engine(
            &model("dgx-h100.yaml"),
            "a",
            &[],
            &["mlx5_99:1=dead".into()],
        )
        .unwrap_err();
        assert!(e.to_string().contains("mlx5_99:1"), "{e}");
    }
}
