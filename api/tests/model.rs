//! Unit tests of the shared model: profile validation, signatures, certificates, NodeFabric.

#![allow(clippy::unwrap_used, clippy::type_complexity)] // test fixtures: a bad one fails loudly; case tables are tuples

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use railguard_api::certificate::{human_duration, CERTIFICATE_VERSION};
use railguard_api::node::interpret;
use railguard_api::profile::{derive_ib_hca, parse_ib_hca};
use railguard_api::*;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/fixtures/profiles/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn h100() -> FabricProfile {
    let mut p = profiles_from_yaml(&fixture("dgx-h100-ndr.yaml")).unwrap();
    p.remove(0)
}

/// The DGX profiles shipped for each GPU generation: fixture, name, GFD product label, the
/// HCA model and line rate its header comment cites (with the vendor page), and the rate.
const SHIPPED_GPU_PROFILES: [(&str, &str, &str, &str, u32); 4] = [
    (
        "dgx-h100-ndr.yaml",
        "h100-ndr",
        "NVIDIA-H100-80GB-HBM3",
        "ConnectX-7",
        400,
    ),
    (
        "dgx-h200-ndr.yaml",
        "h200-ndr",
        "NVIDIA-H200",
        "ConnectX-7",
        400,
    ),
    (
        "dgx-b200-ndr.yaml",
        "b200-ndr",
        "NVIDIA-B200",
        "ConnectX-7",
        400,
    ),
    (
        "dgx-a100-hdr.yaml",
        "a100-hdr",
        "NVIDIA-A100-SXM4-80GB",
        "ConnectX-6",
        200,
    ),
];

#[test]
fn each_shipped_gpu_profile_validates_and_has_the_rate_and_hca_its_comment_cites() {
    for (file, name, product, hca_model, rate) in SHIPPED_GPU_PROFILES {
        let text = fixture(file);
        let p = profiles_from_yaml(&text)
            .unwrap_or_else(|e| panic!("{file}: {e}"))
            .remove(0);
        p.validate().unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(p.name(), name, "{file}");
        assert_eq!(
            p.spec
                .node_selector
                .get("nvidia.com/gpu.product")
                .map(String::as_str),
            Some(product),
            "{file}: selected by GPU Feature Discovery's product label"
        );
        // The header comment (before the object) names the HCA model and the line rate.
        let header: String = text
            .lines()
            .take_while(|l| l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            header.contains(hca_model),
            "{file}: comment cites {hca_model}"
        );
        assert!(
            header.contains(&format!("{rate} Gb/s")),
            "{file}: comment cites {rate} Gb/s"
        );
        // One InfiniBand rail per GPU, each at the cited line rate.
        assert_eq!(p.spec.rails.len(), 8, "{file}");
        for (i, r) in p.spec.rails.iter().enumerate() {
            assert_eq!(r.link_layer, LinkLayer::Ib, "{file} rail {i}");
            assert_eq!(r.rate_gbps, rate, "{file} rail {i}");
            assert_eq!(r.gpus, [u32::try_from(i).unwrap()], "{file} rail {i}");
        }
        // Thresholds a healthy node reaches at that rate: the HCA loopback at most 90% of
        // the line rate, the NCCL loopback (bounded by one rail, rate/8 GB/s) at most 80%.
        let t = &p.spec.thresholds;
        let rate = f64::from(rate);
        assert!(t.write_bw_host_gbps <= 0.9 * rate, "{file}");
        assert!(
            t.write_bw_gpu_gbps.unwrap_or(0.0) <= t.write_bw_host_gbps,
            "{file}"
        );
        assert!(t.busbw_plateau_gbps <= 0.8 * rate / 8.0, "{file}");
    }
    // Where the comment cites a vendor page, it is NVIDIA's documentation.
    for file in ["dgx-h200-ndr.yaml", "dgx-b200-ndr.yaml"] {
        assert!(fixture(file).contains("https://docs.nvidia.com/"), "{file}");
    }
}

