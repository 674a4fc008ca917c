//! The 2-node NCCL test of a campaign: an MPI Operator `MPIJob` (kubeflow.org/v2beta1) that
//! runs nccl-tests' `all_reduce_perf` across one chosen pair, rendered from a configurable
//! template (`campaign/templates/mpijob-nccl-pair.yaml` by default), and the judgement of the
//! log it leaves with the same analysis as `railguard-prober analyze`.
//!
//! Placeholders are `{{name}}`. Values are inserted as YAML-safe literals (strings quoted,
//! lists as flow sequences), so a node or profile name can never change the manifest's
//! structure. Unknown placeholders and unused required ones are errors.

use std::collections::BTreeMap;

use railguard_api::FabricProfile;
use serde_json::{json, Value};

use super::CampaignError;

/// The template shipped with the prober (and the chart).
pub const DEFAULT_TEMPLATE: &str = include_str!("../templates/mpijob-nccl-pair.yaml");

/// What varies between two renders.
#[derive(Debug, Clone, PartialEq)]
pub struct PairJob {
    pub node_a: String,
    pub node_b: String,
    pub namespace: String,
    /// Container image holding Open MPI and nccl-tests.
    pub image: String,
    pub gpus_per_node: u32,
    pub deadline_seconds: u32,
}

/// Placeholders every template must use: without them the job would not be a 2-node test of
/// the chosen pair.
const REQUIRED: &[&str] = &["jobName", "pairNodes", "launcherCommand", "image"];

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_node_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A job name for a pair: stable, a DNS label, distinct for distinct pairs.
pub fn job_name(a: &str, b: &str) -> String {
    use sha2::{Digest, Sha256};
    let (x, y) = if a <= b { (a, b) } else { (b, a) };
    let digest = hex::encode(Sha256::digest(format!("{x}\n{y}").as_bytes()));
    format!("railguard-nccl-pair-{}", &digest[..10])
}

