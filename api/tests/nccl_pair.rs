//! The profile's NCCL pair tests (`certification.ncclPair`) and their certificate record.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use railguard_api::certificate::{NcclPairResult, NCCL_PAIRS_KEY};
use railguard_api::profile::{NcclPairSpec, MAX_NCCL_PAIR_BYTES};
use railguard_api::{Certificate, FabricProfile, Transport};

fn h100() -> FabricProfile {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/profiles/dgx-h100-ndr.yaml"
    ))
    .unwrap();
    railguard_api::profiles_from_yaml(&text).unwrap().remove(0)
}

fn fields(p: &FabricProfile) -> Vec<String> {
    match p.validate() {
        Ok(()) => vec![],
        Err(e) => e.fields().into_iter().map(String::from).collect(),
    }
}

#[test]
fn defaults_parse_and_sizes_double_from_min_to_max() {
    let yaml = "ncclPair: {minBusbwGBps: 300}";
    let c: railguard_api::profile::CertificationSpec = serde_yaml_ng::from_str(yaml).unwrap();
    let pair = c.nccl_pair.unwrap();
    assert!(pair.full_node && pair.per_rail && !pair.require_measured);
    assert_eq!(pair.min_busbw_gbps, Some(300.0));
    assert_eq!(pair.sizes().len(), 9, "1 MiB .. 256 MiB");
    let small = NcclPairSpec {
        min_bytes: 4096,
        max_bytes: 16384,
        ..Default::default()
    };
    assert_eq!(small.sizes(), vec![4096, 8192, 16384]);
}

#[test]
fn validation_bounds_match_the_schema() {
    let mut p = h100();
    p.spec.certification.nccl_pair = Some(NcclPairSpec::default());
    assert!(fields(&p).is_empty(), "{:?}", p.validate());
    let at = |f: &str| format!("spec.certification.ncclPair.{f}");
    for (field, change) in [
        (
            "minBytes",
            (|s: &mut NcclPairSpec| s.min_bytes = 2) as fn(&mut NcclPairSpec),
        ),
        ("maxBytes", |s| s.max_bytes = MAX_NCCL_PAIR_BYTES + 1),
        ("iterations", |s| s.iterations = 0),
        ("warmup", |s| s.warmup = 101),
        ("timeoutSeconds", |s| s.timeout_seconds = 0),
        ("minBusbwGBps", |s| s.min_busbw_gbps = Some(-1.0)),
        ("minRailBusbwGBps", |s| {
            s.min_rail_busbw_gbps = Some(f64::NAN)
        }),
        ("fullNode", |s| {
            s.full_node = false;
            s.per_rail = false
        }),
        ("minBytes", |s| {
            s.min_bytes = 1 << 30;
            s.max_bytes = 1 << 20
        }),
    ] {
        let mut p = h100();
        let mut spec = NcclPairSpec::default();
        change(&mut spec);
        p.spec.certification.nccl_pair = Some(spec);
        assert_eq!(fields(&p), vec![at(field)], "{field}");
    }
    use kube::CustomResourceExt;
    let schema = serde_json::to_value(FabricProfile::crd()).unwrap();
    let pair = &schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"]["certification"]["properties"]["ncclPair"]["properties"];
    assert_eq!(pair["maxBytes"]["maximum"], MAX_NCCL_PAIR_BYTES as f64);
    assert_eq!(pair["iterations"]["minimum"], 1.0);
    assert_eq!(pair["timeoutSeconds"]["maximum"], 3600.0);
}

#[test]
fn pair_results_ride_in_the_certificate_and_unreadable_ones_are_empty() {
    let text = r#"{"version":1,"generation":1,"issuedAt":"2026-01-01T00:00:00Z",
        "expiresAt":"2026-01-02T00:00:00Z","profile":"p","signature":"s","verdict":"certified",
        "ncclPairs":[{"peer":"b","rail":"mlx5_0:1","busbwGBps":48.5,"transport":"IB","ok":true},
                     {"peer":"b","busbwGbps":390.0,"ok":true}]}"#;
    let mut c = Certificate::from_annotation(text).unwrap();
    let pairs = c.nccl_pairs();
    assert_eq!(pairs.len(), 2);
    // The second is written by the release before the rename (`busbwGbps` held GB/s): read.
    assert_eq!(pairs[0].busbw_gbps, Some(48.5));
    assert_eq!(pairs[1].busbw_gbps, Some(390.0));
    assert_eq!(pairs[0].scope(), "mlx5_0:1");
    assert_eq!(pairs[0].transport, Some(Transport::Ib));
    assert_eq!(pairs[1].scope(), "node");
    let bad = NcclPairResult {
        ok: false,
        note: Some("busbw 12 GB/s".into()),
        ..pairs[1].clone()
    };
    c.set_nccl_pairs(std::slice::from_ref(&bad));
    let written = c.to_annotation().unwrap();
    assert!(
        written.contains("\"busbwGBps\":390.0") && !written.contains("busbwGbps"),
        "{written}"
    );
    let back = Certificate::from_annotation(&written).unwrap();
    assert_eq!(back.nccl_pairs(), vec![bad]);
    c.extra
        .insert(NCCL_PAIRS_KEY.into(), serde_json::json!("garbage"));
    assert!(c.nccl_pairs().is_empty());
}