#[test]
fn example_profiles_are_valid() {
    for f in [
        "dgx-h100-ndr.yaml",
        "dgx-h200-ndr.yaml",
        "dgx-b200-ndr.yaml",
        "dgx-a100-hdr.yaml",
        "roce-cloud.yaml",
    ] {
        let profiles = profiles_from_yaml(&fixture(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(profiles.len(), 1, "{f}");
        assert_eq!(profiles[0].spec.rails.len(), 8, "{f}");
    }
}

#[test]
fn derived_ib_hca_is_exact_match_in_rail_order() {
    let p = h100();
    assert_eq!(
        p.spec.nccl_ib_hca(),
        "=mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"
    );
    assert_eq!(derive_ib_hca(&p.spec.rails[..2]), "=mlx5_0:1,mlx5_3:1");
    let parsed = parse_ib_hca(&p.spec.nccl_ib_hca()).unwrap();
    assert!(parsed.exact && !parsed.exclude);
    assert_eq!(parsed.entries.len(), 8);
    assert_eq!(parsed.entries[7].port, Some(1));
}

#[test]
fn ib_hca_parser_rejects_malformed_values() {
    for bad in [
        "",
        "=",
        "=mlx5_0:x",
        "mlx5_0,,mlx5_1",
        "=mlx5_0:0",
        "==mlx5_0",
        "mlx 5",
    ] {
        assert!(parse_ib_hca(bad).is_err(), "{bad:?} should be rejected");
    }
    let ex = parse_ib_hca("^=mlx5_4").unwrap();
    assert!(ex.exclude && ex.exact);
    assert_eq!(ex.entries[0].port, None);
}

fn invalid_fields(p: &FabricProfile) -> Vec<String> {
    match p.validate() {
        Ok(()) => vec![],
        Err(e) => {
            // The message names every field, so users see all problems at once.
            let msg = e.to_string();
            for f in e.fields() {
                assert!(msg.contains(f), "{msg} should name {f}");
            }
            e.fields().into_iter().map(String::from).collect()
        }
    }
}

#[test]
fn validation_names_each_broken_field() {
    let mut p = h100();
    p.spec.rails[1].hca = "mlx5_0".into(); // duplicate mlx5_0:1
    assert_eq!(invalid_fields(&p), vec!["spec.rails[1]"]);

    let mut p = h100();
    p.spec.rails[2].rate_gbps = 0;
    assert_eq!(invalid_fields(&p), vec!["spec.rails[2].rateGbps"]);

    let mut p = h100();
    p.spec.rails[3].gpus.clear(); // GPU 3 is served by nobody
    let err = p.validate().unwrap_err().to_string();
    assert!(err.contains("GPU 3 is served by no rail"), "{err}");

    let mut p = h100();
    p.spec.nccl.ib_hca = Some("=mlx5_0:one".into());
    assert_eq!(invalid_fields(&p), vec!["spec.nccl.ibHca"]);

    let mut p = h100();
    p.spec.shm_size = Some("-1Gi".into());
    assert_eq!(invalid_fields(&p), vec!["spec.shmSize"]);
    assert!(p.validate().unwrap_err().to_string().contains("negative"));

    let mut p = h100();
    p.spec.thresholds.busbw_plateau_gbps = -5.0;
    assert_eq!(invalid_fields(&p), vec!["spec.thresholds.busbwPlateauGBps"]);

    let mut p = h100();
    p.spec.certification.interval_seconds = p.spec.certification.ttl_seconds;
    assert_eq!(
        invalid_fields(&p),
        vec!["spec.certification.intervalSeconds"]
    );

    let mut p = h100();
    p.spec.rdma.as_mut().unwrap().resource_name = "rdma".into();
    assert_eq!(invalid_fields(&p), vec!["spec.rdma.resourceName"]);

    let mut p = h100();
    p.spec.rails.clear();
    assert_eq!(invalid_fields(&p), vec!["spec.rails"]);

    let mut p = h100();
    p.metadata.name = None;
    p.spec.rails[0].port = 0;
    assert_eq!(
        invalid_fields(&p),
        vec!["metadata.name", "spec.rails[0].port"]
    );
}

#[test]
fn nccl_delivery_defaults_to_env_and_plugin_fields_belong_to_plugin() {
    use railguard_api::profile::{NcclDelivery, OnUnhealthy};
    // Every existing profile reads as Env and writes back without the new fields.
    let p = h100();
    assert_eq!(p.spec.nccl.delivery, NcclDelivery::Env);
    assert!(!p.spec.nccl.enforce && !p.spec.nccl.consistent_rails);
    assert_eq!(p.spec.nccl.on_unhealthy, OnUnhealthy::Warn);
    let written = serde_json::to_value(&p.spec.nccl).unwrap();
    for field in ["delivery", "enforce", "onUnhealthy", "consistentRails"] {
        assert!(written.get(field).is_none(), "{field} in {written}");
    }

    let mut p = h100();
    p.spec.nccl = serde_json::from_value(serde_json::json!({
        "socketIfname": "=eth0", "delivery": "Plugin", "enforce": true,
        "onUnhealthy": "Fail", "consistentRails": true,
        "env": {"NCCL_IB_QPS_PER_CONNECTION": "2"}
    }))
    .unwrap();
    assert_eq!(invalid_fields(&p), Vec::<String>::new());
    assert_eq!(p.spec.nccl.delivery, NcclDelivery::Plugin);
    assert_eq!(p.spec.nccl.on_unhealthy, OnUnhealthy::Fail);

    // The plugin computes NCCL_IB_HCA and NCCL_IB_GID_INDEX itself.
    let mut q = p.clone();
    q.spec.nccl.ib_hca = Some("=mlx5_0:1".into());
    q.spec
        .nccl
        .env
        .insert("NCCL_IB_GID_INDEX".into(), "3".into());
    assert_eq!(
        invalid_fields(&q),
        vec!["spec.nccl.env.NCCL_IB_GID_INDEX", "spec.nccl.ibHca"]
    );

    // Under Env nothing reads the plugin's fields.
    let mut q = p.clone();
    q.spec.nccl.delivery = NcclDelivery::Env;
    assert_eq!(
        invalid_fields(&q),
        vec![
            "spec.nccl.enforce",
            "spec.nccl.onUnhealthy",
            "spec.nccl.consistentRails"
        ]
    );
    assert!(
        serde_json::from_value::<railguard_api::profile::NcclSettings>(
            serde_json::json!({"delivery": "plugin"})
        )
        .is_err()
    );
}

/// The bounds the CRD schema declares are the bounds `validate()` enforces, so a profile the
/// apiserver accepts is never one the webhook, extender or prober cannot read.
#[test]
fn validation_enforces_the_crd_schema_bounds() {
    let mut p = h100();
    p.spec.rails[0].port = 256;
    assert_eq!(invalid_fields(&p), vec!["spec.rails[0].port"]);

    let mut p = h100();
    p.spec.rails[1].rate_gbps = 3201;
    assert_eq!(invalid_fields(&p), vec!["spec.rails[1].rateGbps"]);

    let mut p = h100();
    p.spec.rails[0].gpus.push(256);
    let fields = invalid_fields(&p);
    assert!(
        fields.contains(&"spec.rails[0].gpus".to_string()),
        "{fields:?}"
    );

    let mut p = h100();
    p.spec.certification.history_depth = 0;
    assert_eq!(invalid_fields(&p), vec!["spec.certification.historyDepth"]);

    let mut p = h100();
    p.spec.certification.ttl_seconds = u64::MAX;
    assert_eq!(invalid_fields(&p), vec!["spec.certification.ttlSeconds"]);

    let mut p = h100();
    p.spec.certification.passive_heal_windows = railguard_api::profile::MAX_PASSIVE_HEAL_WINDOWS;
    assert!(p.validate().is_ok());
    p.spec.certification.passive_heal_windows += 1;
    assert_eq!(
        invalid_fields(&p),
        vec!["spec.certification.passiveHealWindows"]
    );

    use kube::CustomResourceExt;
    let schema = serde_json::to_value(railguard_api::FabricProfile::crd()).unwrap();
    let spec = &schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"];
    let rail = &spec["rails"]["items"]["properties"];
    assert_eq!(rail["port"]["minimum"], 1.0);
    assert_eq!(rail["port"]["maximum"], 255.0);
    assert_eq!(rail["rateGbps"]["maximum"], 3200.0);
    assert_eq!(
        spec["certification"]["properties"]["historyDepth"]["maximum"],
        f64::from(railguard_api::profile::MAX_HISTORY_DEPTH)
    );
    let heal = &spec["certification"]["properties"]["passiveHealWindows"];
    assert_eq!(
        heal["maximum"],
        f64::from(railguard_api::profile::MAX_PASSIVE_HEAL_WINDOWS)
    );
    assert_eq!(
        (heal["minimum"].clone(), heal["default"].clone()),
        (0.0.into(), 5.into())
    );
}

/// `certification.passiveHealWindows`: 5 when absent, 0 (never heal passively) allowed.
#[test]
fn passive_heal_windows_default_and_zero() {
    let p = h100();
    assert_eq!(p.spec.certification.passive_heal_windows, 5);
    let c: railguard_api::profile::CertificationSpec =
        serde_json::from_value(serde_json::json!({"passiveHealWindows": 0})).unwrap();
    assert_eq!(c.passive_heal_windows, 0);
    let mut p = h100();
    p.spec.certification.passive_heal_windows = 0;
    assert!(p.validate().is_ok());
}

/// The prober runs `ncclTests.binary` as root on every node of the profile: only plain
/// absolute paths and plain arguments get through, whatever the schema let by.
#[test]
fn the_fabric_class_is_a_traffic_class_byte_and_a_four_bit_service_level() {
    let mut p = h100();
    let rdma = p.spec.rdma.as_mut().unwrap();
    rdma.traffic_class = Some(255);
    rdma.service_level = Some(15);
    assert!(p.validate().is_ok());
    p.spec.rdma.as_mut().unwrap().service_level = Some(16);
    assert_eq!(invalid_fields(&p), vec!["spec.rdma.serviceLevel"]);
    let yaml =
        "trafficClass: 106\nserviceLevel: 3\nresourceName: rdma/x\ncountMode: SharedDevice\n";
    let r: railguard_api::profile::RdmaResource = serde_yaml_ng::from_str(yaml).unwrap();
    assert_eq!((r.traffic_class, r.service_level), (Some(106), Some(3)));
}

#[test]
fn one_rank_nccl_tests_arguments_are_refused_with_the_reason() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // nccl-tests defaults: one thread of one GPU; getopt_long's forms.
    use railguard_api::profile::{rank_request, RankRequest};
    assert_eq!(
        rank_request(&args(&["-b", "8M"])),
        Ok(RankRequest {
            threads: 1,
            gpus: None
        })
    );
    for (a, t, g) in [
        (vec!["-g", "8"], 1, 8),
        (vec!["-g8"], 1, 8),
        (vec!["--ngpus=4", "-t", "2"], 2, 4),
        (vec!["--ngpus", "2", "--nthreads=4"], 4, 2),
        (vec!["-g", "1", "-g", "8"], 1, 8),
    ] {
        let r = rank_request(&args(&a)).unwrap();
        assert_eq!((r.threads, r.gpus), (t, Some(g)), "{a:?}");
    }
    assert!(rank_request(&args(&["-g"])).is_err());
    assert!(rank_request(&args(&["-g", "x"])).is_err());
    assert!(rank_request(&args(&["-g", "0"])).is_err());

    let mut p = h100();
    let spec = &p.spec.certification.nccl_tests;
    assert!(
        !spec.args.iter().any(|a| a == "-g"),
        "the default names no GPU count"
    );
    let on_node = spec.args_for_node(8);
    assert_eq!(&on_node[on_node.len() - 2..], ["-g", "8"]);
    assert_eq!(spec.args_for_node(0).last().map(String::as_str), Some("1"));

    // The defect the old default had: one process, -g 1, one rank.
    p.spec.certification.nccl_tests.args = args(&["-b", "8M", "-e", "8G", "-g", "1"]);
    assert_eq!(
        invalid_fields(&p),
        vec!["spec.certification.ncclTests.args"]
    );
    let err = p.validate().unwrap_err().to_string();
    assert!(err.contains("one rank moves no byte"), "{err}");
    assert_eq!(
        p.spec.certification.nccl_tests.args_for_node(8),
        p.spec.certification.nccl_tests.args,
        "a profile's own -g is kept"
    );
    // Two threads of one GPU are two ranks: allowed.
    p.spec.certification.nccl_tests.args = args(&["-g", "1", "-t", "2"]);
    assert!(p.validate().is_ok());
}

#[test]
fn nccl_tests_binary_and_args_are_constrained() {
    for bad in [
        "all_reduce_perf",
        "/usr/local/bin/../../bin/sh",
        "/usr/local/bin/./x",
        "/usr//bin/x",
        "/tmp/x y",
        "/bin/sh;id",
        "",
    ] {
        let mut p = h100();
        p.spec.certification.nccl_tests.binary = bad.into();
        assert_eq!(
            invalid_fields(&p),
            vec!["spec.certification.ncclTests.binary"],
            "{bad:?}"
        );
    }
    for bad in ["-b 8", "$(id)", "a;b", "x|y", "", "`id`"] {
        let mut p = h100();
        p.spec.certification.nccl_tests.args.push(bad.into());
        let n = p.spec.certification.nccl_tests.args.len() - 1;
        assert_eq!(
            invalid_fields(&p),
            vec![format!("spec.certification.ncclTests.args[{n}]")],
            "{bad:?}"
        );
    }
    let mut p = h100();
    p.spec.certification.nccl_tests.args = vec!["-n".into(); 65];
    assert_eq!(
        invalid_fields(&p),
        vec!["spec.certification.ncclTests.args"]
    );

    let p = h100();
    let spec = &p.spec.certification.nccl_tests;
    assert!(spec.binary_is_allowed(&["/usr/local/bin/all_reduce_perf".to_string()]));
    assert!(!spec.binary_is_allowed(&["/opt/nccl-tests/build/all_reduce_perf".to_string()]));
    assert!(!spec.binary_is_allowed(&[]));
}

#[test]
fn profiles_yaml_errors_are_clear() {
    let err = profiles_from_yaml("apiVersion: railguard.io/v1alpha1\nkind: FabricProfile\nmetadata: {name: x}\nspec: {rails: 3}\n")
        .unwrap_err();
    assert!(matches!(err, ProfileError::Yaml { .. }), "{err}");
    let text = format!(
        "{}\n---\n{}",
        fixture("dgx-h100-ndr.yaml"),
        fixture("roce-cloud.yaml")
    );
    assert_eq!(profiles_from_yaml(&text).unwrap().len(), 2);
}

#[test]
fn signature_is_stable_and_sensitive() {
    let p = h100();
    let mut shuffled = p.clone();
    shuffled.spec.rails.reverse();
    assert_eq!(p.spec.signature(), shuffled.spec.signature());
    let mut slower = p.clone();
    slower.spec.rails[4].rate_gbps = 200;
    assert_ne!(p.spec.signature(), slower.spec.signature());
    assert!(p.spec.signature().len() <= 63);
}

/// A healthy NDR rail as an invasive run measures it, with a symbol-error count that did
/// not grow.
fn measured_ndr_rail(spec: &RailSpec) -> RailResult {
    let mut rail = RailResult::new(&spec.hca, spec.port, RailVerdict::Healthy);
    rail.link_layer = Some(spec.link_layer);
    rail.state = "ACTIVE".into();
    rail.rate_gbps = Some(400.0);
    rail.write_bw_host_gbps = Some(392.5);
    rail.write_bw_gpu_gbps = Some(388.0);
    rail.latency_us = Some(2.1);
    rail.counter_deltas = BTreeMap::from([("symbol_error".to_string(), 0)]);
    rail
}

fn certificate(now: Timestamp, verdict: Verdict, ttl_secs: i64) -> Certificate {
    let p = h100();
    Certificate {
        version: CERTIFICATE_VERSION,
        generation: 3,
        issued_at: now,
        expires_at: now + SignedDuration::from_secs(ttl_secs),
        profile: "h100-ndr".into(),
        signature: p.spec.signature(),
        node: Some("gpu-1".into()),
        verdict,
        usable_rails: None,
        reasons: vec![],
        rails: p.spec.rails.iter().map(measured_ndr_rail).collect(),
        gpus: vec![GpuAffinity {
            gpu: 0,
            pci_bus_id: None,
            preferred_hca: "mlx5_0".into(),
            port: Some(1),
            path: PathType::Pxb,
            numa: Some(0),
        }],
        nccl: Some(NcclResult {
            busbw_plateau_gbps: Some(371.2),
            wrong: 0,
            transport: Some(Transport::Ib),
            gdr: Some(true),
            ..Default::default()
        }),
        findings: vec![Finding {
            kind: FindingKind::PcieDowngrade,
            severity: Severity::Critical,
            subject: "GPU3".into(),
            message: "PCIe link at 16 GT/s x8, capable of 32 GT/s x16".into(),
            evidence: vec!["sys/bus/pci/devices/0000:9a:00.0/current_link_width = 8".into()],
        }],
        software: BTreeMap::from([("driver".to_string(), "550.54.15".to_string())]),
        passive_checked_at: None,
        history: vec![],
        simulated: false,
        renewal: None,
        extra: BTreeMap::new(),
    }
}

#[test]
fn certificate_round_trips_and_keeps_unknown_fields() {
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let c = certificate(now, Verdict::Certified, 3600);
    let text = c.to_annotation().unwrap();
    assert_eq!(Certificate::from_annotation(&text).unwrap(), c);
    // A newer writer adds a field: we keep it and still read the rest.
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["futureField"] = serde_json::json!({"x": 1});
    let parsed = Certificate::from_annotation(&v.to_string()).unwrap();
    assert_eq!(parsed.extra["futureField"]["x"], 1);
    assert!(parsed.to_annotation().unwrap().contains("futureField"));
    // JSON keys are camelCase, PathType is PIX/PXB..., verdicts lowercase.
    assert!(
        text.contains("\"issuedAt\"") && text.contains("\"PXB\"") && text.contains("\"certified\"")
    );
}

/// The one rule for reading an object's certificate: none without the annotation (or without
/// annotations), the parse result with it, junk an error and never a silent "none".
#[test]
fn the_certificate_of_annotations_is_absent_parsed_or_an_error() {
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let c = certificate(now, Verdict::Certified, 3600);
    assert!(Certificate::of_annotations(None).is_none());
    let mut annotations = BTreeMap::from([("other".to_string(), "x".to_string())]);
    assert!(Certificate::of_annotations(Some(&annotations)).is_none());
    annotations.insert(
        keys::ANNOTATION_CERTIFICATE.into(),
        c.to_annotation().unwrap(),
    );
    assert_eq!(
        Certificate::of_annotations(Some(&annotations))
            .unwrap()
            .unwrap(),
        c
    );
    annotations.insert(keys::ANNOTATION_CERTIFICATE.into(), "{not json".into());
    assert!(Certificate::of_annotations(Some(&annotations))
        .unwrap()
        .is_err());
}

/// Passive healing's state (issue #44): a certificate without it (every one written before)
/// parses with none; one with it round-trips; none written where none is held.
#[test]
fn passive_holds_are_optional_and_round_trip() {
    use railguard_api::certificate::{
        NodeBefore, NodePassiveHold, PassiveHold, RailBefore, PASSIVE_HOLD_KEY,
    };
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let old = certificate(now, Verdict::Certified, 3600);
    let text = old.to_annotation().unwrap();
    assert!(!text.contains("passiveHold"), "{text}");
    let parsed = Certificate::from_annotation(&text).unwrap();
    assert_eq!(parsed.passive_hold(), None);
    assert!(parsed.rails.iter().all(|r| r.passive_hold.is_none()));

    let mut held = old.clone();
    held.verdict = Verdict::Degraded;
    held.rails[0].verdict = RailVerdict::Failed;
    held.rails[0].faults = vec![RailFault::Errors];
    held.rails[0].passive_hold = Some(PassiveHold {
        clean_windows: 2,
        flaps: 1,
        before: RailBefore {
            verdict: RailVerdict::Healthy,
            reasons: vec![],
            faults: vec![],
        },
    });
    let node = NodePassiveHold {
        before: NodeBefore {
            verdict: Verdict::Certified,
            reasons: vec![],
        },
    };
    held.set_passive_hold(Some(&node));
    let v: serde_json::Value = serde_json::from_str(&held.to_annotation().unwrap()).unwrap();
    assert_eq!(
        v["rails"][0]["passiveHold"],
        serde_json::json!({"cleanWindows": 2, "flaps": 1, "before": {"verdict": "healthy"}})
    );
    assert_eq!(
        v[PASSIVE_HOLD_KEY],
        serde_json::json!({"before": {"verdict": "certified"}})
    );
    let back = Certificate::from_annotation(&v.to_string()).unwrap();
    assert_eq!(back, held);
    assert_eq!(back.passive_hold(), Some(node));
    held.set_passive_hold(None);
    assert_eq!(held.passive_hold(), None);
    assert!(!held.extra.contains_key(PASSIVE_HOLD_KEY));
    // An unreadable node hold is no hold (the node then keeps its verdict until an invasive
    // run), and the certificate still parses.
    let mut v = v;
    v[PASSIVE_HOLD_KEY] = serde_json::json!("garbage");
    assert_eq!(
        Certificate::from_annotation(&v.to_string())
            .unwrap()
            .passive_hold(),
        None
    );
}

#[test]
fn long_decimals_read_and_written_again_stay_the_same_number() {
    // More digits than an f64 holds (the fuzzer's find): parsed once, the value must print
    // and parse back to itself, so a prober re-publishing a certificate changes nothing.
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let mut v = serde_json::to_value(certificate(now, Verdict::Certified, 3600)).unwrap();
    v["rails"][0]["latencyUs"] = serde_json::from_str("2.18446744073709551616").unwrap();
    let once = Certificate::from_annotation(&v.to_string()).unwrap();
    let twice = Certificate::from_annotation(&once.to_annotation().unwrap()).unwrap();
    assert_eq!(once, twice);
    assert_eq!(once.rails[0].latency_us, Some(2.184_467_440_737_095_5));
}

#[test]
fn malformed_certificates_are_clear_errors() {
    let cases = [
        ("", "empty"),
        ("{\"version\":1,\"generation\":", "malformed"),
        ("{\"generation\":1}", "no numeric version"),
        ("{\"version\":7}", "version 7 is not supported"),
        ("{\"version\":1}", "malformed"),
        ("[1,2]", "no numeric version"),
    ];
    for (input, want) in cases {
        let err = Certificate::from_annotation(input).unwrap_err().to_string();
        assert!(err.contains(want), "{input:?}: {err}");
    }
    let huge = format!("{{\"version\":1,\"pad\":\"{}\"}}", "x".repeat(300 * 1024));
    assert!(matches!(
        Certificate::from_annotation(&huge),
        Err(CertificateError::TooLarge { .. })
    ));
}

fn node(labels: &[(&str, &str)], cert: Option<&str>) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some("gpu-1".into());
    n.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    if let Some(c) = cert {
        n.metadata.annotations = Some(BTreeMap::from([(
            keys::ANNOTATION_CERTIFICATE.to_string(),
            c.to_string(),
        )]));
    }
    n
}

