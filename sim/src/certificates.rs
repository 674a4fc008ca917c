//! Synthetic railguard Nodes: real Node objects carrying certificates built with
//! [`railguard_api::Certificate`], for tests, benchmarks and trying the extender without
//! GPUs. Nothing here is used on the serving path.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use railguard_api::{
    keys, Certificate, FabricProfile, NcclResult, RailResult, RailVerdict, Transport, Verdict,
};

/// A certificate for `profile` issued at `issued_at`, valid for the profile's TTL, with
/// every rail measuring `rail_gbps` and the NCCL plateau at `busbw_gbps`.
pub fn certificate(
    profile: &FabricProfile,
    verdict: Verdict,
    issued_at: Timestamp,
    rail_gbps: f64,
    busbw_gbps: f64,
) -> Certificate {
    let ttl = i64::try_from(profile.spec.certification.ttl_seconds).unwrap_or(i64::MAX);
    let rails = profile
        .spec
        .rails
        .iter()
        .map(|r| RailResult {
            link_layer: Some(r.link_layer),
            state: "ACTIVE".into(),
            rate_gbps: Some(f64::from(r.rate_gbps)),
            write_bw_host_gbps: Some(rail_gbps),
            write_bw_gpu_gbps: Some(rail_gbps),
            latency_us: Some(2.0),
            ..RailResult::new(&r.hca, r.port, RailVerdict::Healthy)
        })
        .collect();
    let expires_at = issued_at
        .checked_add(SignedDuration::from_secs(ttl))
        .unwrap_or(Timestamp::MAX);
    Certificate {
        generation: 1,
        rails,
        nccl: Some(NcclResult {
            busbw_plateau_gbps: Some(busbw_gbps),
            transport: Some(Transport::Ib),
            gdr: Some(true),
            ..NcclResult::default()
        }),
        ..Certificate::new(
            profile.name(),
            &profile.spec.signature(),
            verdict,
            issued_at,
            expires_at,
        )
    }
}

/// Marks one rail degraded at `gbps`, as the prober would, and the certificate degraded.
pub fn degrade_rail(cert: &mut Certificate, hca: &str, port: u32, gbps: f64) {
    for r in cert
        .rails
        .iter_mut()
        .filter(|r| r.hca == hca && r.port == port)
    {
        r.write_bw_host_gbps = Some(gbps);
        r.verdict = RailVerdict::Degraded;
        r.reasons = vec![format!("write bandwidth {gbps} Gb/s below threshold")];
    }
    cert.verdict = Verdict::Degraded;
    cert.reasons = vec![format!("rail {hca}:{port} degraded")];
}

/// `base` renamed to `name`, with the railguard labels and annotation for `cert` (none
/// when `cert` is `None`) and `extra_labels` added.
pub fn node(
    base: &Node,
    name: &str,
    cert: Option<&Certificate>,
    extra_labels: &[(&str, &str)],
) -> Node {
    let mut node = base.clone();
    node.metadata.name = Some(name.to_string());
    node.metadata.uid = None;
    node.metadata.resource_version = None;
    let labels = node.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert("kubernetes.io/hostname".into(), name.into());
    for (k, v) in extra_labels {
        labels.insert((*k).into(), (*v).into());
    }
    if let Some(cert) = cert {
        labels.insert(keys::LABEL_FABRIC.into(), cert.verdict.as_label().into());
        labels.insert(keys::LABEL_PROFILE.into(), cert.profile.clone());
        labels.insert(keys::LABEL_SIGNATURE.into(), cert.signature.clone());
        if let Some(v) = cert.simulated_label() {
            labels.insert(keys::LABEL_SIMULATED.into(), v.into());
        }
        if let Ok(value) = cert.to_annotation() {
            node.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(keys::ANNOTATION_CERTIFICATE.into(), value);
        }
    }
    node
}
