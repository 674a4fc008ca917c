//! The rail-layout signature: a short, stable hash of what a node's compute fabric looks
//! like, so a pod configured for one layout never lands on a node with another.
//!
//! Definition (version 1, never changes; a new definition gets a new prefix):
//! 1. each rail becomes the line `hca:port:LL:rate:g0,g1,...` with `LL` = `IB` or `RoCE`,
//!    `rate` in Gb/s as an integer, and the GPU indices sorted ascending and deduplicated;
//! 2. the lines are sorted bytewise and deduplicated, then joined with `\n`;
//! 3. the text is prefixed with `railguard-layout-v1\n` and hashed with SHA-256;
//! 4. the signature is `v1-` followed by the first 12 hex digits of the digest.
//!
//! The result fits a label value (63 characters, alphanumerics and `-`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Link layer of a rail. Serialized as `IB` or `RoCE`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum LinkLayer {
    /// InfiniBand (`link_layer` = `InfiniBand` in sysfs).
    #[serde(rename = "IB")]
    Ib,
    /// RDMA over Converged Ethernet (`link_layer` = `Ethernet` in sysfs).
    #[serde(rename = "RoCE")]
    Roce,
}

impl LinkLayer {
    /// Short name used in signatures and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkLayer::Ib => "IB",
            LinkLayer::Roce => "RoCE",
        }
    }

    /// Maps the sysfs `link_layer` value (`InfiniBand`, `Ethernet`) to a link layer.
    pub fn from_sysfs(value: &str) -> Option<Self> {
        match value.trim() {
            "InfiniBand" => Some(LinkLayer::Ib),
            "Ethernet" => Some(LinkLayer::Roce),
            _ => None,
        }
    }
}

impl std::fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rail as the signature sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailLayout {
    pub hca: String,
    pub port: u32,
    pub link_layer: LinkLayer,
    pub rate_gbps: u32,
    pub gpus: Vec<u32>,
}

impl RailLayout {
    fn canonical_line(&self) -> String {
        let mut gpus = self.gpus.clone();
        gpus.sort_unstable();
        gpus.dedup();
        let gpus: Vec<String> = gpus.iter().map(u32::to_string).collect();
        format!(
            "{}:{}:{}:{}:{}",
            self.hca,
            self.port,
            self.link_layer.as_str(),
            self.rate_gbps,
            gpus.join(",")
        )
    }
}

/// The canonical text the signature hashes (exposed for documentation and debugging).
pub fn canonical_layout(rails: &[RailLayout]) -> String {
    let mut lines: Vec<String> = rails.iter().map(RailLayout::canonical_line).collect();
    lines.sort();
    lines.dedup();
    lines.join("\n")
}

/// The signature of a rail layout, e.g. `v1-3f2a9c0d41be`.
pub fn layout_signature(rails: &[RailLayout]) -> String {
    let mut h = Sha256::new();
    h.update(b"railguard-layout-v1\n");
    h.update(canonical_layout(rails).as_bytes());
    let digest = h.finalize();
    format!("v1-{}", &hex::encode(digest)[..12])
}

/// The signature a node certified against a profile carries: the profile's own when the
/// node's rails are the profile's rails (same HCAs, ports, link layers and GPUs) and differ
/// at most in their current link rate; otherwise the node's own layout signature.
///
/// Why: a link that trained down (400 → 200 Gb/s) is one bad rail of a node of this layout,
/// judged and reported per rail ("link rate 200 Gb/s, expected 400"); hashing the measured
/// rate would instead make it look like a node of another layout, and the rail's own reason
/// would be buried behind a signature mismatch.
pub fn certified_signature(node: &[RailLayout], profile: &[RailLayout]) -> String {
    let without_rate = |rails: &[RailLayout]| -> Vec<RailLayout> {
        rails
            .iter()
            .map(|r| RailLayout {
                rate_gbps: 0,
                ..r.clone()
            })
            .collect()
    };
    if canonical_layout(&without_rate(node)) == canonical_layout(&without_rate(profile)) {
        layout_signature(profile)
    } else {
        layout_signature(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certified_signature_ignores_only_a_rate_difference() {
        let profile = vec![rail("mlx5_0", 400, &[0]), rail("mlx5_1", 400, &[1])];
        let downshifted = vec![rail("mlx5_1", 400, &[1]), rail("mlx5_0", 200, &[0])];
        assert_eq!(
            certified_signature(&downshifted, &profile),
            layout_signature(&profile)
        );
        assert_ne!(layout_signature(&downshifted), layout_signature(&profile));
        // Any other difference keeps the node's own signature.
        let other_gpu = vec![rail("mlx5_0", 400, &[0]), rail("mlx5_1", 400, &[2])];
        let missing = vec![rail("mlx5_0", 400, &[0])];
        let extra = vec![
            rail("mlx5_0", 400, &[0]),
            rail("mlx5_1", 400, &[1]),
            rail("mlx5_2", 400, &[2]),
        ];
        let mut roce = profile.clone();
        roce[1].link_layer = LinkLayer::Roce;
        for node in [other_gpu, missing, extra, roce] {
            assert_eq!(
                certified_signature(&node, &profile),
                layout_signature(&node)
            );
        }
    }

    fn rail(hca: &str, rate: u32, gpus: &[u32]) -> RailLayout {
        RailLayout {
            hca: hca.into(),
            port: 1,
            link_layer: LinkLayer::Ib,
            rate_gbps: rate,
            gpus: gpus.to_vec(),
        }
    }

    #[test]
    fn order_does_not_matter() {
        let a = vec![rail("mlx5_0", 400, &[0, 1]), rail("mlx5_1", 400, &[2])];
        let b = vec![rail("mlx5_1", 400, &[2]), rail("mlx5_0", 400, &[1, 0])];
        assert_eq!(layout_signature(&a), layout_signature(&b));
    }

    #[test]
    fn any_changed_field_changes_the_signature() {
        let base = vec![rail("mlx5_0", 400, &[0]), rail("mlx5_1", 400, &[1])];
        let sig = layout_signature(&base);
        let mut rate = base.clone();
        rate[1].rate_gbps = 200;
        let mut ll = base.clone();
        ll[0].link_layer = LinkLayer::Roce;
        let mut port = base.clone();
        port[0].port = 2;
        let mut gpus = base.clone();
        gpus[0].gpus = vec![1];
        for other in [rate, ll, port, gpus] {
            assert_ne!(sig, layout_signature(&other));
        }
    }

    #[test]
    fn signature_is_pinned_across_versions() {
        // Pinned value: changing the definition must be a deliberate new version.
        let layout = vec![rail("mlx5_0", 400, &[0]), rail("mlx5_1", 400, &[1])];
        assert_eq!(
            canonical_layout(&layout),
            "mlx5_0:1:IB:400:0\nmlx5_1:1:IB:400:1"
        );
        let sig = layout_signature(&layout);
        assert_eq!(sig.len(), 15);
        assert!(sig.starts_with("v1-"));
        assert_eq!(sig, PINNED);
    }

    // sha256("railguard-layout-v1\nmlx5_0:1:IB:400:0\nmlx5_1:1:IB:400:1"), checked with sha256sum.
    const PINNED: &str = "v1-734e71eb700d";
}
