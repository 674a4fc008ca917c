//! Property-based fuzzing of the api crate's decoders of outside input (issue #14): the
//! certificate annotation, FabricProfile YAML, `NCCL_IB_HCA` values and resource quantities,
//! and a Node's fabric labels and annotation. Each gets mutations of real documents and raw
//! input; none may panic, every rejection must be a clear error, and what decodes must
//! re-encode and decode to itself.
//!
//! `RAILGUARD_FUZZ_CASES=1000000 cargo test --release -p railguard-api --test fuzz` is the
//! benchmark-style run of BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "fuzz_support/mod.rs"]
mod fuzz_support;

use std::collections::BTreeMap;

use fuzz_support::{
    check_error, check_message, config, json_dictionary, mutated_text, raw_bytes, raw_text,
    JSON_SYNTAX,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use railguard_api::certificate::MAX_CERTIFICATE_BYTES;
use railguard_api::keys;
use railguard_api::profile::{derive_ib_hca, parse_ib_hca};
use railguard_api::quantity::parse_bytes;
use railguard_api::{profiles_from_yaml, Certificate, FabricState, NodeFabric};

const H100: &str = include_str!("../fixtures/profiles/dgx-h100-ndr.yaml");
const A100: &str = include_str!("../fixtures/profiles/dgx-a100-hdr.yaml");
const ROCE: &str = include_str!("../fixtures/profiles/roce-cloud.yaml");

/// A certificate with every part the prober writes: rails with wire and GPU-memory results,
/// GPUs, NCCL, findings, software, history, NCCL pair results and a field of a newer writer.
const CERTIFICATE: &str = r#"{"version":1,"generation":42,"issuedAt":"2026-11-29T11:00:00Z",
"expiresAt":"2026-11-30T11:00:00Z","profile":"h100-ndr","signature":"s8-ib400-0a1b2c3d",
"node":"gpu-1","verdict":"degraded","reasons":["rail mlx5_3:1 write bandwidth 196 Gb/s"],
"rails":[{"hca":"mlx5_0","port":1,"linkLayer":"IB","state":"ACTIVE","rateGbps":400.0,
"writeBwHostGbps":392.5,"writeBwGpuGbps":388.0,"latencyUs":2.1,
"counterDeltas":{"symbol_error":0,"link_downed":3},"verdict":"healthy",
"wire":[{"peer":"gpu-2","writeBwGbps":391.2,"latencyUs":2.4,"ok":true,
"testedAt":"2026-11-29T10:00:00Z","note":"ok"}],
"gpuMemory":{"gpu":0,"registration":"dma-buf","unavailable":["peermem: not loaded"],
"latencyUs":2.9,"farGpu":4,"farWriteBwGbps":310.5}},
{"hca":"mlx5_3","port":1,"linkLayer":"RoCE","state":"ACTIVE","rateGbps":400.0,
"writeBwHostGbps":196.0,"verdict":"degraded","reasons":["write bandwidth 196 Gb/s"]}],
"gpus":[{"gpu":0,"pciBusId":"0000:18:00.0","preferredHca":"mlx5_0","port":1,"path":"PXB","numa":0},
{"gpu":1,"preferredHca":"mlx5_3","path":"SYS"}],
"nccl":{"busbwPlateauGBps":371.2,"algbwGBps":198.0,"avgBusbwGBps":120.5,"transport":"IB",
"gdr":true,"wrong":0,"hcas":["mlx5_0:1","mlx5_3:1"],"ncclVersion":"2.21.5"},
"findings":[{"kind":"pcie-downgrade","severity":"critical","subject":"GPU3",
"message":"PCIe link at 16 GT/s x8, capable of 32 GT/s x16",
"evidence":["sys/bus/pci/devices/0000:9a:00.0/current_link_width = 8"]}],
"software":{"driver":"550.54.15","cuda":"12.4"},"passiveCheckedAt":"2026-11-29T11:30:00Z",
"history":[{"issuedAt":"2026-11-28T11:00:00Z","verdict":"certified","busbwPlateauGBps":372.0,
"railWriteBwGbps":{"mlx5_0:1":392.0},"software":{"driver":"550.54.15"}}],
"ncclPairs":[{"peer":"gpu-2","rail":"mlx5_0:1","busbwGBps":48.5,"transport":"IB","ok":true}],
"futureField":{"x":[1,2.5,-3,"y",null,true]}}"#;

const MINIMAL_CERTIFICATE: &str = r#"{"version":1,"generation":1,"issuedAt":"2026-01-01T00:00:00Z",
"expiresAt":"2026-01-02T00:00:00Z","profile":"p","signature":"s","verdict":"certified"}"#;