#[test]
fn a_certificate_counts_only_on_the_node_it_names() {
    let issued = Timestamp::from_second(1_800_000_000).unwrap();
    let during = issued + SignedDuration::from_secs(60);
    let mut cert = certificate(issued, Verdict::Certified, 3600);
    let labels = [
        ("railguard.io/fabric", "certified"),
        ("railguard.io/profile", "h100-ndr"),
        ("railguard.io/signature", cert.signature.as_str()),
    ]
    .map(|(k, v)| (k, v.to_string()));
    let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let on = |c: &Certificate| {
        NodeFabric::from_node(&node(&labels, Some(&c.to_annotation().unwrap())), during).state
    };
    assert_eq!(on(&cert).kind(), "certified", "gpu-1's own");
    cert.node = Some("gpu-7".into());
    match on(&cert) {
        FabricState::Unreadable { reason } => assert_eq!(
            reason,
            "annotation railguard.io/certificate is the certificate of node gpu-7, not gpu-1"
        ),
        other => panic!("copied certificate accepted: {other}"),
    }
    cert.node = None;
    assert_eq!(
        on(&cert).kind(),
        "certified",
        "older certificates name no node"
    );
    cert.simulated = true;
    let back = Certificate::from_annotation(&cert.to_annotation().unwrap()).unwrap();
    assert!(back.simulated, "the simulated mark survives the annotation");
}

