//! Readiness findings: what discovery (and the fabric checks) found wrong or worth knowing,
//! with the evidence each rests on. The prober produces them, the certificate carries them,
//! and the profile says which kinds make a node fail ([`fatal_findings`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How bad a finding is.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    /// GPUDirect RDMA or a rail cannot work as intended.
    Critical,
}

/// What a finding is about. Stable names (kebab-case in JSON, profiles and reasons).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    /// A GPU's or HCA's PCIe link trained below its capability (speed or width).
    PcieDowngrade,
    /// ACS P2P redirect on a bridge between a GPU and its HCA.
    AcsRedirect,
    AcsUnknown,
    Iommu,
    /// No way to register GPU memory with the HCA (no nvidia-peermem, no DMA-BUF).
    GpuMemoryRegistration,
    PortDown,
    PortRateLow,
    NumaUnknown,
    /// A rail's HCA sits on the other socket from the GPUs it serves.
    FarNic,
    NoGpus,
    NoRdmaDevices,
    NoComputeNic,
    SharedRail,
    GpuIndexOrder,
    SysfsUnreadable,
    /// An active InfiniBand rail without a Subnet Manager (`sm_lid` 0).
    SubnetManager,
    /// A RoCE rail without a RoCE v2 GID, or whose v2 GIDs are not on its netdev or a VLAN
    /// on it.
    RoceGid,
    /// A RoCE rail's netdev MTU is below 4192, the least that gives the 4096-byte RoCE path
    /// MTU.
    Mtu,
    /// A rail's physical-layer counters (`symbol_error`, `link_error_recovery`,
    /// `link_downed`, ...) are beyond their bound.
    PhysicalLayer,
}

impl FindingKind {
    /// The kebab-case name used in profiles and reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::PcieDowngrade => "pcie-downgrade",
            FindingKind::AcsRedirect => "acs-redirect",
            FindingKind::AcsUnknown => "acs-unknown",
            FindingKind::Iommu => "iommu",
            FindingKind::GpuMemoryRegistration => "gpu-memory-registration",
            FindingKind::PortDown => "port-down",
            FindingKind::PortRateLow => "port-rate-low",
            FindingKind::NumaUnknown => "numa-unknown",
            FindingKind::FarNic => "far-nic",
            FindingKind::NoGpus => "no-gpus",
            FindingKind::NoRdmaDevices => "no-rdma-devices",
            FindingKind::NoComputeNic => "no-compute-nic",
            FindingKind::SharedRail => "shared-rail",
            FindingKind::GpuIndexOrder => "gpu-index-order",
            FindingKind::SysfsUnreadable => "sysfs-unreadable",
            FindingKind::SubnetManager => "subnet-manager",
            FindingKind::RoceGid => "roce-gid",
            FindingKind::Mtu => "mtu",
            FindingKind::PhysicalLayer => "physical-layer",
        }
    }
}

impl std::fmt::Display for FindingKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One finding with the evidence it rests on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub severity: Severity,
    /// What it concerns: a PCI address, `mlx5_4:1`, `GPU3`, or `node`.
    pub subject: String,
    pub message: String,
    /// The files and values the finding rests on (`path = value`).
    #[serde(default)]
    pub evidence: Vec<String>,
}

/// The kinds that fail certification unless a profile says otherwise: the GPUDirect path is
/// broken or detoured (ACS redirect, no registration path), a link runs below its capability,
/// a rail's HCA is on the far socket, an IB port has no Subnet Manager, a RoCE GID is wrong.
pub const DEFAULT_FATAL_FINDINGS: &[FindingKind] = &[
    FindingKind::AcsRedirect,
    FindingKind::GpuMemoryRegistration,
    FindingKind::PcieDowngrade,
    FindingKind::FarNic,
    FindingKind::SubnetManager,
    FindingKind::RoceGid,
];

/// The findings that fail certification: a fatal kind at warning or critical severity
/// (an informational finding is reported, never fatal).
pub fn fatal_findings<'a>(findings: &'a [Finding], fatal: &[FindingKind]) -> Vec<&'a Finding> {
    findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning && fatal.contains(&f.kind))
        .collect()
}

/// The certificate reason for a fatal finding: kind, subject and message.
pub fn finding_reason(f: &Finding) -> String {
    format!("{} on {}: {}", f.kind, f.subject, f.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(kind: FindingKind, severity: Severity) -> Finding {
        Finding {
            kind,
            severity,
            subject: "GPU0".into(),
            message: "x".into(),
            evidence: vec![],
        }
    }

    #[test]
    fn only_fatal_kinds_above_info_fail() {
        let all = [
            finding(FindingKind::AcsRedirect, Severity::Critical),
            finding(FindingKind::PcieDowngrade, Severity::Warning),
            finding(FindingKind::FarNic, Severity::Info),
            finding(FindingKind::Iommu, Severity::Warning),
        ];
        let fatal = fatal_findings(&all, DEFAULT_FATAL_FINDINGS);
        assert_eq!(
            fatal.iter().map(|f| f.kind).collect::<Vec<_>>(),
            [FindingKind::AcsRedirect, FindingKind::PcieDowngrade]
        );
        assert!(fatal_findings(&all, &[]).is_empty());
        assert_eq!(finding_reason(fatal[0]), "acs-redirect on GPU0: x");
    }

    #[test]
    fn kind_names_match_their_json() {
        for k in [
            FindingKind::PcieDowngrade,
            FindingKind::GpuMemoryRegistration,
            FindingKind::SubnetManager,
            FindingKind::PhysicalLayer,
        ] {
            assert_eq!(
                serde_json::to_value(k).unwrap(),
                serde_json::Value::String(k.as_str().into())
            );
        }
    }
}
