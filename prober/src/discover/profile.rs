//! A FabricProfile for a discovered node's layout (`emit-profile`).

use std::collections::BTreeMap;

use railguard_api::profile::{
    AdmissionPolicy, CertificationSpec, ExemptionPolicy, NcclSettings, RdmaCountMode, RdmaResource,
    Thresholds,
};
use railguard_api::{FabricProfile, FabricProfileSpec, LinkLayer, RailLayout, RailSpec};

use super::{Discovery, Rail};

/// Knobs for the emitted profile that discovery cannot know.
#[derive(Clone, Debug)]
pub struct ProfileDefaults {
    /// RDMA extended resource training containers request.
    pub rdma_resource: String,
    pub shm_size: String,
    /// Share of the line rate required of RDMA WRITE and of the NCCL bus bandwidth.
    pub threshold_share: f64,
}

impl Default for ProfileDefaults {
    fn default() -> Self {
        Self {
            rdma_resource: "rdma/rdma_shared_device_a".into(),
            shm_size: "64Gi".into(),
            threshold_share: 0.9,
        }
    }
}

fn most_common<T: Ord + Copy>(items: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: BTreeMap<T, usize> = BTreeMap::new();
    for i in items {
        *counts.entry(i).or_default() += 1;
    }
    counts.into_iter().max_by_key(|(_, c)| *c).map(|(v, _)| v)
}

/// Rate and link layer per rail; a rail that is down or of unknown rate takes its peers'
/// most common value (a profile describes the intended layout; the findings report the fault).
fn resolved(rails: &[Rail]) -> Vec<(LinkLayer, u32)> {
    let rate_of = |r: &Rail| r.rate_gbps.map(|v| v.round() as u32);
    let peer_rate = most_common(
        rails
            .iter()
            .filter(|r| r.state == super::PortState::Active)
            .filter_map(rate_of),
    )
    .unwrap_or(0);
    let peer_ll = most_common(rails.iter().filter_map(|r| r.link_layer)).unwrap_or(LinkLayer::Ib);
    rails
        .iter()
        .map(|r| {
            let rate = if r.state == super::PortState::Active {
                rate_of(r).unwrap_or(peer_rate)
            } else {
                peer_rate
            };
            (r.link_layer.unwrap_or(peer_ll), rate)
        })
        .collect()
}

pub(crate) fn rail_layout(rails: &[Rail]) -> Vec<RailLayout> {
    rails
        .iter()
        .zip(resolved(rails))
        .map(|(r, (ll, rate))| RailLayout {
            hca: r.hca.clone(),
            port: r.port,
            link_layer: ll,
            rate_gbps: rate,
            gpus: r.gpus.clone(),
        })
        .collect()
}

pub(crate) fn rail_specs(rails: &[Rail]) -> Vec<RailSpec> {
    rails
        .iter()
        .zip(resolved(rails))
        .map(|(r, (ll, rate))| RailSpec {
            hca: r.hca.clone(),
            port: r.port,
            link_layer: ll,
            rate_gbps: rate,
            gpus: r.gpus.clone(),
            netdev: if ll == LinkLayer::Roce {
                r.netdev.clone()
            } else {
                None
            },
        })
        .collect()
}

/// A FabricProfile describing this node's compute rails, with thresholds derived from the
/// rail rates. The caller validates it (`FabricProfile::validate`).
pub fn profile_for(d: &Discovery, name: &str, defaults: &ProfileDefaults) -> FabricProfile {
    let rails = d.rail_specs();
    let rate = most_common(rails.iter().map(|r| r.rate_gbps)).unwrap_or(0);
    let share = defaults.threshold_share;
    // The loopback's ring sends every hop out of one GPU's NIC into the next GPU's, so its
    // busbw (GB/s) is bounded by one rail: the slowest rate / 8.
    let slowest = rails.iter().map(|r| r.rate_gbps).min().unwrap_or(0);
    let busbw = (f64::from(slowest) / 8.0 * share).round();
    let spec = FabricProfileSpec {
        node_selector: BTreeMap::new(),
        default: false,
        rails,
        nccl: NcclSettings::default(),
        rdma: Some(RdmaResource {
            resource_name: defaults.rdma_resource.clone(),
            count_mode: RdmaCountMode::SharedDevice,
            traffic_class: None,
            service_level: None,
        }),
        networks: Vec::new(),
        shm_size: Some(defaults.shm_size.clone()),
        ipc_lock: true,
        preflight: false,
        thresholds: Thresholds {
            write_bw_host_gbps: (f64::from(rate) * share).round(),
            write_bw_gpu_gbps: Some((f64::from(rate) * (share - 0.025)).round()),
            max_latency_us: Some(5.0),
            busbw_plateau_gbps: busbw,
            nvlink_busbw_gbps: None,
            counter_growth: BTreeMap::new(),
            regression_tolerance_percent: 10.0,
        },
        certification: CertificationSpec::default(),
        exemptions: ExemptionPolicy::default(),
        policy: AdmissionPolicy::default(),
        topology_keys: Vec::new(),
        fleet: railguard_api::fleet::FleetSpec::default(),
        dra: Default::default(),
    };
    FabricProfile::new(name, spec)
}
