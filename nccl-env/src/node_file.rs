//! The node file: what the prober certified about this node, for the plugin to answer from.
//!
//! The format (version 1) is documented in the crate doc and in `docs/nccl-env-plugin.md`.
//! Fields this version does not know are ignored, so a newer prober may add optional fields;
//! a change an older plugin must not ignore bumps `version`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The node file version this plugin reads.
pub const NODE_FILE_VERSION: u32 = 1;

/// Variables the plugin computes from the rails; the profile's `env` may not set them.
const COMPUTED: [&str; 2] = ["NCCL_IB_HCA", "NCCL_IB_GID_INDEX"];
/// Variables with a field of their own in [`NcclProfile`].
const DEDICATED: [(&str, &str); 3] = [
    ("NCCL_SOCKET_IFNAME", "socketIfname"),
    ("NCCL_IB_TC", "trafficClass"),
    ("NCCL_IB_SL", "serviceLevel"),
];

/// One node's certificate, rails, GPUs and NCCL profile (`/run/railguard/nccl.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFile {
    /// Always [`NODE_FILE_VERSION`].
    pub version: u32,
    /// The Node's name (informational, shown in messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The FabricProfile the certificate was issued for (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    pub certificate: CertificateSummary,
    /// The node's rails as certified; host names of the HCAs.
    pub rails: Vec<Rail>,
    /// The node's GPUs and the rail serving each; empty turns the GPU filter off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<Gpu>,
    #[serde(default)]
    pub nccl: NcclProfile,
    /// What the fleet of the profile can give, for `nccl.consistentRails`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetView>,
}

/// The part of the node's certificate the plugin judges by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSummary {
    pub generation: u64,
    pub verdict: Verdict,
    /// RFC 3339, e.g. `2026-12-24T10:00:00Z`.
    pub expires_at: jiff::Timestamp,
}

/// The certificate's verdict (the node label `railguard.io/fabric`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Certified,
    /// Some rails failed; the healthy ones are still answered.
    Degraded,
    Failed,
    /// Not certified yet.
    Pending,
}

/// Health of one rail in the certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RailHealth {
    Healthy,
    Degraded,
    Failed,
}

/// One certified rail: an HCA port as the host names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rail {
    /// The host's name of the HCA, e.g. `mlx5_0`.
    pub hca: String,
    /// 1-based port.
    pub port: u32,
    /// PCI address of the HCA's physical function (`0000:0c:00.0`); a container's SR-IOV VF
    /// maps to this rail through its `physfn` link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// The port's network interface on the host, for devices whose PCI address cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
    /// RoCE GID index proven by the prober; `NCCL_IB_GID_INDEX` is answered only when every
    /// answered rail has the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u32>,
    pub health: RailHealth,
}

impl Rail {
    /// `hca:port`, the rail's id (what [`Gpu::rail`] names).
    pub fn id(&self) -> String {
        format!("{}:{}", self.hca, self.port)
    }
}

/// One GPU of the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// NVML index on the host (what `NVIDIA_VISIBLE_DEVICES` indices mean).
    pub index: u32,
    /// `GPU-…` UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// PCI bus id (`0000:19:00.0`); orders the GPUs a container sees, as CUDA indices count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// The id (`hca:port`) of the rail serving this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail: Option<String>,
}

/// The profile's NCCL settings and the plugin's policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NcclProfile {
    /// `NCCL_SOCKET_IFNAME` as NCCL reads it, e.g. `=eth0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_ifname: Option<String>,
    /// `NCCL_IB_TC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_class: Option<u8>,
    /// `NCCL_IB_SL` (0–15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_level: Option<u8>,
    /// Other NCCL variables, e.g. `NCCL_IB_QPS_PER_CONNECTION`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The node file's values replace the container's own (which are logged).
    #[serde(default)]
    pub enforce: bool,
    #[serde(default)]
    pub on_unhealthy: OnUnhealthy,
    /// Answer the fleet's rail count ([`FleetView::consistent_rail_count`]) on every node.
    #[serde(default)]
    pub consistent_rails: bool,
}