/// The `mpirun` command of the launcher.
pub fn launcher_command(profile: &FabricProfile, gpus_per_node: u32) -> Vec<String> {
    let spec = &profile.spec;
    let nt = &spec.certification.nccl_tests;
    let mut cmd: Vec<String> = ["mpirun", "--allow-run-as-root", "-np"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    cmd.push((2 * gpus_per_node).to_string());
    for s in ["-bind-to", "none", "-map-by", "slot"] {
        cmd.push(s.into());
    }
    let mut env: Vec<String> = vec![
        format!("NCCL_IB_HCA={}", profile.spec.nccl_ib_hca()),
        // Diagnostic job: the log is the evidence (transport, GDR, HCAs used).
        "NCCL_DEBUG=INFO".into(),
        "NCCL_DEBUG_SUBSYS=INIT,NET".into(),
    ];
    if let Some(ifname) = &spec.nccl.socket_ifname {
        env.push(format!("NCCL_SOCKET_IFNAME={ifname}"));
    }
    if let Some(cross) = spec.nccl.cross_nic {
        env.push(format!("NCCL_CROSS_NIC={cross}"));
    }
    if nt.force_ring {
        env.push("NCCL_ALGO=Ring".into());
    }
    for (k, v) in &spec.nccl.env {
        env.push(format!("{k}={v}"));
    }
    for e in env {
        cmd.push("-x".into());
        cmd.push(e);
    }
    cmd.push(nt.binary.clone());
    cmd.extend(nt.args.iter().cloned());
    cmd
}

/// Renders the template for `job` and checks the result is an MPIJob for exactly that pair.
pub fn render(
    template: &str,
    profile: &FabricProfile,
    job: &PairJob,
) -> Result<Value, CampaignError> {
    let bad = |reason: String| CampaignError::Template { reason };
    for n in [&job.node_a, &job.node_b] {
        if !is_node_name(n) {
            return Err(bad(format!("{n:?} is not a valid node name")));
        }
    }
    if job.node_a == job.node_b {
        return Err(bad(format!(
            "a pair needs two different nodes, got {} twice",
            job.node_a
        )));
    }
    if !is_dns_label(&job.namespace) {
        return Err(bad(format!("{:?} is not a valid namespace", job.namespace)));
    }
    if job.image.trim().is_empty() || job.image.chars().any(char::is_whitespace) {
        return Err(bad(format!(
            "{:?} is not a container image reference",
            job.image
        )));
    }
    if job.gpus_per_node == 0 {
        return Err(bad("gpus per node must be at least 1".into()));
    }
    let name = job_name(&job.node_a, &job.node_b);
    let q = |s: &str| Value::String(s.to_string()).to_string();
    let values: BTreeMap<&str, String> = BTreeMap::from([
        ("jobName", q(&name)),
        ("namespace", q(&job.namespace)),
        ("pairLabel", q(&name)),
        ("profile", q(profile.name())),
        ("image", q(&job.image)),
        ("gpusPerNode", job.gpus_per_node.to_string()),
        ("deadlineSeconds", job.deadline_seconds.to_string()),
        ("pairNodes", json!([job.node_a, job.node_b]).to_string()),
        (
            "launcherCommand",
            json!(launcher_command(profile, job.gpus_per_node)).to_string(),
        ),
    ]);
    let text = substitute(template, &values)?;
    let mut manifest: Value = serde_yaml_ng::from_str(&text)
        .map_err(|e| bad(format!("rendered template is not YAML: {e}")))?;
    add_rdma_resource(&mut manifest, profile, job.gpus_per_node);
    check(&manifest, job)?;
    Ok(manifest)
}

fn substitute(template: &str, values: &BTreeMap<&str, String>) -> Result<String, CampaignError> {
    let mut out = String::with_capacity(template.len() + 256);
    let mut used = std::collections::BTreeSet::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or_else(|| CampaignError::Template {
            reason: "unterminated {{ placeholder".into(),
        })?;
        let key = after[..end].trim();
        let value = values.get(key).ok_or_else(|| CampaignError::Template {
            reason: format!(
                "unknown placeholder {{{{{key}}}}} (known: {})",
                values.keys().copied().collect::<Vec<_>>().join(", ")
            ),
        })?;
        used.insert(key.to_string());
        out.push_str(value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    for r in REQUIRED {
        if !used.contains(*r) {
            return Err(CampaignError::Template {
                reason: format!("template does not use the required placeholder {{{{{r}}}}}"),
            });
        }
    }
    Ok(out)
}

fn add_rdma_resource(manifest: &mut Value, profile: &FabricProfile, gpus: u32) {
    let Some(rdma) = &profile.spec.rdma else {
        return;
    };
    let count = rdma.count(u64::from(gpus), profile.spec.rails.len());
    let containers = manifest
        .pointer_mut("/spec/mpiReplicaSpecs/Worker/template/spec/containers")
        .and_then(Value::as_array_mut);
    for c in containers.into_iter().flatten() {
        let limits = &mut c["resources"]["limits"];
        if !limits.is_object() {
            *limits = json!({});
        }
        limits[&rdma.resource_name] = json!(count.to_string());
    }
}

/// The rendered manifest must still be a 2-worker MPIJob pinned to the pair.
fn check(m: &Value, job: &PairJob) -> Result<(), CampaignError> {
    let bad = |reason: String| CampaignError::Template { reason };
    if m["apiVersion"] != "kubeflow.org/v2beta1" || m["kind"] != "MPIJob" {
        return Err(bad(format!(
            "rendered object is {}/{}, expected kubeflow.org/v2beta1/MPIJob",
            m["apiVersion"], m["kind"]
        )));
    }
    let worker = &m["spec"]["mpiReplicaSpecs"]["Worker"];
    if worker["replicas"] != 2 {
        return Err(bad(format!(
            "Worker replicas is {}, a pair needs 2",
            worker["replicas"]
        )));
    }
    if m["spec"]["mpiReplicaSpecs"]["Launcher"].is_null() {
        return Err(bad("no Launcher replica spec".into()));
    }
    let text = worker["template"]["spec"]["affinity"].to_string();
    for n in [&job.node_a, &job.node_b] {
        if !text.contains(&Value::String(n.clone()).to_string()) {
            return Err(bad(format!("Worker affinity does not pin node {n}")));
        }
    }
    Ok(())
}

/// The analysis of a collected 2-node log, as `railguard-prober analyze` would print it.
pub fn judge_log(
    texts: &[&str],
    profile: &FabricProfile,
) -> Result<railguard_prober::analyze::AnalyzeReport, CampaignError> {
    let obs = railguard_prober::nccl::NcclObservation::from_texts(texts.iter().copied()).map_err(
        |e| CampaignError::Template {
            reason: format!("cannot read the nccl-tests log: {e}"),
        },
    )?;
    Ok(railguard_prober::analyze::analyze(
        &obs,
        Some(&profile.spec),
    ))
}

/// Labels the MPI Operator (v2) puts on an MPIJob's pods.
pub const JOB_NAME_LABEL: &str = "training.kubeflow.org/job-name";
pub const JOB_ROLE_LABEL: &str = "training.kubeflow.org/job-role";

/// The label selector of a job's launcher pod.
pub fn launcher_selector(job_name: &str) -> String {
    format!("{JOB_NAME_LABEL}={job_name},{JOB_ROLE_LABEL}=launcher")
}

/// Where a launcher pod stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LauncherState {
    /// Not created yet, or not finished.
    Waiting,
    /// The launcher's container exited 0: its log holds the whole run.
    Succeeded,
    /// It failed; its log still holds what NCCL said before.
    Failed { reason: String },
}

/// The launcher among `pods` (the newest, if the operator retried) and its state.
pub fn launcher_state(
    pods: &[k8s_openapi::api::core::v1::Pod],
) -> Option<(&k8s_openapi::api::core::v1::Pod, LauncherState)> {
    let pod = pods
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(JOB_ROLE_LABEL))
                .is_some_and(|r| r == "launcher")
        })
        .max_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
    let status = pod.status.as_ref();
    let state = match status.and_then(|s| s.phase.as_deref()) {
        Some("Succeeded") => LauncherState::Succeeded,
        Some("Failed") => LauncherState::Failed {
            reason: status
                .and_then(|s| s.reason.clone().or_else(|| s.message.clone()))
                .unwrap_or_else(|| "the launcher pod failed".into()),
        },
        _ => LauncherState::Waiting,
    };
    Some((pod, state))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::path::Path;

    fn profile(file: &str) -> FabricProfile {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../api/fixtures/profiles")
            .join(file);
        railguard_api::profiles_from_yaml(&std::fs::read_to_string(path).unwrap())
            .unwrap()
            .remove(0)
    }

    fn job() -> PairJob {
        PairJob {
            node_a: "gpu-a".into(),
            node_b: "gpu-b".into(),
            namespace: "railguard".into(),
            image: "registry.example/nccl-tests:2.13".into(),
            gpus_per_node: 8,
            deadline_seconds: 900,
        }
    }

    #[test]
    fn default_template_renders_a_pinned_two_node_job() {
        let p = profile("dgx-h100-ndr.yaml");
        let m = render(DEFAULT_TEMPLATE, &p, &job()).unwrap();
        assert_eq!(m["kind"], "MPIJob");
        assert_eq!(m["metadata"]["name"], job_name("gpu-a", "gpu-b"));
        assert_eq!(m["spec"]["slotsPerWorker"], 8);
        let w = &m["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"];
        let values = &w["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchExpressions"][0]["values"];
        assert_eq!(values, &json!(["gpu-a", "gpu-b"]));
        assert_eq!(
            w["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            8
        );
        let cmd: Vec<String> = serde_json::from_value(
            m["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
                ["command"]
                .clone(),
        )
        .unwrap();
        assert_eq!(&cmd[..4], &["mpirun", "--allow-run-as-root", "-np", "16"]);
        let hca = format!("NCCL_IB_HCA={}", p.spec.nccl_ib_hca());
        assert!(
            hca.starts_with("NCCL_IB_HCA==mlx5_0:1,"),
            "exact-match form: {hca}"
        );
        assert!(cmd.contains(&hca));
        assert!(cmd.contains(&"NCCL_DEBUG=INFO".to_string()));
        assert!(!cmd.iter().any(|c| c.contains("NCCL_NET_GDR_LEVEL=SYS")));
        assert!(cmd.contains(&p.spec.certification.nccl_tests.binary));
        // The same pair in the other order is the same job.
        let m2 = render(
            DEFAULT_TEMPLATE,
            &p,
            &PairJob {
                node_a: "gpu-b".into(),
                node_b: "gpu-a".into(),
                ..job()
            },
        )
        .unwrap();
        assert_eq!(m2["metadata"]["name"], m["metadata"]["name"]);
    }

    #[test]
    fn rdma_resource_follows_the_count_mode() {
        let p = profile("roce-cloud.yaml");
        let m = render(DEFAULT_TEMPLATE, &p, &job()).unwrap();
        let limits = &m["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
            ["resources"]["limits"];
        assert_eq!(
            limits["nvidia.com/sriov_rdma"], "8",
            "PerGpu with 8 GPUs: {limits}"
        );
        let cmd = m["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
            ["command"]
            .to_string();
        assert!(cmd.contains("NCCL_SOCKET_IFNAME==eth0"), "{cmd}");
        assert!(cmd.contains("NCCL_IB_QPS_PER_CONNECTION=4"), "{cmd}");
    }

    #[test]
    fn names_cannot_inject_yaml() {
        let p = profile("dgx-h100-ndr.yaml");
        let evil = PairJob {
            node_a: "a\n  evil: true".into(),
            ..job()
        };
        assert!(render(DEFAULT_TEMPLATE, &p, &evil)
            .unwrap_err()
            .to_string()
            .contains("not a valid node name"));
        let same = PairJob {
            node_b: "gpu-a".into(),
            ..job()
        };
        assert!(render(DEFAULT_TEMPLATE, &p, &same)
            .unwrap_err()
            .to_string()
            .contains("two different nodes"));
        let ns = PairJob {
            namespace: "Bad_NS".into(),
            ..job()
        };
        assert!(render(DEFAULT_TEMPLATE, &p, &ns).is_err());
        let img = PairJob {
            image: "x y".into(),
            ..job()
        };
        assert!(render(DEFAULT_TEMPLATE, &p, &img).is_err());
    }

    #[test]
    fn collected_two_node_logs_are_judged_like_analyze() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../prober/fixtures");
        let read = |f: &str| std::fs::read_to_string(fixtures.join(f)).unwrap();
        let p = profile("dgx-h100-ndr.yaml");
        // A socket fallback between the two nodes always fails.
        let socket = read("nccl-debug/moc-h100-2x4-socket-fallback.txt");
        let r = judge_log(&[&socket], &p).unwrap();
        assert_eq!(
            r.verdict,
            railguard_prober::analyze::AnalyzeVerdict::Fail,
            "{:?}",
            r.reasons
        );
        assert_eq!(r.transport, Some("Socket"));
        // A cut-short or garbage log is an error or unknown, never a pass.
        let r = judge_log(&["nothing useful here"], &p).unwrap();
        assert_ne!(r.verdict, railguard_prober::analyze::AnalyzeVerdict::Pass);
    }

    #[test]
    fn the_newest_launcher_pod_and_its_state_are_found() {
        let pod =
            |name: &str, role: &str, phase: &str, at: &str| -> k8s_openapi::api::core::v1::Pod {
                serde_json::from_value(json!({
                    "metadata": {"name": name, "creationTimestamp": at, "labels": {
                        JOB_NAME_LABEL: "j", JOB_ROLE_LABEL: role}},
                    "status": {"phase": phase, "reason": "DeadlineExceeded"}
                }))
                .unwrap()
            };
        assert_eq!(
            launcher_selector("j"),
            "training.kubeflow.org/job-name=j,training.kubeflow.org/job-role=launcher"
        );
        assert!(launcher_state(&[pod("w", "worker", "Running", "2026-01-01T00:00:00Z")]).is_none());
        let pods = [
            pod("old", "launcher", "Failed", "2026-01-01T00:00:00Z"),
            pod("new", "launcher", "Running", "2026-01-01T00:01:00Z"),
        ];
        let (p, state) = launcher_state(&pods).unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("new"));
        assert_eq!(state, LauncherState::Waiting);
        let (_, state) = launcher_state(&pods[..1]).unwrap();
        assert_eq!(
            state,
            LauncherState::Failed {
                reason: "DeadlineExceeded".into()
            }
        );
        let done = [pod("l", "launcher", "Succeeded", "2026-01-01T00:00:00Z")];
        assert_eq!(launcher_state(&done).unwrap().1, LauncherState::Succeeded);
    }

    #[test]
    fn bad_templates_are_explained() {
        let p = profile("dgx-h100-ndr.yaml");
        let e = render("{{nope}}", &p, &job()).unwrap_err().to_string();
        assert!(e.contains("unknown placeholder {{nope}}"), "{e}");
        let e = render("kind: MPIJob\nname: {{jobName}}", &p, &job())
            .unwrap_err()
            .to_string();
        assert!(e.contains("required placeholder"), "{e}");
        let e = render("{{jobName", &p, &job()).unwrap_err().to_string();
        assert!(e.contains("unterminated"), "{e}");
        let one_worker = DEFAULT_TEMPLATE.replace("replicas: 2", "replicas: 1");
        let e = render(&one_worker, &p, &job()).unwrap_err().to_string();
        assert!(e.contains("a pair needs 2"), "{e}");
        let unpinned = DEFAULT_TEMPLATE.replace(
            "values: {{pairNodes}}",
            "values: [\"x\"]\n                    # {{pairNodes}}",
        );
        let e = render(&unpinned, &p, &job()).unwrap_err().to_string();
        assert!(e.contains("does not pin node gpu-a"), "{e}");
    }
}