#[test]
fn node_fabric_states() {
    let issued = Timestamp::from_second(1_800_000_000).unwrap();
    let during = issued + SignedDuration::from_secs(60);
    let after = issued + SignedDuration::from_secs(3600 + 2 * 3600 + 600);
    let ok = certificate(issued, Verdict::Certified, 3600);
    let sig = ok.signature.clone();
    let ok_json = ok.to_annotation().unwrap();
    let certified = [
        ("railguard.io/fabric", "certified"),
        ("railguard.io/profile", "h100-ndr"),
        ("railguard.io/signature", sig.as_str()),
    ];

    let nf = NodeFabric::from_node(&node(&certified, Some(&ok_json)), during);
    assert_eq!(nf.state.kind(), "certified");
    assert_eq!(nf.profile.as_deref(), Some("h100-ndr"));
    assert_eq!(nf.signature.as_deref(), Some(sig.as_str()));

    let expired = NodeFabric::from_node(&node(&certified, Some(&ok_json)), after);
    match &expired.state {
        FabricState::Expired {
            expired_for_secs, ..
        } => assert_eq!(*expired_for_secs, 2 * 3600 + 600),
        other => panic!("expected expired, got {other:?}"),
    }
    assert_eq!(expired.state.to_string(), "certificate expired 2h10m ago");

    assert_eq!(
        NodeFabric::from_node(&node(&[], None), during).state,
        FabricState::Absent
    );

    let pending = NodeFabric::from_node(
        &node(&[("railguard.io/fabric", "pending")], Some(&ok_json)),
        during,
    );
    assert!(matches!(
        &pending.state,
        FabricState::Pending { previous: Some(_) }
    ));

    let mut failed = certificate(issued, Verdict::Failed, 3600);
    failed.reasons = vec!["rail mlx5_3:1 measured 196 Gb/s, profile h100-ndr needs 360".into()];
    let failed_json = failed.to_annotation().unwrap();
    let st = NodeFabric::from_node(
        &node(&[("railguard.io/fabric", "failed")], Some(&failed_json)),
        during,
    )
    .state;
    assert_eq!(st.kind(), "failed");
    assert!(st.to_string().contains("mlx5_3:1 measured 196"));

    let degraded = certificate(issued, Verdict::Degraded, 3600)
        .to_annotation()
        .unwrap();
    assert_eq!(
        NodeFabric::from_node(
            &node(&[("railguard.io/fabric", "degraded")], Some(&degraded)),
            during
        )
        .state
        .kind(),
        "degraded"
    );
}