/// The certificate annotation's own tokens, for [`JSON_TOKENS`] after [`JSON_SYNTAX`].
const CERTIFICATE_TOKENS: &[&str] = &[
    "false",
    "\"version\":",
    "\"version\":2",
    "\"rails\":",
    "\"verdict\":\"failed\"",
    "\"port\":",
    "\"issuedAt\":",
    "\"extra\":",
    "2026-13-45T99:99:99Z",
    "\"2026-11-29T11:00:00+05:00\"",
    "\"healthy\"",
    "\"PXB\"",
    "\"IB\"",
    "\"RoCE\"",
    "1e308",
    "-0.0",
    "\\\"",
    "\\n",
];

const JSON_TOKENS: &[&str] =
    &json_dictionary::<{ JSON_SYNTAX.len() + CERTIFICATE_TOKENS.len() }>(CERTIFICATE_TOKENS);

const YAML_TOKENS: &[&str] = &[
    "\n---\n",
    "---",
    "...",
    "\n",
    "- ",
    ": ",
    "{",
    "}",
    "[",
    "]",
    "&a ",
    "*a",
    "<<: *a",
    "!!binary ",
    "!!str ",
    "!!float ",
    "? ",
    "|\n",
    ">-\n",
    "'",
    "\"",
    "#",
    "~",
    "null",
    "yes",
    "no",
    "0o17",
    "0x1F",
    ".inf",
    ".nan",
    "-.inf",
    "1e3",
    "rails:",
    "hca: ",
    "port: ",
    "gpus: [",
    "rateGbps: ",
    "linkLayer: IB",
    "linkLayer: RoCE",
    "metadata:",
    "name: ",
    "spec:",
    "apiVersion: railguard.io/v1alpha1",
    "kind: FabricProfile",
    "shmSize: ",
    "thresholds:",
    "nccl:",
    "env:",
    "NCCL_IB_HCA: ",
    "\t",
    "  ",
    "    ",
];

const HCA_TOKENS: &[&str] = &[
    "^", "=", "^=", "=^", ",", ":", ":1", ":0", ":65536", "mlx5_0", "mlx5_10", "ibp12s0", " ",
];

const QUANTITY_TOKENS: &[&str] = &[
    "Ki",
    "Mi",
    "Gi",
    "Ti",
    "Pi",
    "Ei",
    "k",
    "M",
    "G",
    "T",
    "P",
    "E",
    "m",
    "u",
    "n",
    "e",
    "E9",
    "e-3",
    ".",
    "+",
    "-",
    "64",
    "1.5",
    "999999999999999999",
];

/// Decodes a certificate annotation; what decodes re-encodes and decodes to itself.
fn certificate_property(text: &str) -> Result<(), TestCaseError> {
    match Certificate::from_annotation(text) {
        Ok(c) => {
            let encoded = c
                .to_annotation()
                .map_err(|e| TestCaseError::fail(format!("decoded, cannot encode: {e}")))?;
            let again = Certificate::from_annotation(&encoded).map_err(|e| {
                TestCaseError::fail(format!("re-encoded {encoded:?} does not decode: {e}"))
            })?;
            prop_assert_eq!(&again, &c, "round trip changed the certificate");
            // Readers use these on any decoded certificate.
            let _ = c.nccl_pairs();
            let _ = c.is_expired(Timestamp::UNIX_EPOCH);
            Ok(())
        }
        Err(e) => check_error(&e),
    }
}

/// Decodes a FabricProfile stream; what decodes is valid, re-encodes to itself, and its
/// derived `NCCL_IB_HCA` parses back to its rails.
fn profiles_property(text: &str) -> Result<(), TestCaseError> {
    match profiles_from_yaml(text) {
        Ok(profiles) => {
            for p in &profiles {
                prop_assert!(p.validate().is_ok());
                let yaml = serde_yaml_ng::to_string(p)
                    .map_err(|e| TestCaseError::fail(format!("cannot encode: {e}")))?;
                let again = profiles_from_yaml(&yaml).map_err(|e| {
                    TestCaseError::fail(format!("re-encoded {yaml:?} does not decode: {e}"))
                })?;
                prop_assert_eq!(again.len(), 1);
                prop_assert_eq!(&again[0].spec, &p.spec, "round trip changed the spec");
                prop_assert_eq!(&again[0].metadata, &p.metadata);
                let derived = derive_ib_hca(&p.spec.rails);
                let parsed = parse_ib_hca(&derived).map_err(|e| {
                    TestCaseError::fail(format!("derived NCCL_IB_HCA {derived:?}: {e}"))
                })?;
                prop_assert_eq!(parsed.entries.len(), p.spec.rails.len());
                let _ = p.spec.signature();
                let _ = p.spec.topology_keys();
                let _ = p.spec.nccl_ib_hca();
            }
            Ok(())
        }
        Err(e) => check_error(&e),
    }
}