/// What an unusable certificate or an empty rail set does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnUnhealthy {
    /// Warn loudly and answer the process environment.
    #[default]
    Warn,
    /// Fail the plugin's `init`, so NCCL's first call fails instead of running degraded.
    Fail,
}

/// The fleet controller's view of the profile's nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetView {
    /// Rails every node of the profile can give (per node, whole-node view).
    pub consistent_rail_count: u32,
}

/// Why a node file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NodeFileError {
    #[error("not a json object with a numeric version")]
    NoVersion(#[source] serde_json::Error),
    #[error("version {found} is not supported (this plugin reads version {NODE_FILE_VERSION})")]
    UnsupportedVersion { found: u64 },
    #[error("not a valid version {NODE_FILE_VERSION} node file")]
    Parse(#[source] serde_json::Error),
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
}

impl NodeFile {
    /// Parses and validates a node file.
    pub fn parse(text: &str) -> Result<NodeFile, NodeFileError> {
        // The version first, so a file from another version says so instead of naming a field.
        #[derive(Deserialize)]
        struct Versioned {
            version: u64,
        }
        let v: Versioned = serde_json::from_str(text).map_err(NodeFileError::NoVersion)?;
        if v.version != u64::from(NODE_FILE_VERSION) {
            return Err(NodeFileError::UnsupportedVersion { found: v.version });
        }
        let file: NodeFile = serde_json::from_str(text).map_err(NodeFileError::Parse)?;
        file.validate()?;
        Ok(file)
    }

    /// The JSON the prober writes.
    pub fn to_json(&self) -> String {
        // A struct of strings, numbers, maps with string keys: serialising cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    fn validate(&self) -> Result<(), NodeFileError> {
        let invalid = |field: String, reason: String| Err(NodeFileError::Invalid { field, reason });
        let mut ids = BTreeSet::new();
        for (i, r) in self.rails.iter().enumerate() {
            if !is_nccl_list_word(&r.hca) {
                return invalid(
                    format!("rails[{i}].hca"),
                    format!("{:?} is not an HCA name", r.hca),
                );
            }
            if r.port == 0 {
                return invalid(format!("rails[{i}].port"), "ports are 1-based".into());
            }
            if let Some(a) = &r.pci_address {
                if normalize_pci_address(a).is_none() {
                    return invalid(
                        format!("rails[{i}].pciAddress"),
                        format!("{a:?} is not a PCI address"),
                    );
                }
            }
            if !ids.insert(r.id()) {
                return invalid(format!("rails[{i}]"), format!("rail {} twice", r.id()));
            }
        }
        let mut indices = BTreeSet::new();
        let mut uuids = BTreeSet::new();
        for (i, g) in self.gpus.iter().enumerate() {
            if !indices.insert(g.index) {
                return invalid(format!("gpus[{i}].index"), format!("GPU {} twice", g.index));
            }
            if let Some(u) = &g.uuid {
                if !uuids.insert(u.to_ascii_lowercase()) {
                    return invalid(format!("gpus[{i}].uuid"), format!("{u} twice"));
                }
            }
            if let Some(b) = &g.pci_bus_id {
                if normalize_pci_address(b).is_none() {
                    return invalid(
                        format!("gpus[{i}].pciBusId"),
                        format!("{b:?} is not a PCI address"),
                    );
                }
            }
            if let Some(rail) = &g.rail {
                if !ids.contains(rail) {
                    return invalid(
                        format!("gpus[{i}].rail"),
                        format!("{rail} is not one of the rails"),
                    );
                }
            }
        }
        let n = &self.nccl;
        if let Some(s) = &n.socket_ifname {
            if s.trim().is_empty() || s.contains(char::is_whitespace) || s.contains('\0') {
                return invalid(
                    "nccl.socketIfname".into(),
                    format!("{s:?} is not an interface list"),
                );
            }
        }
        if let Some(sl) = n.service_level {
            if sl > 15 {
                return invalid(
                    "nccl.serviceLevel".into(),
                    format!("{sl} is not a service level (0-15)"),
                );
            }
        }
        for (k, v) in &n.env {
            let field = format!("nccl.env.{k}");
            if !k.starts_with("NCCL_") || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return invalid(field, "only NCCL_* variable names belong here".into());
            }
            if COMPUTED.contains(&k.as_str()) {
                return invalid(field, "the plugin computes it from the rails".into());
            }
            if let Some((_, own)) = DEDICATED.iter().find(|(var, _)| var == k) {
                return invalid(field, format!("set it with nccl.{own}"));
            }
            if v.contains('\0') {
                return invalid(field, "the value holds a NUL byte".into());
            }
        }
        if n.consistent_rails {
            match &self.fleet {
                Some(f) if f.consistent_rail_count > 0 => {}
                _ => {
                    return invalid(
                        "fleet.consistentRailCount".into(),
                        "nccl.consistentRails needs a rail count of at least 1".into(),
                    )
                }
            }
        }
        Ok(())
    }
}