#[test]
fn node_fabric_unreadable_cases_explain_themselves() {
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let ok = certificate(now, Verdict::Certified, 3600)
        .to_annotation()
        .unwrap();
    let cases: Vec<(Vec<(&str, &str)>, Option<&str>, &str)> = vec![
        (
            vec![("railguard.io/fabric", "great")],
            None,
            "is not certified, degraded, failed or pending",
        ),
        (
            vec![("railguard.io/fabric", "certified")],
            None,
            "has no certificate",
        ),
        (
            vec![("railguard.io/fabric", "certified")],
            Some("{not json"),
            "unreadable",
        ),
        (
            vec![("railguard.io/fabric", "failed")],
            Some(&ok),
            "disagrees with certificate verdict",
        ),
        (
            vec![
                ("railguard.io/fabric", "certified"),
                ("railguard.io/profile", "other"),
            ],
            Some(&ok),
            "railguard.io/profile=other disagrees",
        ),
    ];
    for (labels, cert, want) in cases {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match interpret(&labels, cert, now) {
            FabricState::Unreadable { reason } => {
                assert!(reason.contains(want), "{reason} should contain {want}")
            }
            other => panic!("expected unreadable for {labels:?}, got {other:?}"),
        }
    }
}

#[test]
fn human_durations() {
    assert_eq!(human_duration(45), "45s");
    assert_eq!(human_duration(7800), "2h10m");
    assert_eq!(human_duration(3 * 86400 + 4 * 3600), "3d4h");
    assert_eq!(human_duration(-90), "-1m30s");
}

#[test]
fn exemption_policy_by_name_and_selector() {
    let p = h100();
    let allowed = BTreeMap::from([("railguard.io/exemptions".to_string(), "allowed".to_string())]);
    assert!(p.spec.exemptions.allows("any", &allowed));
    assert!(!p.spec.exemptions.allows("any", &BTreeMap::new()));
    let roce = profiles_from_yaml(&fixture("roce-cloud.yaml"))
        .unwrap()
        .remove(0);
    assert!(roce.spec.exemptions.allows("research", &BTreeMap::new()));
    assert!(!roce.spec.exemptions.allows("prod", &allowed));
}

#[test]
fn committed_crd_yaml_is_current() {
    let path = format!(
        "{}/../charts/railguard/crds/fabricprofile.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let committed = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        committed,
        crd_yaml().unwrap(),
        "charts/railguard/crds/fabricprofile.yaml is stale: run `cargo run -p railguard-api --bin railguard-crdgen charts/railguard/crds/fabricprofile.yaml`"
    );
}
