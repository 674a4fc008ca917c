//! The chart's DRA objects (issue #32), rendered by the real Helm: for a server serving
//! `resource.k8s.io/v1` DeviceTaintRule (Kubernetes 1.37), each profile the chart renders
//! gets the DeviceClasses `railguard-<profile>-nic` / `-gpu` and the ResourceClaimTemplates
//! `railguard-<profile>-<n>-rails` (n GPU+NIC pairs, each pair under one PCIe root), with the
//! names `railguard_api::dra` gives (a drift between the two fails here); for a 1.20 server,
//! a server without DeviceTaintRule, or `dra.enabled=false`, none of it, and the fleet
//! controller's ClusterRole gets the DRA rules only with `dra.deviceTaints` (off by default) where DRA is served. The last test
//! dry-runs the DRA objects against the real kube-apiserver of the pass (1.37 under
//! `RAILGUARD_KUBE_VERSION=1.37`; on 1.20 it checks that the server's own Capabilities
//! render nothing DRA). helm and kubectl come from `tests/scripts/helm.sh`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use std::collections::{BTreeMap, BTreeSet};

use railguard_api::dra::{self, claim_template_name, device_class_name, DeviceKind, DraSpec};
use railguard_tests::chart_values::{ValuesSet, ALL_PROFILES, DEFAULT, ROCE};
use railguard_tests::helm::{self, kube_1_20_api_versions, KUBE_1_20_VERSION};
use railguard_tests::{labels, ControlPlane, KubeVersion};
use serde_json::{json, Value as Json};

/// The version `--kube-version` names for a 1.37 server.
const KUBE_1_37: &str = "v1.37.2";

/// What a 1.37 server adds to Helm's built-in list for the chart's DRA gate.
fn dra_api_versions() -> Vec<String> {
    railguard_tests::dra::chart_api_versions()
}

/// `helm template` of `set` with `extra` values merged over its own, for a server serving
/// `api_versions` at `kube_version`.
fn render_extra(
    set: &ValuesSet,
    extra: &str,
    api_versions: &[String],
    kube_version: &str,
) -> anyhow::Result<Vec<Json>> {
    let out = helm::shared().template_values_output(
        set.release,
        set.namespace,
        &[set.values, extra],
        api_versions,
        kube_version,
    )?;
    Ok(helm::documents_of(out, set.label)?
        .into_iter()
        .map(|d| d.obj)
        .collect())
}

fn render_1_37(set: &ValuesSet, extra: &str) -> Vec<Json> {
    render_extra(set, extra, &dra_api_versions(), KUBE_1_37)
        .unwrap_or_else(|e| panic!("{}: {e:#}", set.label))
}

fn kind<'a>(docs: &'a [Json], kind: &str) -> Vec<&'a Json> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn name(d: &Json) -> &str {
    d["metadata"]["name"].as_str().unwrap_or_default()
}

fn is_dra(d: &Json) -> bool {
    d["apiVersion"]
        .as_str()
        .is_some_and(|v| v.starts_with("resource.k8s.io/"))
}

/// The profiles `set` has the chart render (enabled), with their `spec.dra` values.
/// The enabled profiles of the values: name → (spec.dra, spec.rails).
fn enabled_profiles(set: &ValuesSet, extra: &str) -> BTreeMap<String, (Json, Json)> {
    let mut values = set.values().unwrap();
    let over: Json = serde_yaml_ng::from_str(extra).unwrap();
    railguard_tests::merge_json(&mut values, over);
    values["fabricProfiles"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, p)| p["enabled"] == true)
        .map(|(n, p)| {
            (
                n.clone(),
                (p["spec"]["dra"].clone(), p["spec"]["rails"].clone()),
            )
        })
        .collect()
}

fn fleet_role(docs: &[Json]) -> &Json {
    kind(docs, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["labels"]["app.kubernetes.io/component"] == "fleet")
        .expect("the fleet ClusterRole")
}