fn ib_hca_property(value: &str) -> Result<(), TestCaseError> {
    match parse_ib_hca(value) {
        Ok(list) => {
            prop_assert!(!list.entries.is_empty(), "{value:?} parsed to no entries");
            for e in &list.entries {
                prop_assert!(!e.hca.is_empty(), "{value:?} has an empty HCA name");
                prop_assert!(e.port != Some(0), "{value:?} has port 0");
            }
            Ok(())
        }
        Err(message) => check_message(&message),
    }
}

fn quantity_property(value: &str) -> Result<(), TestCaseError> {
    match parse_bytes(value) {
        Ok(_) => Ok(()),
        Err(e) => check_error(&e),
    }
}

/// A Node with fuzzed fabric labels and certificate annotation is interpreted without a
/// panic, and an unreadable one says why.
fn node_property(fabric: &str, annotation: Option<&str>) -> Result<(), TestCaseError> {
    let mut labels = BTreeMap::new();
    labels.insert(keys::LABEL_FABRIC.to_string(), fabric.to_string());
    labels.insert(keys::LABEL_PROFILE.to_string(), "h100-ndr".to_string());
    let node = Node {
        metadata: ObjectMeta {
            name: Some("gpu-1".into()),
            labels: Some(labels),
            annotations: annotation.map(|a| {
                BTreeMap::from([(keys::ANNOTATION_CERTIFICATE.to_string(), a.to_string())])
            }),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    let now: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
    if let FabricState::Unreadable { reason } = NodeFabric::from_node(&node, now).state {
        check_message(&reason)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(2_000))]

    #[test]
    fn certificate_annotation_mutations(
        text in mutated_text(&[CERTIFICATE, MINIMAL_CERTIFICATE], JSON_TOKENS, 6)
    ) {
        certificate_property(&text)?;
    }

    #[test]
    fn certificate_annotation_raw(text in raw_text(JSON_TOKENS)) {
        certificate_property(&text)?;
    }

    #[test]
    fn certificate_annotation_raw_bytes(bytes in raw_bytes(512)) {
        certificate_property(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn profile_yaml_mutations(text in mutated_text(&[H100, A100, ROCE], YAML_TOKENS, 6)) {
        profiles_property(&text)?;
    }

    #[test]
    fn profile_yaml_raw(text in raw_text(YAML_TOKENS)) {
        profiles_property(&text)?;
    }

    #[test]
    fn ib_hca_values(
        value in prop_oneof![
            mutated_text(&["=mlx5_0:1,mlx5_3:1,mlx5_4:1", "^mlx5_4", "mlx5"], HCA_TOKENS, 4),
            raw_text(HCA_TOKENS),
        ]
    ) {
        ib_hca_property(&value)?;
    }

    #[test]
    fn quantities(
        value in prop_oneof![
            mutated_text(&["64Gi", "512M", "1.5Ti", "100m", "1e3", "0"], QUANTITY_TOKENS, 3),
            raw_text(QUANTITY_TOKENS),
        ]
    ) {
        quantity_property(&value)?;
    }

    #[test]
    fn node_fabric(
        fabric in prop_oneof![
            Just("certified".to_string()),
            Just("degraded".to_string()),
            raw_text(&[]),
        ],
        annotation in proptest::option::of(
            mutated_text(&[CERTIFICATE, MINIMAL_CERTIFICATE], JSON_TOKENS, 3)
        ),
    ) {
        node_property(&fabric, annotation.as_deref())?;
    }
}

#[test]
fn seeds_decode() {
    for seed in [CERTIFICATE, MINIMAL_CERTIFICATE] {
        certificate_property(seed).unwrap();
        Certificate::from_annotation(seed).unwrap();
    }
    for seed in [H100, A100, ROCE] {
        profiles_property(seed).unwrap();
        assert_eq!(profiles_from_yaml(seed).unwrap().len(), 1);
    }
}

#[test]
fn oversize_certificates_are_rejected_before_parsing() {
    let huge = format!(
        "{}{}",
        CERTIFICATE,
        " ".repeat(MAX_CERTIFICATE_BYTES + 1 - CERTIFICATE.len())
    );
    let err = Certificate::from_annotation(&huge).unwrap_err();
    assert!(err.to_string().contains("over the 256 KiB limit"), "{err}");
}

/// Found by `profile_yaml_mutations`: a GPU index near `u32::MAX` made validation walk every
/// index up to it ("GPU g is served by no rail"), hanging the reader and growing without
/// bound. Now the index is one clear problem.
#[test]
fn huge_gpu_index_is_one_problem_not_a_hang() {
    let text = H100.replacen("gpus: [0]", "gpus: [4294967295]", 1);
    assert_ne!(text, H100, "the fixture names GPU 0 on a rail");
    let err = profiles_from_yaml(&text).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("GPU index 4294967295 is above 255"),
        "{message}"
    );
    assert!(!message.contains("served by no rail"), "{message}");
}