/// A name NCCL's list syntax (`=a:1,b:1`, `^…`) can carry unchanged.
fn is_nccl_list_word(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// `0000:0C:00.0` or NVML's `00000000:0c:00.0` -> `0000:0c:00.0`; `None` for anything else.
pub(crate) fn normalize_pci_address(s: &str) -> Option<String> {
    let lower = s.trim().to_ascii_lowercase();
    let (domain, rest) = lower.split_once(':')?;
    // NVML prints an eight-digit domain whose upper half is zero.
    let domain = match domain.len() {
        4 => domain,
        8 if domain.starts_with("0000") => &domain[4..],
        _ => return None,
    };
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    let func_ok = func.len() == 1 && matches!(func.as_bytes()[0], b'0'..=b'7');
    (hex(domain, 4) && hex(bus, 2) && hex(dev, 2) && func_ok)
        .then(|| format!("{domain}:{bus}:{dev}.{func}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of the node file, a PCI address in upper case and a field from a newer
    /// writer.
    const EXAMPLE: &str = include_str!("../fixtures/node-file-example.json");

    #[test]
    fn parses_every_field_of_the_documented_example() {
        let f = NodeFile::parse(EXAMPLE).unwrap();
        assert_eq!(f.certificate.generation, 7);
        assert_eq!(f.certificate.verdict, Verdict::Certified);
        assert_eq!(
            f.certificate.expires_at,
            "2026-12-24T10:00:00Z".parse::<jiff::Timestamp>().unwrap()
        );
        assert_eq!(f.rails[0].id(), "mlx5_0:1");
        assert_eq!(f.rails[0].gid_index, Some(3));
        assert_eq!(f.rails[1].health, RailHealth::Failed);
        assert_eq!(f.gpus[1].rail.as_deref(), Some("mlx5_1:1"));
        assert_eq!(f.nccl.traffic_class, Some(106));
        assert_eq!(f.nccl.on_unhealthy, OnUnhealthy::Fail);
        assert!(f.nccl.enforce && f.nccl.consistent_rails);
        assert_eq!(f.fleet.as_ref().map(|v| v.consistent_rail_count), Some(1));
    }

    #[test]
    fn round_trips_through_the_json_the_prober_writes() {
        let f = NodeFile::parse(EXAMPLE).unwrap();
        assert_eq!(NodeFile::parse(&f.to_json()).unwrap(), f);
        assert!(f.to_json().contains("\"consistentRailCount\": 1"));
    }

    #[test]
    fn policy_defaults_to_warn_without_enforcement() {
        let f = NodeFile::parse(
            r#"{"version":1,"certificate":{"generation":1,"verdict":"pending","expiresAt":"2026-01-01T00:00:00Z"},"rails":[]}"#,
        )
        .unwrap();
        assert_eq!(f.nccl, NcclProfile::default());
        assert_eq!(f.nccl.on_unhealthy, OnUnhealthy::Warn);
    }

    fn error_of(text: &str) -> String {
        let e = NodeFile::parse(text).unwrap_err();
        let mut s = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(c) = src {
            s.push_str(": ");
            s.push_str(&c.to_string());
            src = c.source();
        }
        s
    }

    #[test]
    fn garbage_and_other_versions_say_what_is_wrong() {
        assert!(error_of("not json").starts_with("not a json object with a numeric version: "));
        assert!(error_of("{}").contains("missing field `version`"));
        assert_eq!(
            error_of(r#"{"version":2,"whatever":[]}"#),
            "version 2 is not supported (this plugin reads version 1)"
        );
        let e = error_of(r#"{"version":1,"rails":[]}"#);
        assert!(
            e.starts_with("not a valid version 1 node file: missing field `certificate`"),
            "{e}"
        );
        let e = error_of(
            r#"{"version":1,"certificate":{"generation":1,"verdict":"certified","expiresAt":"tomorrow"},"rails":[]}"#,
        );
        assert!(e.starts_with("not a valid version 1 node file: "), "{e}");
    }

    fn with(edit: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut v: serde_json::Value = serde_json::from_str(EXAMPLE).unwrap();
        edit(&mut v);
        error_of(&v.to_string())
    }

    #[test]
    fn invalid_fields_are_named() {
        assert_eq!(
            with(|v| v["rails"][1]["hca"] = "mlx5_1,mlx5_9".into()),
            "rails[1].hca: \"mlx5_1,mlx5_9\" is not an HCA name"
        );
        assert_eq!(
            with(|v| v["rails"][1]["port"] = 0.into()),
            "rails[1].port: ports are 1-based"
        );
        assert_eq!(
            with(|v| v["rails"][1]["hca"] = "mlx5_0".into()),
            "rails[1]: rail mlx5_0:1 twice"
        );
        assert_eq!(
            with(|v| v["rails"][0]["pciAddress"] = "0c:00.0".into()),
            "rails[0].pciAddress: \"0c:00.0\" is not a PCI address"
        );
        assert_eq!(
            with(|v| v["gpus"][1]["rail"] = "mlx5_7:1".into()),
            "gpus[1].rail: mlx5_7:1 is not one of the rails"
        );
        assert_eq!(
            with(|v| v["gpus"][1]["index"] = 0.into()),
            "gpus[1].index: GPU 0 twice"
        );
        assert_eq!(
            with(|v| v["gpus"][1]["uuid"] = "gpu-AAAA".into()),
            "gpus[1].uuid: gpu-AAAA twice"
        );
        assert_eq!(
            with(|v| v["nccl"]["socketIfname"] = "eth0 eth1".into()),
            "nccl.socketIfname: \"eth0 eth1\" is not an interface list"
        );
        assert_eq!(
            with(|v| v["nccl"]["serviceLevel"] = 16.into()),
            "nccl.serviceLevel: 16 is not a service level (0-15)"
        );
        assert_eq!(
            with(|v| v["nccl"]["env"]["NCCL_IB_HCA"] = "mlx5_0".into()),
            "nccl.env.NCCL_IB_HCA: the plugin computes it from the rails"
        );
        assert_eq!(
            with(|v| v["nccl"]["env"]["NCCL_IB_TC"] = "3".into()),
            "nccl.env.NCCL_IB_TC: set it with nccl.trafficClass"
        );
        assert_eq!(
            with(|v| v["nccl"]["env"]["LD_PRELOAD"] = "x.so".into()),
            "nccl.env.LD_PRELOAD: only NCCL_* variable names belong here"
        );
        assert_eq!(
            with(|v| v["fleet"] = serde_json::Value::Null),
            "fleet.consistentRailCount: nccl.consistentRails needs a rail count of at least 1"
        );
    }

    #[test]
    fn pci_addresses_normalize_to_sysfs_form() {
        assert_eq!(
            normalize_pci_address("00000000:0C:00.0").as_deref(),
            Some("0000:0c:00.0")
        );
        assert_eq!(
            normalize_pci_address("0000:3b:00.1").as_deref(),
            Some("0000:3b:00.1")
        );
        for bad in [
            "",
            "3b:00.0",
            "0000:3b:00",
            "0000:3b:00.8",
            "0001000:3b:00.0",
            "zzzz:3b:00.0",
        ] {
            assert_eq!(normalize_pci_address(bad), None, "{bad}");
        }
    }
}