fn resource_rules(role: &Json) -> Vec<&Json> {
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["apiGroups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g == "resource.k8s.io")
        })
        .collect()
}

fn strs(v: &Json) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Checks one ResourceClaimTemplate. Whole node (every rail of a one-GPU-per-rail profile):
/// two requests of `n` devices, the profile's GPU and NIC classes, no constraint (every GPU
/// has its own rail's NIC). Otherwise `n` GPU and `n` NIC requests of one device each and one
/// pcieRoot constraint per pair (GPU i with NIC i), nothing else.
fn check_template(t: &Json, profile: &str, n: u32, whole_node: bool) {
    let what = format!("{}/{}", t["metadata"]["namespace"], name(t));
    let devices = &t["spec"]["spec"]["devices"];
    if whole_node {
        let requests = devices["requests"].as_array().unwrap();
        let got: Vec<(String, String, u64)> = requests
            .iter()
            .map(|r| {
                assert_eq!(r["exactly"]["allocationMode"], "ExactCount", "{what}: {r}");
                (
                    r["name"].as_str().unwrap().to_string(),
                    r["exactly"]["deviceClassName"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                    r["exactly"]["count"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "gpus".into(),
                    device_class_name(profile, DeviceKind::Gpu),
                    u64::from(n)
                ),
                (
                    "nics".into(),
                    device_class_name(profile, DeviceKind::Nic),
                    u64::from(n)
                ),
            ],
            "{what}: the whole node in two counted requests"
        );
        assert!(devices["constraints"].is_null(), "{what}: no constraint");
        return;
    }
    let requests = devices["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 2 * n as usize, "{what}: requests");
    let gpu_class = device_class_name(profile, DeviceKind::Gpu);
    let nic_class = device_class_name(profile, DeviceKind::Nic);
    let mut by_name = BTreeMap::new();
    for r in requests {
        let exactly = &r["exactly"];
        assert_eq!(exactly["count"], 1, "{what}: {r}");
        assert_eq!(exactly["allocationMode"], "ExactCount", "{what}: {r}");
        by_name.insert(
            r["name"].as_str().unwrap().to_string(),
            exactly["deviceClassName"].as_str().unwrap().to_string(),
        );
    }
    for i in 0..n {
        assert_eq!(by_name[&format!("gpu-{i}")], gpu_class, "{what}");
        assert_eq!(by_name[&format!("nic-{i}")], nic_class, "{what}");
    }
    let constraints = devices["constraints"].as_array().unwrap();
    let pairs: Vec<(Vec<String>, String)> = constraints
        .iter()
        .map(|c| {
            (
                strs(&c["requests"]),
                c["matchAttribute"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(Vec<String>, String)> = (0..n)
        .map(|i| {
            (
                vec![format!("gpu-{i}"), format!("nic-{i}")],
                dra::attr::PCIE_ROOT.to_string(),
            )
        })
        .collect();
    // Exactly one per pair: none spans all the requests (that would put every device on
    // one root).
    assert_eq!(pairs, want, "{what}: one pcieRoot constraint per pair");
}

/// Every DRA object of `docs` for the profiles of `set` (+ `extra`): the classes and the
/// templates by the names `railguard_api::dra` gives, in `namespaces`, labelled, and nothing
/// else of resource.k8s.io.
fn check_dra_objects(docs: &[Json], set: &ValuesSet, extra: &str, namespaces: &[&str]) {
    let profiles = enabled_profiles(set, extra);
    assert!(!profiles.is_empty(), "{}", set.label);
    let mut want_classes = BTreeSet::new();
    let mut want_templates = BTreeSet::new();
    for (profile, (spec, rails)) in &profiles {
        let rails = rails.as_array().unwrap();
        // Every rail of a one-GPU-per-rail profile: the whole-node form.
        let whole_node = |n: u32| {
            n as usize == rails.len()
                && rails
                    .iter()
                    .all(|r| r["gpus"].as_array().is_some_and(|g| g.len() == 1))
        };
        let spec: DraSpec = if spec.is_null() {
            DraSpec::default()
        } else {
            serde_json::from_value(spec.clone()).unwrap()
        };
        for (kind, driver) in [
            (DeviceKind::Nic, &spec.nic_driver),
            (DeviceKind::Gpu, &spec.gpu_driver),
        ] {
            if !driver.is_empty() {
                want_classes.insert(device_class_name(profile, kind));
            }
        }
        if spec.nic_driver.is_empty() || spec.gpu_driver.is_empty() {
            continue;
        }
        for &n in &spec.claim_rails {
            for ns in namespaces {
                want_templates.insert((ns.to_string(), claim_template_name(profile, n)));
            }
            let t = docs
                .iter()
                .find(|d| {
                    d["kind"] == "ResourceClaimTemplate"
                        && name(d) == claim_template_name(profile, n)
                })
                .unwrap_or_else(|| panic!("{}: no {}", set.label, claim_template_name(profile, n)));
            check_template(t, profile, n, whole_node(n));
        }
    }
    let classes: BTreeSet<String> = kind(docs, "DeviceClass")
        .iter()
        .map(|d| name(d).to_string())
        .collect();
    assert_eq!(classes, want_classes, "{}: DeviceClasses", set.label);
    let templates: BTreeSet<(String, String)> = kind(docs, "ResourceClaimTemplate")
        .iter()
        .map(|d| {
            (
                d["metadata"]["namespace"].as_str().unwrap().to_string(),
                name(d).to_string(),
            )
        })
        .collect();
    assert_eq!(
        templates, want_templates,
        "{}: ResourceClaimTemplates",
        set.label
    );
    assert_eq!(
        docs.iter().filter(|d| is_dra(d)).count(),
        want_classes.len() + want_templates.len(),
        "{}: nothing else of resource.k8s.io",
        set.label
    );
    for d in docs.iter().filter(|d| is_dra(d)) {
        assert_eq!(d["apiVersion"], dra::API_VERSION, "{}", name(d));
        let l = &d["metadata"]["labels"];
        let profile = l["railguard.io/profile"].as_str().unwrap();
        assert!(profiles.contains_key(profile), "{}: {l}", name(d));
        assert!(
            name(d).starts_with(&format!("railguard-{profile}-")),
            "{}",
            name(d)
        );
        assert_eq!(l["app.kubernetes.io/instance"], set.release, "{}", name(d));
        assert_eq!(l["app.kubernetes.io/name"], "railguard", "{}", name(d));
        assert_eq!(l["app.kubernetes.io/component"], "dra", "{}", name(d));
        assert_eq!(l["app.kubernetes.io/managed-by"], "Helm", "{}", name(d));
        assert!(l["helm.sh/chart"].is_string(), "{}", name(d));
    }
}

#[test]
fn a_1_37_server_gets_the_profiles_classes_and_aligned_claim_templates() {
    for set in [&DEFAULT, &ALL_PROFILES, &ROCE] {
        let docs = render_1_37(set, "{}");
        check_dra_objects(&docs, set, "{}", &[set.namespace]);
        // The shipped profiles take the CRD's defaults: dranet and NVIDIA's driver, 8/4/2/1.
        let defaults = DraSpec::default();
        for (profile, (_, rails)) in enabled_profiles(set, "{}") {
            let profile = &profile;
            // Only the profile's rail HCAs, each once, in the profile's order.
            let mut hcas: Vec<String> = Vec::new();
            for r in rails.as_array().unwrap() {
                let h = format!("'{}'", r["hca"].as_str().unwrap());
                if !hcas.contains(&h) {
                    hcas.push(h);
                }
            }
            let class = |k| {
                let n = device_class_name(profile, k);
                kind(&docs, "DeviceClass")
                    .into_iter()
                    .find(|d| name(d) == n)
                    .unwrap_or_else(|| panic!("{}: no {n}", set.label))
                    .clone()
            };
            let nic = class(DeviceKind::Nic);
            let gpu = class(DeviceKind::Gpu);
            assert_eq!(
                nic["spec"]["selectors"],
                json!([{"cel": {"expression": format!(
                    "device.driver == '{d}' && device.attributes['{d}'].?rdma.orValue(false) == true && device.attributes['{d}'].?rdmaDevice.orValue('') in [{}]",
                    hcas.join(", "),
                    d = defaults.nic_driver
                )}}])
            );
            assert_eq!(
                gpu["spec"]["selectors"],
                json!([{"cel": {"expression": format!(
                    "device.driver == '{d}' && device.attributes['{d}'].?type.orValue('') == 'gpu'",
                    d = defaults.gpu_driver
                )}}])
            );
            // Opt-in only.
            assert!(gpu["spec"].get("extendedResourceName").is_none());
            for n in &defaults.claim_rails {
                assert!(
                    kind(&docs, "ResourceClaimTemplate")
                        .iter()
                        .any(|t| name(t) == claim_template_name(profile, *n)),
                    "{}: {profile} {n}",
                    set.label
                );
            }
        }
    }
}

#[test]
fn the_chart_names_are_api_dras_and_follow_the_profile_settings() {
    // Custom rail counts, drivers and namespaces: the names still come out as the Rust
    // functions give them, from the profile's own values.
    let extra = r#"
fabricProfiles:
  a100-hdr: {enabled: false}
  h100-ndr:
    spec:
      dra: {claimRails: [3, 16, 1], nicDriver: nic.example.com, gpuDriver: gpu.example.com}
  roce-cloud:
    enabled: true
    spec:
      dra: {nicDriver: ""}
dra:
  claimTemplateNamespaces: [team-a, team-b]
"#;
    let docs = render_1_37(&DEFAULT, extra);
    check_dra_objects(&docs, &DEFAULT, extra, &["team-a", "team-b"]);
    let names: BTreeSet<&str> = docs.iter().filter(|d| is_dra(d)).map(name).collect();
    let mut want: BTreeSet<String> = [3, 16, 1]
        .iter()
        .map(|&n| claim_template_name("h100-ndr", n))
        .collect();
    want.insert(device_class_name("h100-ndr", DeviceKind::Nic));
    want.insert(device_class_name("h100-ndr", DeviceKind::Gpu));
    // roce-cloud without a NIC driver: its GPU class only, no (unalignable) templates.
    want.insert(device_class_name("roce-cloud", DeviceKind::Gpu));
    assert_eq!(
        names,
        want.iter().map(String::as_str).collect::<BTreeSet<_>>()
    );
    let nic = kind(&docs, "DeviceClass")
        .into_iter()
        .find(|d| name(d) == "railguard-h100-ndr-nic")
        .unwrap();
    assert_eq!(
        nic["spec"]["selectors"][0]["cel"]["expression"],
        "device.driver == 'nic.example.com' && device.attributes['nic.example.com'].?rdma.orValue(false) == true && device.attributes['nic.example.com'].?rdmaDevice.orValue('') in ['mlx5_0', 'mlx5_3', 'mlx5_4', 'mlx5_5', 'mlx5_6', 'mlx5_9', 'mlx5_10', 'mlx5_11']"
    );
    // The literal names, in case both sides drift together.
    assert_eq!(
        claim_template_name("h100-ndr", 8),
        "railguard-h100-ndr-8-rails"
    );
    assert_eq!(
        device_class_name("h100-ndr", DeviceKind::Nic),
        "railguard-h100-ndr-nic"
    );
    assert_eq!(
        device_class_name("h100-ndr", DeviceKind::Gpu),
        "railguard-h100-ndr-gpu"
    );

    // A claim holds at most 32 requests: 17 rails is refused by the values schema.
    for bad in ["[17]", "[0]"] {
        let extra =
            format!("fabricProfiles:\n  h100-ndr:\n    spec:\n      dra: {{claimRails: {bad}}}\n");
        let out = helm::shared()
            .template_values_output(
                DEFAULT.release,
                DEFAULT.namespace,
                &[DEFAULT.values, &extra],
                &dra_api_versions(),
                KUBE_1_37,
            )
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("claimRails"),
            "{bad}: {stderr}"
        );
    }
}

#[test]
fn the_gpu_extended_resource_name_is_opt_in_and_on_one_class() {
    let extra = "dra:\n  gpuExtendedResourceName: nvidia.com/gpu\n";
    let docs = render_1_37(&ALL_PROFILES, extra);
    let with: Vec<&str> = kind(&docs, "DeviceClass")
        .into_iter()
        .filter(|d| d["spec"]["extendedResourceName"] == "nvidia.com/gpu")
        .map(name)
        .collect();
    // The default profile's GPU class: unique among the cluster's classes.
    assert_eq!(with, ["railguard-h100-ndr-gpu"]);
    // Without a default profile: the first by name.
    let extra2 = "fabricProfiles:\n  h100-ndr: {enabled: false}\ndra:\n  gpuExtendedResourceName: nvidia.com/gpu\n";
    let docs = render_1_37(&ALL_PROFILES, extra2);
    let with: Vec<&str> = kind(&docs, "DeviceClass")
        .into_iter()
        .filter(|d| d["spec"].get("extendedResourceName").is_some())
        .map(name)
        .collect();
    assert_eq!(with, ["railguard-a100-hdr-gpu"]);
    // Not a resource name: refused by the values schema.
    let out = helm::shared()
        .template_values_output(
            DEFAULT.release,
            DEFAULT.namespace,
            &["dra:\n  gpuExtendedResourceName: gpu\n"],
            &dra_api_versions(),
            KUBE_1_37,
        )
        .unwrap();
    assert!(!out.status.success(), "a bare name is no extended resource");
}

#[test]
fn nothing_dra_renders_without_device_taint_rules_or_when_disabled() {
    let cases: Vec<(&str, Vec<String>, &str, &str)> = vec![
        ("1.20", kube_1_20_api_versions(), KUBE_1_20_VERSION, "{}"),
        // A 1.34-1.36 server: DRA v1, but no DeviceTaintRule to keep claims off failed rails.
        (
            "DRA without DeviceTaintRule",
            [
                "resource.k8s.io/v1",
                "resource.k8s.io/v1/DeviceClass",
                "resource.k8s.io/v1/ResourceClaimTemplate",
                "resource.k8s.io/v1/ResourceSlice",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            "v1.36.1",
            "{}",
        ),
        // helm template without --api-versions: group/versions only, never a kind.
        ("no --api-versions", Vec::new(), KUBE_1_37, "{}"),
        (
            "dra.enabled=false",
            dra_api_versions(),
            KUBE_1_37,
            "dra:\n  enabled: false\n",
        ),
    ];
    for (label, api_versions, kube_version, extra) in cases {
        for set in [&DEFAULT, &ALL_PROFILES, &ROCE] {
            let docs = render_extra(set, extra, &api_versions, kube_version)
                .unwrap_or_else(|e| panic!("{label} {}: {e:#}", set.label));
            for k in ["DeviceClass", "ResourceClaimTemplate", "DeviceTaintRule"] {
                assert!(kind(&docs, k).is_empty(), "{label} {}: {k}", set.label);
            }
            assert!(
                !docs.iter().any(is_dra),
                "{label} {}: resource.k8s.io",
                set.label
            );
            // Device taints are off by default: no DRA permission anywhere.
            let role = fleet_role(&docs);
            assert!(
                resource_rules(role).is_empty(),
                "{label} {}: {role}",
                set.label
            );
        }
    }
}

/// The value of `var` in the fleet controller's container.
fn fleet_env(docs: &[Json], var: &str) -> Option<String> {
    let deployment = kind(docs, "Deployment")
        .into_iter()
        .find(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "fleet")
        .expect("the fleet Deployment");
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == var)
        .map(|e| e["value"].as_str().unwrap().to_string())
}

/// Day one changes nothing: DeviceTaintRules taint a device for every claim, so the fleet
/// controller keeps them only with `dra.deviceTaints` (off by default) on a server that serves
/// them; its RBAC for ResourceSlices and DeviceTaintRules is rendered only then, and the
/// binary's default (`--dra-taints`) is the chart's.
#[test]
fn device_taint_rules_are_opt_in_and_so_is_their_rbac() {
    let on = "dra:\n  deviceTaints: true\n";
    let cases: [(&str, Vec<String>, &str, &str, bool); 4] = [
        ("1.37, defaults", dra_api_versions(), KUBE_1_37, "{}", false),
        (
            "1.37, deviceTaints",
            dra_api_versions(),
            KUBE_1_37,
            on,
            true,
        ),
        (
            "1.37, deviceTaints, dra.enabled=false",
            dra_api_versions(),
            KUBE_1_37,
            "dra:\n  deviceTaints: true\n  enabled: false\n",
            true,
        ),
        (
            "1.20, deviceTaints",
            kube_1_20_api_versions(),
            KUBE_1_20_VERSION,
            on,
            false,
        ),
    ];
    for (label, api_versions, kube_version, extra, taints) in cases {
        for set in [&DEFAULT, &ALL_PROFILES, &ROCE] {
            let docs = render_extra(set, extra, &api_versions, kube_version)
                .unwrap_or_else(|e| panic!("{label} {}: {e:#}", set.label));
            let rules = resource_rules(fleet_role(&docs));
            let want = if taints { 2 } else { 0 };
            assert_eq!(rules.len(), want, "{label} {}: {rules:?}", set.label);
            if taints {
                // It reads slices and keeps its DeviceTaintRules.
                let rules: BTreeMap<Vec<String>, BTreeSet<String>> = rules
                    .iter()
                    .map(|r| {
                        (
                            strs(&r["resources"]),
                            strs(&r["verbs"]).into_iter().collect(),
                        )
                    })
                    .collect();
                let set_of = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
                assert_eq!(
                    rules,
                    BTreeMap::from([
                        (
                            vec!["resourceslices".to_string()],
                            set_of(&["get", "list", "watch"])
                        ),
                        (
                            vec!["devicetaintrules".to_string()],
                            set_of(&[
                                "get", "list", "watch", "create", "update", "patch", "delete"
                            ])
                        ),
                    ]),
                    "{label} {}",
                    set.label
                );
            }
            assert_eq!(
                fleet_env(&docs, "RAILGUARD_DRA_TAINTS").as_deref(),
                Some(if taints { "true" } else { "false" }),
                "{label} {}",
                set.label
            );
        }
    }
    // The binary's default is the chart's.
    let chart_default = DEFAULT.values().unwrap()["dra"]["deviceTaints"].clone();
    assert_eq!(chart_default, json!(false));
    let cli = <railguard_prober_cli::Cli as clap::CommandFactory>::command();
    let flag = cli
        .find_subcommand("fleet")
        .unwrap()
        .get_arguments()
        .find(|a| a.get_long() == Some("dra-taints"))
        .expect("fleet --dra-taints");
    assert_eq!(
        flag.get_default_values(),
        [std::ffi::OsStr::new("false")],
        "--dra-taints defaults to the chart's dra.deviceTaints"
    );
}

#[test]
fn the_fleet_controller_gets_its_lease_and_pod_identity_everywhere() {
    for (api_versions, kube_version) in [
        (kube_1_20_api_versions(), KUBE_1_20_VERSION),
        (dra_api_versions(), KUBE_1_37),
    ] {
        let docs = render_extra(&DEFAULT, "{}", &api_versions, kube_version).unwrap();
        let role = kind(&docs, "Role")
            .into_iter()
            .find(|r| name(r) == "railguard-fleet-leader-election")
            .expect("the fleet's lease Role");
        assert_eq!(role["metadata"]["namespace"], DEFAULT.namespace);
        assert_eq!(
            role["rules"],
            json!([
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                 "resourceNames": ["railguard-fleet"], "verbs": ["get", "update"]},
            ])
        );
        let binding = kind(&docs, "RoleBinding")
            .into_iter()
            .find(|r| name(r) == "railguard-fleet-leader-election")
            .expect("its binding");
        assert_eq!(
            binding["roleRef"]["name"],
            "railguard-fleet-leader-election"
        );
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "railguard-fleet", "namespace": "railguard"}])
        );
        let deployment = kind(&docs, "Deployment")
            .into_iter()
            .find(|d| name(d) == "railguard-fleet")
            .unwrap();
        let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
        let field = |var: &str| {
            env.as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == var)
                .map(|e| e["valueFrom"]["fieldRef"]["fieldPath"].clone())
        };
        assert_eq!(field("POD_NAMESPACE"), Some(json!("metadata.namespace")));
        assert_eq!(field("POD_NAME"), Some(json!("metadata.name")));
    }
}

/// The DRA objects (and the fleet ClusterRole with its DRA rules) pass the real API
/// server's validation (`kubectl apply --dry-run=server --validate=strict`: field names,
/// the CEL selectors compiled, request and constraint limits), rendered for the server's own
/// Capabilities as `helm install` would; on 1.20 those Capabilities render none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dra_objects_pass_the_servers_dry_run() {
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client();
    let api_versions = railguard_tests::chart_values::server_api_versions(&client)
        .await
        .expect("discovery");
    let kube_version = client.apiserver_version().await.unwrap().git_version;
    let extra = r#"
fabricProfiles:
  roce-cloud: {enabled: true}
  h100-ndr:
    spec:
      dra: {claimRails: [16, 8, 4, 2, 1]}
dra:
  gpuExtendedResourceName: nvidia.com/gpu
  claimTemplateNamespaces: [railguard, team-a]
"#;
    let docs = render_extra(&DEFAULT, extra, &api_versions, &kube_version).unwrap();
    match cp.kube_version() {
        KubeVersion::V1_20 => {
            assert!(!docs.iter().any(is_dra), "1.20 renders nothing DRA");
            assert!(resource_rules(fleet_role(&docs)).is_empty());
            return;
        }
        KubeVersion::V1_37 => {
            assert!(
                api_versions.contains(&"resource.k8s.io/v1/DeviceTaintRule".to_string()),
                "1.37 serves DeviceTaintRule"
            );
        }
    }
    check_dra_objects(&docs, &DEFAULT, extra, &["railguard", "team-a"]);
    for ns in ["railguard", "team-a"] {
        cp.create_namespace(ns, &labels(&[]))
            .await
            .expect("namespace");
    }
    let objects: Vec<&Json> = docs
        .iter()
        .filter(|d| is_dra(d) || (d["kind"] == "ClusterRole" && name(d) == "railguard-fleet"))
        .collect();
    assert!(objects.len() > 20, "{} objects", objects.len());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dra.yaml");
    let text: String = objects
        .iter()
        .map(|d| format!("---\n{}", serde_yaml_ng::to_string(d).unwrap()))
        .collect();
    std::fs::write(&file, &text).unwrap();
    let out = helm::shared()
        .kubectl_dry_run(cp.kubeconfig_path(), &file)
        .unwrap();
    helm::assert_server_dry_run(&out, objects.len(), "");
}
