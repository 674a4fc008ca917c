//! Rules of `mutate()`, on pods shaped like those the training operators create.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, ResourceRequirements, SecurityContext};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use railguard_api::profile::{AdmissionMode, Enforcement, RdmaCountMode};
use railguard_api::FabricProfile;
use serde_json::{json, Value};

use super::fixtures::{pod, pod_of, profile, A100, H100, ROCE};
use super::gates::rail_layout;
use super::*;
use crate::patch::PatchOp;

fn profiles() -> Vec<FabricProfile> {
    // Sorted by name, as the catalog hands them over.
    vec![profile(A100), profile(H100), profile(ROCE)]
}

fn cfg() -> WebhookConfig {
    WebhookConfig {
        prober_image: Some("registry.example/railguard-prober:0.1.0".into()),
        ..WebhookConfig::default()
    }
}

fn ns(name: &str) -> NamespaceInfo {
    NamespaceInfo::new(name)
}

fn allowed_ns() -> NamespaceInfo {
    NamespaceInfo::new("ml-research").with_label("railguard.io/exemptions", "allowed")
}

/// Applies the plan with a real JSON-patch implementation; the result must still be a Pod.
fn apply(pod: &Pod, plan: &Plan) -> Pod {
    let mut doc = serde_json::to_value(pod).unwrap();
    assert_no_overwrite(&doc, plan);
    json_patch::patch(&mut doc, &plan.patch()).unwrap();
    serde_json::from_value(doc).unwrap()
}

/// railguard never replaces what the user wrote: an `add` must target a missing member, an
/// array end (`-`) or an array index (insert); `replace` only a string annotation. Each
/// operation is checked against the pod as the operations before it left it (a later step
/// appends to a list an earlier one created).
fn assert_no_overwrite(doc: &Value, plan: &Plan) {
    let mut patched = doc.clone();
    for op in &plan.ops {
        let doc = &patched;
        match op {
            PatchOp::Add { path, .. } => {
                let last = path.as_str().rsplit('/').next().unwrap_or_default();
                if last == "-" || last.parse::<usize>().is_ok() {
                    let parent = &path.as_str()[..path.as_str().len() - last.len() - 1];
                    assert!(doc.pointer(parent).is_some_and(Value::is_array), "{parent}");
                } else {
                    assert!(
                        doc.pointer(path.as_str()).is_none(),
                        "add overwrites {path}"
                    );
                }
            }
            PatchOp::Replace { path, .. } => {
                assert!(
                    path.as_str().starts_with("/metadata/annotations/"),
                    "{path}"
                );
                assert!(doc.pointer(path.as_str()).is_some_and(Value::is_string));
            }
        }
        json_patch::patch(&mut patched, &crate::patch::to_patch(vec![op.clone()])).unwrap();
    }
}

/// Mutates, applies, checks the warnings' length and that a second pass is a no-op.
fn run(p: &Pod, namespace: &NamespaceInfo, profiles: &[FabricProfile]) -> (Plan, Pod) {
    let plan = mutate(p, namespace, profiles, &cfg()).unwrap();
    for w in &plan.warnings {
        assert!(w.message.chars().count() < 120, "{}", w.message);
    }
    let out = apply(p, &plan);
    let again = mutate(&out, namespace, profiles, &cfg()).unwrap();
    assert!(again.ops.is_empty(), "second pass patched: {:?}", again.ops);
    assert!(plan.deny.is_none() || plan.ops.is_empty());
    (plan, out)
}

fn env_of(c: &Container) -> BTreeMap<String, String> {
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn caps(c: &Container) -> Vec<String> {
    c.security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.clone())
        .unwrap_or_default()
}

/// The NCCL variables of an h100-ndr pod: its eight rails and the pod network.
fn assert_h100_ndr_nccl_env(env: &BTreeMap<String, String>) {
    assert_eq!(
        env["NCCL_IB_HCA"],
        "=mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"
    );
    assert_eq!(env["NCCL_SOCKET_IFNAME"], "=eth0");
}

/// What a training pod gets: the NCCL environment, IPC_LOCK and /dev/shm, then what gives
/// it its rails.
fn training_mutations(rails: &[Mutation]) -> Vec<Mutation> {
    let mut all = vec![Mutation::NcclEnv, Mutation::IpcLock, Mutation::Shm];
    all.extend_from_slice(rails);
    all
}

/// Sets `name` in the first container's environment, as the user wrote it.
fn push_user_env(p: &mut Pod, name: &str, value: &str) {
    let env = p.spec.as_mut().unwrap().containers[0].env.as_mut().unwrap();
    env.push(EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    });
}

/// The plan's warnings that a profile does not fit the pod.
fn profile_mismatches(plan: &Plan) -> Vec<&Warning> {
    plan.warnings
        .iter()
        .filter(|w| w.kind == WarningKind::ProfileMismatch)
        .collect()
}

fn resource(c: &Container, field: &str, name: &str) -> Option<String> {
    let r = c.resources.as_ref()?;
    let m = if field == "limits" {
        r.limits.as_ref()?
    } else {
        r.requests.as_ref()?
    };
    m.get(name).map(|q| q.0.clone())
}

fn required_terms(p: &Pod) -> Vec<Vec<(String, String, Vec<String>)>> {
    p.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| {
            r.node_selector_terms
                .iter()
                .map(|t| {
                    t.match_expressions
                        .iter()
                        .flatten()
                        .map(|e| {
                            (
                                e.key.clone(),
                                e.operator.clone(),
                                e.values.clone().unwrap_or_default(),
                            )
                        })
                        .collect()
                })
                .collect()
        })
        .unwrap_or_default()
}

fn pytorch_worker() -> Pod {
    pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "llama-pretrain-worker-3", "namespace": "ml",
            "labels": {
                "training.kubeflow.org/job-name": "llama-pretrain",
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": "3"
            }
        },
        "spec": {
            "restartPolicy": "OnFailure",
            "containers": [{
                "name": "pytorch",
                "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "command": ["torchrun", "--nnodes=4", "--nproc-per-node=8", "train.py"],
                "env": [
                    {"name": "MASTER_ADDR", "value": "llama-pretrain-master-0"},
                    {"name": "MASTER_PORT", "value": "23456"},
                    {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['training.kubeflow.org/replica-index']"}}}
                ],
                "resources": {
                    "limits": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1600Gi"},
                    "requests": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1600Gi"}
                }
            }]
        }
    }))
}

fn mpi_launcher() -> Pod {
    pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "nccl-bench-launcher-x2b9", "namespace": "ml",
            "labels": {"training.kubeflow.org/job-name": "nccl-bench", "training.kubeflow.org/job-role": "launcher"}},
        "spec": {
            "containers": [{
                "name": "mpi-launcher", "image": "mpioperator/openmpi:0.5.0",
                "command": ["mpirun", "-np", "16", "/opt/nccl-tests/build/all_reduce_perf", "-b", "8", "-e", "8G"],
                "env": [{"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"}],
                "volumeMounts": [{"name": "mpi-job-config", "mountPath": "/etc/mpi"}]
            }],
            "volumes": [{"name": "mpi-job-config", "configMap": {"name": "nccl-bench-config"}}]
        }
    }))
}

fn mpi_worker() -> Pod {
    pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "nccl-bench-worker-1", "namespace": "ml",
            "labels": {"training.kubeflow.org/job-name": "nccl-bench", "training.kubeflow.org/job-role": "worker"}},
        "spec": {
            "hostname": "nccl-bench-worker-1", "subdomain": "nccl-bench",
            "containers": [{
                "name": "mpi-worker", "image": "mpioperator/openmpi:0.5.0",
                "command": ["/usr/sbin/sshd", "-De"],
                "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}},
                "volumeMounts": [{"name": "ssh-auth", "mountPath": "/root/.ssh"}],
                "resources": {"limits": {"nvidia.com/gpu": "8"}}
            }],
            "volumes": [{"name": "ssh-auth", "secret": {"secretName": "nccl-bench-ssh", "defaultMode": 384}}]
        }
    }))
}

fn jobset_pod() -> Pod {
    pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gpt-js-workers-0-2-8x7kq", "namespace": "ml",
            "labels": {"jobset.sigs.k8s.io/jobset-name": "gpt-js", "jobset.sigs.k8s.io/replicatedjob-name": "workers"},
            "annotations": {"jobset.sigs.k8s.io/exclusive-topology": "network.topology.nvidia.com/leaf"}},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-17"]}]}
                ]}},
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchLabels": {"jobset.sigs.k8s.io/job-key": "abc"}},
                    "topologyKey": "network.topology.nvidia.com/leaf"
                }]}
            },
            "initContainers": [{"name": "fetch-data", "image": "busybox:1.36", "command": ["sh", "-c", "true"]}],
            "containers": [
                {"name": "trainer", "image": "ghcr.io/example/gpt:1.0",
                 "resources": {"limits": {"nvidia.com/gpu": "8"}},
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "log-shipper", "image": "fluent/fluent-bit:3.0"},
                {"name": "metrics", "image": "nvidia/dcgm-exporter:3.3.5", "resources": {"limits": {"cpu": "1"}}}
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "gpt-data"}}]
        }
    }))
}

fn lws_pod(role: &str) -> Pod {
    pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("vllm-0{}", if role == "leader" { "" } else { "-1" }), "namespace": "serving",
            "labels": {"leaderworkerset.sigs.k8s.io/name": "vllm", "leaderworkerset.sigs.k8s.io/worker-index": if role == "leader" { "0" } else { "1" }},
            "annotations": {"leaderworkerset.sigs.k8s.io/size": "2", "railguard.io/profile": "h100-ndr"}},
        "spec": {
            "containers": [{
                "name": format!("vllm-{role}"), "image": "vllm/vllm-openai:v0.5.0",
                "env": [
                    {"name": "NCCL_IB_HCA", "value": "=mlx5_0:1,mlx5_7:1"},
                    {"name": "NCCL_SOCKET_IFNAME", "value": "=eth0"}
                ],
                "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}}
            }]
        }
    }))
}

fn rayjob_worker() -> Pod {
    pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "rayjob-gpu-worker-group-worker-5xk2p", "namespace": "research",
            "labels": {"ray.io/cluster": "rayjob-raycluster-abc", "ray.io/node-type": "worker", "ray.io/group": "gpu-group"}},
        "spec": {
            "nodeSelector": {"node.kubernetes.io/instance-type": "gpu-8x-roce"},
            "containers": [{
                "name": "ray-worker", "image": "rayproject/ray:2.9.0-gpu",
                "resources": {"limits": {"nvidia.com/gpu": "4", "cpu": "32"}, "requests": {"nvidia.com/gpu": "4", "cpu": "32"}},
                "volumeMounts": [{"name": "shared-mem", "mountPath": "/dev/shm"}]
            }],
            "volumes": [{"name": "shared-mem", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}}]
        }
    }))
}

#[test]
fn pytorchjob_worker_gets_the_full_configuration() {
    let p = pytorch_worker();
    let (plan, out) = run(&p, &ns("ml"), &profiles());
    assert_eq!(plan.outcome, Outcome::Mutated);
    assert_eq!(plan.profile.as_deref(), Some("h100-ndr"), "default profile");
    assert_eq!(
        plan.mutations,
        training_mutations(&[Mutation::Rdma, Mutation::Affinity])
    );
    let spec = out.spec.as_ref().unwrap();
    let c = &spec.containers[0];
    let env = env_of(c);
    assert_h100_ndr_nccl_env(&env);
    assert_eq!(
        env["RAILGUARD_SHM_SIZE"], "64Gi",
        "the size of the /dev/shm mounted"
    );
    assert_eq!(
        env["MASTER_ADDR"], "llama-pretrain-master-0",
        "user env kept"
    );
    assert_eq!(
        c.env.as_ref().unwrap()[2].name,
        "PET_NODE_RANK",
        "order kept"
    );
    assert_eq!(caps(c), ["IPC_LOCK"]);
    let shm = spec
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == SHM_VOLUME)
        .unwrap();
    let ed = shm.empty_dir.as_ref().unwrap();
    assert_eq!(ed.medium.as_deref(), Some("Memory"));
    assert_eq!(ed.size_limit.as_ref().unwrap().0, "64Gi");
    assert!(c
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.name == SHM_VOLUME && m.mount_path == "/dev/shm"));
    assert_eq!(
        resource(c, "limits", "rdma/rdma_shared_device_a").as_deref(),
        Some("1")
    );
    assert_eq!(
        resource(c, "requests", "rdma/rdma_shared_device_a").as_deref(),
        Some("1")
    );
    assert_eq!(
        resource(c, "limits", "nvidia.com/gpu").as_deref(),
        Some("8")
    );
    assert_eq!(
        required_terms(&out),
        vec![vec![
            (
                "railguard.io/fabric".into(),
                "In".into(),
                vec!["certified".into()]
            ),
            (
                "railguard.io/profile".into(),
                "In".into(),
                vec!["h100-ndr".into()]
            ),
            // The shipped profile counts no simulated certificate.
            (
                "railguard.io/simulated".into(),
                "DoesNotExist".into(),
                vec![]
            ),
        ]]
    );
    assert_eq!(annotation(&out, "railguard.io/profile"), Some("h100-ndr"));
    let sig = profile(H100).spec.signature();
    assert_eq!(
        annotation(&out, "railguard.io/signature"),
        Some(sig.as_str())
    );
    assert_eq!(
        annotation(&out, "railguard.io/mutations"),
        Some("nccl-env,ipc-lock,shm,rdma,affinity")
    );
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
}

#[test]
fn mpijob_launcher_without_gpu_is_untouched() {
    let p = mpi_launcher();
    let plan = mutate(&p, &ns("ml"), &profiles(), &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::NotTraining);
    assert!(plan.ops.is_empty() && plan.warnings.is_empty());
}

#[test]
fn mpijob_worker_keeps_its_capabilities_and_is_warned_about_nccl_debug() {
    let p = mpi_worker();
    let (plan, out) = run(&p, &ns("ml"), &profiles());
    let c = &out.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        caps(c),
        ["SYS_PTRACE", "IPC_LOCK"],
        "appended, not replaced"
    );
    assert_eq!(c.volume_mounts.as_ref().unwrap().len(), 2);
    assert_eq!(
        out.spec.as_ref().unwrap().volumes.as_ref().unwrap().len(),
        2
    );
    assert_eq!(env_of(c)["NCCL_DEBUG"], "INFO", "the user's variable stays");
    assert_eq!(plan.warnings.len(), 1);
    assert_eq!(plan.warnings[0].kind, WarningKind::UnsafeNccl);
    assert!(plan.warnings[0]
        .message
        .contains("container mpi-worker: NCCL_DEBUG=INFO"));
}

#[test]
fn jobset_pod_selects_by_node_selector_and_ands_affinity_into_every_term() {
    let p = jobset_pod();
    let (plan, out) = run(&p, &ns("ml"), &profiles());
    assert_eq!(plan.profile.as_deref(), Some("a100-hdr"));
    let spec = out.spec.as_ref().unwrap();
    // Only the GPU container changes.
    assert_eq!(spec.containers[1], p.spec.as_ref().unwrap().containers[1]);
    assert_eq!(spec.containers[2], p.spec.as_ref().unwrap().containers[2]);
    assert_eq!(
        spec.init_containers,
        p.spec.as_ref().unwrap().init_containers
    );
    assert!(env_of(&spec.containers[0]).contains_key("NCCL_IB_HCA"));
    assert!(
        !env_of(&spec.containers[0]).contains_key("NCCL_SOCKET_IFNAME"),
        "a100 sets none"
    );
    let terms = required_terms(&out);
    assert_eq!(terms.len(), 2, "terms stay ORed");
    assert_eq!(terms[0][0].0, "topology.kubernetes.io/zone");
    for t in &terms {
        assert!(t.contains(&(
            "railguard.io/fabric".into(),
            "In".into(),
            vec!["certified".into()]
        )));
        assert!(t.contains(&(
            "railguard.io/profile".into(),
            "In".into(),
            vec!["a100-hdr".into()]
        )));
    }
    let na = spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap();
    let term1 = &na
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms[1];
    assert_eq!(
        term1.match_fields.as_ref().unwrap()[0]
            .values
            .as_ref()
            .unwrap()[0],
        "gpu-node-17"
    );
    assert!(
        spec.affinity.as_ref().unwrap().pod_affinity.is_some(),
        "pod affinity kept"
    );
    assert_eq!(
        annotation(&out, "jobset.sigs.k8s.io/exclusive-topology"),
        Some("network.topology.nvidia.com/leaf")
    );
}

#[test]
fn lws_leader_and_worker_keep_a_user_hca_and_are_warned_about_an_hca_outside_the_profile() {
    for role in ["leader", "worker"] {
        let p = lws_pod(role);
        let (plan, out) = run(&p, &ns("serving"), &profiles());
        assert_eq!(plan.profile.as_deref(), Some("h100-ndr"), "annotation wins");
        let env = env_of(&out.spec.as_ref().unwrap().containers[0]);
        assert_eq!(env["NCCL_IB_HCA"], "=mlx5_0:1,mlx5_7:1");
        let conflicts: Vec<_> = plan
            .warnings
            .iter()
            .filter(|w| w.kind == WarningKind::EnvConflict)
            .collect();
        assert_eq!(conflicts.len(), 1, "{:?}", plan.warnings);
        assert!(conflicts[0]
            .message
            .contains("mlx5_7 outside profile h100-ndr"));
        assert!(
            !plan.mutations.contains(&Mutation::NcclEnv),
            "both variables were the user's"
        );
    }
}

#[test]
fn rayjob_worker_with_its_own_dev_shm_gets_per_gpu_rdma_and_networks() {
    let p = rayjob_worker();
    let (plan, out) = run(&p, &ns("research"), &profiles());
    assert_eq!(plan.profile.as_deref(), Some("roce-cloud"));
    assert!(
        !plan.mutations.contains(&Mutation::Shm),
        "KubeRay's /dev/shm is kept"
    );
    let spec = out.spec.as_ref().unwrap();
    assert_eq!(spec.volumes.as_ref().unwrap().len(), 1);
    let c = &spec.containers[0];
    assert_eq!(
        resource(c, "limits", "nvidia.com/sriov_rdma").as_deref(),
        Some("4")
    );
    assert_eq!(
        resource(c, "requests", "nvidia.com/sriov_rdma").as_deref(),
        Some("4")
    );
    let env = env_of(c);
    assert_eq!(env["NCCL_IB_QPS_PER_CONNECTION"], "4");
    assert_eq!(env["NCCL_CROSS_NIC"], "0");
    assert_eq!(
        annotation(&out, "k8s.v1.cni.cncf.io/networks"),
        Some("gpu-rdma/sriov-rdma-0,gpu-rdma/sriov-rdma-1")
    );
}

#[test]
fn non_training_and_excluded_pods_are_untouched() {
    let mut p = pytorch_worker();
    let plan = mutate(&p, &ns("kube-system"), &profiles(), &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::Excluded);
    assert!(plan.ops.is_empty());
    p.spec.as_mut().unwrap().containers[0].resources = None;
    let plan = mutate(&p, &ns("ml"), &profiles(), &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::NotTraining);
    // A zero GPU request is not a GPU container.
    let mut z = pytorch_worker();
    z.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "nvidia.com/gpu".into(),
            Quantity("0".into()),
        )])),
        ..Default::default()
    });
    assert_eq!(
        mutate(&z, &ns("ml"), &profiles(), &cfg()).unwrap().outcome,
        Outcome::NotTraining
    );
}

#[test]
fn configurable_gpu_resources() {
    let mut p = pytorch_worker();
    p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "amd.com/gpu".into(),
            Quantity("8".into()),
        )])),
        ..Default::default()
    });
    assert_eq!(
        mutate(&p, &ns("ml"), &profiles(), &cfg()).unwrap().outcome,
        Outcome::NotTraining
    );
    let config = WebhookConfig {
        gpu_resources: vec!["nvidia.com/gpu".into(), "amd.com/gpu".into()],
        ..cfg()
    };
    assert_eq!(
        mutate(&p, &ns("ml"), &profiles(), &config).unwrap().outcome,
        Outcome::Mutated
    );
}

#[test]
fn inject_true_opts_a_cpu_pod_in_for_all_containers() {
    let mut p = mpi_launcher();
    p.metadata.annotations = Some(BTreeMap::from([(
        "railguard.io/inject".into(),
        "true".into(),
    )]));
    let (plan, out) = run(&p, &ns("ml"), &profiles());
    assert_eq!(plan.outcome, Outcome::Mutated);
    assert!(env_of(&out.spec.as_ref().unwrap().containers[0]).contains_key("NCCL_IB_HCA"));
}

#[test]
fn inject_false_is_honored_only_where_exemptions_are_allowed() {
    let mut p = pytorch_worker();
    p.metadata.annotations = Some(BTreeMap::from([(
        "railguard.io/inject".into(),
        "false".into(),
    )]));
    let plan = mutate(&p, &allowed_ns(), &profiles(), &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::OptedOut);
    assert!(plan.ops.is_empty() && plan.warnings.is_empty());

    let (plan, _) = run(&p, &ns("ml"), &profiles());
    assert_eq!(plan.outcome, Outcome::Mutated);
    assert_eq!(plan.warnings.len(), 1);
    assert_eq!(plan.warnings[0].kind, WarningKind::ExemptionIgnored);
    assert_eq!(
        plan.warnings[0].message,
        "railguard.io/inject=false ignored: namespace ml may not use exemptions of profile h100-ndr"
    );

    // roce-cloud allows exemptions by namespace name.
    let mut r = rayjob_worker();
    r.metadata.annotations = Some(BTreeMap::from([(
        "railguard.io/inject".into(),
        "false".into(),
    )]));
    assert_eq!(
        mutate(&r, &ns("research"), &profiles(), &cfg())
            .unwrap()
            .outcome,
        Outcome::OptedOut
    );

    let mut bad = pytorch_worker();
    bad.metadata.annotations = Some(BTreeMap::from([(
        "railguard.io/inject".into(),
        "no".into(),
    )]));
    let plan = mutate(&bad, &ns("ml"), &profiles(), &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::Mutated);
    assert_eq!(plan.warnings[0].kind, WarningKind::InvalidAnnotation);
}

#[test]
fn skip_parts_are_honored_in_allowed_namespaces_and_ignored_elsewhere() {
    let mut p = pytorch_worker();
    p.metadata.annotations = Some(BTreeMap::from([(
        "railguard.io/skip".into(),
        "shm, ipc-lock,nccl-env,rdma,network,affinity".into(),
    )]));
    let (plan, out) = run(&p, &allowed_ns(), &profiles());
    assert!(plan.mutations.is_empty());
    assert!(plan.warnings.is_empty());
    assert_eq!(out.spec, p.spec, "only annotations change");
    assert_eq!(annotation(&out, "railguard.io/profile"), Some("h100-ndr"));
    assert_eq!(annotation(&out, "railguard.io/mutations"), None);

    let (plan, _) = run(&p, &ns("ml"), &profiles());
    assert_eq!(plan.mutations.len(), 5);
    assert_eq!(plan.warnings.len(), 1);
    assert!(plan.warnings[0]
        .message
        .starts_with("railguard.io/skip ignored: namespace ml"));

    p.metadata.annotations = Some(BTreeMap::from([(
        "railguard.io/skip".into(),
        "shm,gdr".into(),
    )]));
    let (plan, _) = run(&p, &allowed_ns(), &profiles());
    assert!(!plan.mutations.contains(&Mutation::Shm));
    assert!(plan.mutations.contains(&Mutation::IpcLock));
    assert_eq!(plan.warnings[0].kind, WarningKind::InvalidAnnotation);
    assert!(plan.warnings[0].message.contains("\"gdr\""));
}

#[test]
fn allow_uncertified_drops_the_certified_affinity_only_where_allowed() {
    let mut p = pytorch_worker();
    p.metadata.annotations = Some(BTreeMap::from([(
        "railguard.io/allow-uncertified".into(),
        "true".into(),
    )]));
    let (plan, out) = run(&p, &allowed_ns(), &profiles());
    assert!(!plan.mutations.contains(&Mutation::Affinity));
    assert!(required_terms(&out).is_empty());
    let (plan, out) = run(&p, &ns("ml"), &profiles());
    assert!(plan.mutations.contains(&Mutation::Affinity));
    assert_eq!(required_terms(&out)[0].len(), 3);
    assert!(plan.warnings[0]
        .message
        .starts_with("railguard.io/allow-uncertified ignored"));
}

#[test]
fn profile_choice_annotation_then_selector_then_default() {
    // Annotation beats the nodeSelector.
    let mut p = jobset_pod();
    p.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("railguard.io/profile".into(), "roce-cloud".into());
    assert_eq!(
        mutate(&p, &ns("ml"), &profiles(), &cfg())
            .unwrap()
            .profile
            .as_deref(),
        Some("roce-cloud")
    );
    // Affinity selects a profile too.
    let mut q = pytorch_worker();
    q.spec.as_mut().unwrap().affinity = Some(serde_json::from_value(json!({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["gpu-8x-roce"]}]}
        ]}}})).unwrap());
    assert_eq!(
        mutate(&q, &ns("ml"), &profiles(), &cfg())
            .unwrap()
            .profile
            .as_deref(),
        Some("roce-cloud")
    );
    // Unknown profile named: warning, nothing else.
    let mut u = pytorch_worker();
    u.metadata.annotations = Some(BTreeMap::from([(
        "railguard.io/profile".into(),
        "b200-xdr".into(),
    )]));
    let plan = mutate(&u, &ns("ml"), &profiles(), &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::NoProfile);
    assert!(plan.ops.is_empty());
    assert!(plan.warnings[0]
        .message
        .contains("\"b200-xdr\", which does not exist"));
    // No default and no selector match.
    let no_default = vec![profile(A100), profile(ROCE)];
    let plan = mutate(&pytorch_worker(), &ns("ml"), &no_default, &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::NoProfile);
    assert!(plan.ops.is_empty());
    assert_eq!(plan.warnings[0].kind, WarningKind::NoProfile);
    assert!(plan.warnings[0]
        .message
        .starts_with("no FabricProfile matches"));
    assert!(mutate(&pytorch_worker(), &ns("ml"), &[], &cfg())
        .unwrap()
        .ops
        .is_empty());
}

#[test]
fn hostipc_and_hostnetwork_pods_get_no_shm_and_no_networks() {
    let mut p = rayjob_worker();
    let spec = p.spec.as_mut().unwrap();
    spec.host_network = Some(true);
    spec.host_ipc = Some(true);
    spec.containers[0].volume_mounts = None;
    spec.volumes = None;
    let (plan, out) = run(&p, &ns("research"), &profiles());
    assert!(!plan.mutations.contains(&Mutation::Network));
    assert!(!plan.mutations.contains(&Mutation::Shm));
    assert_eq!(annotation(&out, "k8s.v1.cni.cncf.io/networks"), None);
    assert!(out.spec.as_ref().unwrap().volumes.is_none());
}

#[test]
fn multus_json_form_is_merged_without_dropping_user_networks() {
    let mut p = rayjob_worker();
    p.metadata.annotations = Some(BTreeMap::from([(
        "k8s.v1.cni.cncf.io/networks".into(),
        r#"[{"name":"storage","namespace":"infra","interface":"st0"},{"name":"sriov-rdma-1","namespace":"gpu-rdma"}]"#.into(),
    )]));
    let (_, out) = run(&p, &ns("research"), &profiles());
    let v: Vec<Value> =
        serde_json::from_str(annotation(&out, "k8s.v1.cni.cncf.io/networks").unwrap()).unwrap();
    let names: Vec<&str> = v.iter().map(|x| x["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["storage", "sriov-rdma-1", "sriov-rdma-0"]);

    p.metadata.annotations = Some(BTreeMap::from([(
        "k8s.v1.cni.cncf.io/networks".into(),
        "[not json".into(),
    )]));
    let (plan, out) = run(&p, &ns("research"), &profiles());
    assert_eq!(
        annotation(&out, "k8s.v1.cni.cncf.io/networks"),
        Some("[not json")
    );
    assert!(plan.warnings.iter().any(|w| w.kind == WarningKind::Network));
}

#[test]
fn existing_rdma_request_and_privileged_containers_are_left_alone() {
    let mut p = pytorch_worker();
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.resources
        .as_mut()
        .unwrap()
        .limits
        .as_mut()
        .unwrap()
        .insert("rdma/rdma_shared_device_a".into(), Quantity("2".into()));
    c.resources
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()
        .insert("rdma/rdma_shared_device_a".into(), Quantity("2".into()));
    c.security_context = Some(SecurityContext {
        privileged: Some(true),
        ..Default::default()
    });
    let (plan, out) = run(&p, &ns("ml"), &profiles());
    assert!(!plan.mutations.contains(&Mutation::Rdma));
    assert!(!plan.mutations.contains(&Mutation::IpcLock));
    let c = &out.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        resource(c, "limits", "rdma/rdma_shared_device_a").as_deref(),
        Some("2")
    );
}

#[test]
fn per_rail_rdma_counts_rails() {
    let mut h = profile(H100);
    h.spec.rdma.as_mut().unwrap().count_mode = RdmaCountMode::PerRail;
    let (_, out) = run(&pytorch_worker(), &ns("ml"), &[h]);
    let c = &out.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        resource(c, "limits", "rdma/rdma_shared_device_a").as_deref(),
        Some("8")
    );
}

#[test]
fn pod_security_baseline_blocks_ipc_lock_with_a_warning_or_a_denial() {
    let baseline = ns("ml").with_label("pod-security.kubernetes.io/enforce", "baseline");
    let (plan, out) = run(&pytorch_worker(), &baseline, &profiles());
    assert!(!plan.mutations.contains(&Mutation::IpcLock));
    assert!(caps(&out.spec.as_ref().unwrap().containers[0]).is_empty());
    assert_eq!(plan.warnings.len(), 1);
    assert_eq!(plan.warnings[0].kind, WarningKind::PodSecurity);
    assert!(plan.warnings[0]
        .message
        .contains("pod-security.kubernetes.io/enforce=baseline"));

    let privileged = ns("ml").with_label("pod-security.kubernetes.io/enforce", "privileged");
    let (plan, _) = run(&pytorch_worker(), &privileged, &profiles());
    assert!(plan.mutations.contains(&Mutation::IpcLock));

    let mut strict = profile(H100);
    strict.spec.policy.pod_security_conflict = Enforcement::Deny;
    let restricted = ns("ml").with_label("pod-security.kubernetes.io/enforce", "restricted");
    let plan = mutate(&pytorch_worker(), &restricted, &[strict], &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::Denied);
    assert!(plan.ops.is_empty());
    assert!(plan
        .deny
        .unwrap()
        .contains("pod-security.kubernetes.io/enforce=restricted"));
}

#[test]
fn unsafe_nccl_settings_warn_or_deny_per_policy() {
    let mut p = pytorch_worker();
    p.spec.as_mut().unwrap().containers[0]
        .env
        .as_mut()
        .unwrap()
        .extend(
            [
                ("NCCL_NET_GDR_LEVEL", "SYS"),
                ("NCCL_IB_TIMEOUT", "22"),
                ("NCCL_IB_RETRY_CNT", "10"),
                ("NCCL_IB_GID_INDEX", "3"),
                ("NCCL_NET", "Socket"),
                ("NCCL_DEBUG_SUBSYS", "ALL"),
            ]
            .map(|(k, v)| EnvVar {
                name: k.into(),
                value: Some(v.into()),
                value_from: None,
            }),
        );
    let (plan, _) = run(&p, &ns("ml"), &profiles());
    let unsafe_count = plan
        .warnings
        .iter()
        .filter(|w| w.kind == WarningKind::UnsafeNccl)
        .count();
    assert_eq!(unsafe_count, 6, "{:?}", plan.warnings);
    assert_eq!(plan.outcome, Outcome::Mutated);

    let mut strict = profile(H100);
    strict.spec.policy.unsafe_nccl = Enforcement::Deny;
    let plan = mutate(&p, &ns("ml"), &[strict], &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::Denied);
    assert!(plan.ops.is_empty());
    let reason = plan.deny.unwrap();
    assert!(reason.starts_with("profile h100-ndr denies unsafe NCCL settings:"));
    assert!(reason.contains("NCCL_NET_GDR_LEVEL"));
}

#[test]
fn a_socket_ifname_the_user_set_differently_is_kept_with_a_warning() {
    let mut p = pytorch_worker();
    push_user_env(&mut p, "NCCL_SOCKET_IFNAME", "=bond0");
    let (plan, out) = run(&p, &ns("ml"), &profiles());
    assert_eq!(
        env_of(&out.spec.as_ref().unwrap().containers[0])["NCCL_SOCKET_IFNAME"],
        "=bond0"
    );
    assert_eq!(
        plan.warnings[0].message,
        "container pytorch: NCCL_SOCKET_IFNAME==bond0 kept; profile h100-ndr sets =eth0"
    );
}

#[test]
fn preflight_init_container_copies_the_mutated_gpu_container() {
    let mut h = profile(H100);
    h.spec.preflight = true;
    let p = jobset_pod();
    let mut p2 = p.clone();
    p2.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("railguard.io/profile".into(), "h100-ndr".into());
    let (plan, out) = run(&p2, &ns("ml"), std::slice::from_ref(&h));
    assert!(plan.mutations.contains(&Mutation::Preflight));
    let spec = out.spec.as_ref().unwrap();
    let init = spec.init_containers.as_ref().unwrap();
    assert_eq!(init.len(), 2);
    assert_eq!(init[0].name, PREFLIGHT_CONTAINER, "runs first");
    assert_eq!(init[1].name, "fetch-data");
    let pre = &init[0];
    assert_eq!(
        pre.image.as_deref(),
        Some("registry.example/railguard-prober:0.1.0")
    );
    assert_eq!(
        pre.command.as_ref().unwrap(),
        &["railguard-prober", "preflight"]
    );
    let gpu = &spec.containers[0];
    assert_eq!(pre.resources, gpu.resources);
    assert_eq!(pre.volume_mounts, gpu.volume_mounts);
    assert_eq!(pre.security_context, gpu.security_context);
    let env = env_of(pre);
    assert_eq!(env["NCCL_IB_HCA"], env_of(gpu)["NCCL_IB_HCA"]);
    assert_eq!(env["RAILGUARD_PROFILE"], "h100-ndr");
    assert_eq!(
        env["RAILGUARD_SHM_SIZE"], "64Gi",
        "preflight checks the mounted size"
    );

    // Without a prober image: a warning, no init container.
    let config = WebhookConfig::default();
    let plan = mutate(&p2, &ns("ml"), &[h], &config).unwrap();
    assert!(!plan.mutations.contains(&Mutation::Preflight));
    assert!(plan
        .warnings
        .iter()
        .any(|w| w.kind == WarningKind::Preflight));
}

#[test]
fn a_container_added_later_is_configured_on_reinvocation() {
    let p = pytorch_worker();
    let (_, mut out) = run(&p, &ns("ml"), &profiles());
    // Another webhook adds a second GPU container after railguard ran.
    out.spec.as_mut().unwrap().containers.push(Container {
        name: "sidecar-gpu".into(),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "nvidia.com/gpu".into(),
                Quantity("1".into()),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    });
    let (plan, again) = run(&out, &ns("ml"), &profiles());
    assert_eq!(plan.outcome, Outcome::Mutated);
    assert!(plan
        .ops
        .iter()
        .all(|op| op.path().as_str().starts_with("/spec/containers/1")));
    let spec = again.spec.as_ref().unwrap();
    assert_eq!(
        spec.volumes
            .as_ref()
            .unwrap()
            .iter()
            .filter(|v| v.name == SHM_VOLUME)
            .count(),
        1
    );
    assert!(env_of(&spec.containers[1]).contains_key("NCCL_IB_HCA"));
}

#[test]
fn two_hundred_containers_and_unicode_names() {
    let mut p = pytorch_worker();
    p.metadata.name = Some("训练-ジョブ-🚀".into());
    p.metadata.annotations = Some(BTreeMap::from([("notes/ü~x".into(), "ok".into())]));
    let base = p.spec.as_ref().unwrap().containers[0].clone();
    let spec = p.spec.as_mut().unwrap();
    spec.containers = (0..200)
        .map(|i| Container {
            name: format!("wörker-{i}"),
            ..base.clone()
        })
        .collect();
    spec.containers[5].env.as_mut().unwrap().push(EnvVar {
        name: "NCCL_DEBUG".into(),
        value: Some("INFO\u{7}\u{1F600}".repeat(40)),
        value_from: None,
    });
    let (plan, out) = run(&p, &ns("ml"), &profiles());
    assert_eq!(plan.outcome, Outcome::Mutated);
    let spec = out.spec.as_ref().unwrap();
    assert!(spec.containers.iter().all(|c| caps(c) == ["IPC_LOCK"]));
    assert_eq!(annotation(&out, "notes/ü~x"), Some("ok"));
    let w = &plan.warnings[0];
    assert!(w.message.chars().count() <= MAX_WARNING_CHARS);
    assert!(!w.message.chars().any(char::is_control));
}

#[test]
fn a_pod_without_spec_is_an_error() {
    let p = Pod::default();
    assert!(matches!(
        mutate(&p, &ns("ml"), &profiles(), &cfg()),
        Err(MutateError::NoSpec)
    ));
}

#[test]
fn annotations_are_added_one_by_one_when_the_map_exists() {
    let mut p = pytorch_worker();
    p.metadata.annotations = Some(BTreeMap::from([("a/b".into(), "c".into())]));
    let plan = mutate(&p, &ns("ml"), &profiles(), &cfg()).unwrap();
    let paths: Vec<&str> = plan.ops.iter().map(|o| o.path().as_str()).collect();
    assert!(paths.contains(&"/metadata/annotations/railguard.io~1profile"));
    assert!(paths.contains(&"/metadata/annotations/railguard.io~1mutations"));
    let out = apply(&p, &plan);
    assert_eq!(annotation(&out, "a/b"), Some("c"));
}

#[test]
fn memoized_rail_layout_follows_rail_edits() {
    let h = profile(H100);
    let signature = |spec: &railguard_api::FabricProfileSpec| rail_layout(spec).signature;
    assert_eq!(signature(&h.spec), h.spec.signature());
    assert_eq!(signature(&h.spec), h.spec.signature(), "memo hit");
    assert_eq!(rail_layout(&h.spec).ib_hca, h.spec.nccl_ib_hca());
    let mut edited = h.clone();
    edited.spec.rails[3].rate_gbps = 200;
    assert_ne!(signature(&edited.spec), signature(&h.spec));
    assert_eq!(signature(&edited.spec), edited.spec.signature());
    edited.spec.rails[3].hca = "mlx5_7".to_string();
    assert_eq!(rail_layout(&edited.spec).ib_hca, edited.spec.nccl_ib_hca());
    assert_ne!(rail_layout(&edited.spec).ib_hca, h.spec.nccl_ib_hca());
}

#[test]
fn a_profile_ib_hca_wins_over_the_one_its_rails_give() {
    let mut h = profile(H100);
    h.spec.nccl.ib_hca = Some("=mlx5_0:1".to_string());
    let p = pytorch_worker();
    let plan = mutate(&p, &ns("ml"), std::slice::from_ref(&h), &cfg()).unwrap();
    let out = apply(&p, &plan);
    let env = out.spec.as_ref().unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    let hca = env.iter().find(|e| e.name == "NCCL_IB_HCA").unwrap();
    assert_eq!(hca.value.as_deref(), Some("=mlx5_0:1"));
}

/// The profiles with `h100-ndr` delivering its NCCL settings through the plugin.
fn plugin_profiles() -> Vec<FabricProfile> {
    let mut set = profiles();
    for p in &mut set {
        if p.name() == "h100-ndr" {
            p.spec.nccl.delivery = railguard_api::profile::NcclDelivery::Plugin;
        }
    }
    set
}

/// The pod's volumes as (name, JSON).
fn volumes_of(p: &Pod) -> Vec<(String, Value)> {
    p.spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.clone(), serde_json::to_value(v).unwrap()))
        .collect()
}

#[test]
fn a_plugin_profile_gets_the_plugin_its_node_file_and_shm_in_one_volume_list() {
    // Without volumes of its own (the first volume creates the list, the others append)
    // and with one (every volume appends); `run` checks nothing is overwritten and that a
    // second pass (reinvocation) patches nothing.
    let mut with_volume = pytorch_worker();
    with_volume.spec.as_mut().unwrap().volumes = Some(vec![serde_json::from_value(
        json!({"name": "data", "persistentVolumeClaim": {"claimName": "d"}}),
    )
    .unwrap()]);
    for (p, before) in [(pytorch_worker(), vec![]), (with_volume, vec!["data"])] {
        let (plan, out) = run(&p, &ns("ml"), &plugin_profiles());
        assert!(plan.mutations.contains(&Mutation::NcclEnv));
        assert!(plan.mutations.contains(&Mutation::Shm));
        let volumes = volumes_of(&out);
        let names: Vec<&str> = volumes.iter().map(|(n, _)| n.as_str()).collect();
        let mut want = before.clone();
        want.extend([NCCL_PLUGIN_VOLUME, NCCL_CONFIG_VOLUME, SHM_VOLUME]);
        assert_eq!(names, want);
        assert_eq!(
            volumes[before.len()].1,
            json!({"name": NCCL_PLUGIN_VOLUME,
                   "hostPath": {"path": "/opt/railguard/nccl", "type": "Directory"}})
        );
        assert_eq!(
            volumes[before.len() + 1].1,
            json!({"name": NCCL_CONFIG_VOLUME,
                   "hostPath": {"path": "/run/railguard", "type": "DirectoryOrCreate"}})
        );
        let c = &out.spec.as_ref().unwrap().containers[0];
        let env = env_of(c);
        assert_eq!(
            env.get("NCCL_ENV_PLUGIN").map(String::as_str),
            Some("/opt/railguard/nccl/libnccl-env-railguard.so")
        );
        assert_eq!(
            env.get("RAILGUARD_NCCL_CONFIG").map(String::as_str),
            Some("/run/railguard/nccl.json")
        );
        for var in ["NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_CROSS_NIC"] {
            assert!(!env.contains_key(var), "{var} is the plugin's to answer");
        }
        let mounts: Vec<(String, String, Option<bool>)> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.clone(), m.mount_path.clone(), m.read_only))
            .collect();
        for (volume, path) in [
            (NCCL_PLUGIN_VOLUME, "/opt/railguard/nccl"),
            (NCCL_CONFIG_VOLUME, "/run/railguard"),
        ] {
            assert!(
                mounts.contains(&(volume.to_string(), path.to_string(), Some(true))),
                "{mounts:?}"
            );
        }
    }
}

#[test]
fn env_delivery_injects_no_plugin() {
    let (_, out) = run(&pytorch_worker(), &ns("ml"), &profiles());
    let env = env_of(&out.spec.as_ref().unwrap().containers[0]);
    assert!(env.contains_key("NCCL_IB_HCA") && !env.contains_key("NCCL_ENV_PLUGIN"));
    let names: Vec<String> = volumes_of(&out).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, [SHM_VOLUME]);
}

fn audit_cfg() -> WebhookConfig {
    WebhookConfig {
        mode: AdmissionMode::Audit,
        ..cfg()
    }
}

/// The pod after `plan`, and the audit record it carries.
fn audited(p: &Pod, plan: &Plan) -> (Pod, Value) {
    let out = apply(p, plan);
    let record = annotation(&out, railguard_api::keys::ANNOTATION_AUDIT)
        .map(|v| serde_json::from_str(v).unwrap())
        .unwrap_or(Value::Null);
    (out, record)
}

#[test]
fn audit_admits_unchanged_but_for_the_record_of_the_patch_it_would_apply() {
    let p = pytorch_worker();
    let enforced = mutate(&p, &ns("ml"), &profiles(), &cfg()).unwrap();
    assert_eq!(enforced.outcome, Outcome::Mutated);

    let plan = mutate(&p, &ns("ml"), &profiles(), &audit_cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::AuditMutate);
    assert_eq!(plan.outcome.as_str(), "audit-mutate");
    assert_eq!(plan.profile.as_deref(), Some("h100-ndr"));
    assert!(plan.mutations.is_empty() && plan.deny.is_none());
    let (out, record) = audited(&p, &plan);
    // Only the annotation changed: the pod minus it is the submitted pod.
    let mut bare = out.clone();
    bare.metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove(railguard_api::keys::ANNOTATION_AUDIT);
    bare.metadata.annotations = bare.metadata.annotations.filter(|a| !a.is_empty());
    assert_eq!(bare, p);
    assert_eq!(record["mode"], "Audit");
    assert_eq!(record["would"], "mutate");
    assert_eq!(record["profile"], "h100-ndr");
    let listed: Vec<&str> = enforced.mutations.iter().map(|m| m.as_str()).collect();
    assert_eq!(record["mutations"], json!(listed));
    // The recorded patch is the one Enforce applies, and it applies to the submitted pod.
    assert_eq!(
        record["patch"],
        serde_json::to_value(enforced.patch()).unwrap()
    );
    let from_record: json_patch::Patch = serde_json::from_value(record["patch"].clone()).unwrap();
    let mut doc = serde_json::to_value(&p).unwrap();
    json_patch::patch(&mut doc, &from_record).unwrap();
    assert_eq!(doc, serde_json::to_value(apply(&p, &enforced)).unwrap());
    let audit: Vec<&Warning> = plan
        .warnings
        .iter()
        .filter(|w| w.kind == WarningKind::Audit)
        .collect();
    assert_eq!(audit.len(), 1, "{:?}", plan.warnings);
    assert!(
        audit[0]
            .message
            .starts_with("audit: profile h100-ndr would apply nccl-env,"),
        "{}",
        audit[0].message
    );
    // Audited again (reinvocation, a re-created copy): the same record, nothing to patch.
    let again = mutate(&out, &ns("ml"), &profiles(), &audit_cfg()).unwrap();
    assert_eq!(again.outcome, Outcome::AuditMutate);
    assert!(again.ops.is_empty(), "{:?}", again.ops);
}

#[test]
fn audit_admits_what_enforce_denies_and_records_the_reason() {
    let mut p = pytorch_worker();
    push_user_env(&mut p, "NCCL_NET_GDR_LEVEL", "SYS");
    let mut strict = profile(H100);
    strict.spec.policy.unsafe_nccl = Enforcement::Deny;
    let plan = mutate(&p, &ns("ml"), &[strict], &audit_cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::AuditDeny);
    assert!(plan.deny.is_none(), "admitted");
    let (_, record) = audited(&p, &plan);
    assert_eq!(record["would"], "deny");
    assert!(record.get("patch").is_none(), "{record}");
    assert!(record["deny"]
        .as_str()
        .unwrap()
        .starts_with("profile h100-ndr denies unsafe NCCL settings:"));
    assert!(plan
        .warnings
        .iter()
        .any(|w| w.kind == WarningKind::Audit && w.message.contains("would deny")));
    assert!(plan
        .warnings
        .iter()
        .any(|w| w.kind == WarningKind::UnsafeNccl));
}

#[test]
fn a_profile_mode_overrides_the_webhook_mode_both_ways() {
    let p = pytorch_worker();
    let mut enforcing = profile(H100);
    enforcing.spec.policy.mode = Some(AdmissionMode::Enforce);
    let plan = mutate(&p, &ns("ml"), &[enforcing], &audit_cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::Mutated);
    let mut auditing = profile(H100);
    auditing.spec.policy.mode = Some(AdmissionMode::Audit);
    let plan = mutate(&p, &ns("ml"), &[auditing], &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::AuditMutate);
}

#[test]
fn audit_leaves_pods_it_would_not_change_alone() {
    let config = audit_cfg();
    let (enforced, configured) = run(&pytorch_worker(), &ns("ml"), &profiles());
    assert_eq!(enforced.outcome, Outcome::Mutated);
    let plan = mutate(&configured, &ns("ml"), &profiles(), &config).unwrap();
    assert_eq!(plan.outcome, Outcome::Unchanged);
    let cpu = pod_of(json!([{"name": "web", "image": "nginx"}]));
    let plan = mutate(&cpu, &ns("ml"), &profiles(), &config).unwrap();
    assert_eq!(plan.outcome, Outcome::NotTraining);
    assert!(plan.ops.is_empty() && plan.warnings.is_empty());
}

#[test]
fn an_opt_in_scope_admits_pods_by_namespace_or_pod_label_only() {
    use railguard_api::selector::{LabelSelector, LabelSelectorRequirement, SelectorOperator};
    let inject = LabelSelector {
        match_labels: BTreeMap::from([("railguard.io/inject".to_string(), "true".to_string())]),
        ..Default::default()
    };
    // The Kueue pattern: every pod Kueue admits carries its queue's name.
    let queued = LabelSelector {
        match_expressions: vec![LabelSelectorRequirement {
            key: "kueue.x-k8s.io/podset".into(),
            operator: SelectorOperator::Exists,
            values: vec![],
        }],
        ..Default::default()
    };
    let config = WebhookConfig {
        scope: crate::config::Scope {
            namespaces: Some(inject),
            pods: Some(queued),
        },
        ..cfg()
    };
    let plain = pytorch_worker();
    let plan = mutate(&plain, &ns("ml"), &profiles(), &config).unwrap();
    assert_eq!(plan.outcome, Outcome::OutOfScope);
    assert!(plan.ops.is_empty() && plan.warnings.is_empty());
    let opted = ns("ml").with_label("railguard.io/inject", "true");
    let plan = mutate(&plain, &opted, &profiles(), &config).unwrap();
    assert_eq!(plan.outcome, Outcome::Mutated);
    let other = ns("ml").with_label("railguard.io/inject", "false");
    assert_eq!(
        mutate(&plain, &other, &profiles(), &config)
            .unwrap()
            .outcome,
        Outcome::OutOfScope
    );
    let mut queued_pod = pytorch_worker();
    queued_pod
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("kueue.x-k8s.io/podset".into(), "training".into());
    let plan = mutate(&queued_pod, &ns("ml"), &profiles(), &config).unwrap();
    assert_eq!(plan.outcome, Outcome::Mutated);
    // Excluded namespaces stay excluded whatever their labels.
    let system = ns("kube-system").with_label("railguard.io/inject", "true");
    assert_eq!(
        mutate(&plain, &system, &profiles(), &config)
            .unwrap()
            .outcome,
        Outcome::Excluded
    );
}

#[test]
fn a_pod_that_asks_for_another_gpu_product_is_not_forced_onto_the_default_profile() {
    let mut p = pytorch_worker();
    p.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([(
        "nvidia.com/gpu.product".to_string(),
        "NVIDIA-H200".to_string(),
    )]));
    let plan = mutate(&p, &ns("ml"), &profiles(), &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::NoProfile);
    assert!(plan.ops.is_empty(), "{:?}", plan.ops);
    let w = profile_mismatches(&plan);
    assert_eq!(w.len(), 1, "{:?}", plan.warnings);
    assert!(
        w[0].message.contains("nvidia.com/gpu.product")
            && w[0].message.contains("h100-ndr")
            && w[0].message.contains("railguard.io/profile"),
        "{}",
        w[0].message
    );
    // Naming the profile is an explicit choice: it applies.
    p.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("railguard.io/profile".into(), "h100-ndr".into());
    let plan = mutate(&p, &ns("ml"), &profiles(), &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::Mutated);
}

// ------------------------------------------------------------------ DRA (aligned rails)

/// The PyTorch worker with its GPUs and NICs from a claim of `source` (a
/// ResourceClaimTemplate, or with `by_claim_name` a ResourceClaim) instead of
/// `nvidia.com/gpu`.
fn dra_worker(source: &str, by_claim_name: bool) -> Pod {
    let mut v = serde_json::to_value(pytorch_worker()).unwrap();
    let c = &mut v["spec"]["containers"][0]["resources"];
    c["limits"]
        .as_object_mut()
        .unwrap()
        .remove("nvidia.com/gpu");
    c["requests"]
        .as_object_mut()
        .unwrap()
        .remove("nvidia.com/gpu");
    c["claims"] = json!([{"name": "rails"}]);
    let key = if by_claim_name {
        "resourceClaimName"
    } else {
        "resourceClaimTemplateName"
    };
    v["spec"]["resourceClaims"] = json!([{"name": "rails", key: source}]);
    pod(v)
}

#[test]
fn a_pod_claiming_its_profiles_aligned_rails_gets_all_but_affinity_and_rdma() {
    for by_claim_name in [false, true] {
        let p = dra_worker("railguard-h100-ndr-8-rails", by_claim_name);
        let (plan, out) = run(&p, &ns("ml"), &profiles());
        assert_eq!(plan.outcome, Outcome::Mutated);
        assert_eq!(plan.profile.as_deref(), Some("h100-ndr"));
        assert_eq!(plan.mutations, training_mutations(&[Mutation::DraClaims]));
        let spec = out.spec.as_ref().unwrap();
        let c = &spec.containers[0];
        // What does not depend on the allocation.
        assert_h100_ndr_nccl_env(&env_of(c));
        assert_eq!(caps(c), ["IPC_LOCK"]);
        assert!(c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == SHM_VOLUME && m.mount_path == "/dev/shm"));
        // What DRA does: no certified-node affinity, no RDMA device resource.
        assert!(required_terms(&out).is_empty());
        assert!(spec.affinity.is_none());
        assert_eq!(resource(c, "limits", "rdma/rdma_shared_device_a"), None);
        assert_eq!(resource(c, "requests", "rdma/rdma_shared_device_a"), None);
        // The claim is the user's, untouched.
        assert_eq!(
            spec.resource_claims,
            p.spec.as_ref().unwrap().resource_claims
        );
        assert_eq!(
            annotation(&out, "railguard.io/mutations"),
            Some("nccl-env,ipc-lock,shm,dra-claims")
        );
        assert_eq!(annotation(&out, "railguard.io/profile"), Some("h100-ndr"));
        assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
        assert_eq!(plan.warnings[0].kind, WarningKind::Dra);
        assert_eq!(
            plan.warnings[0].message,
            "DRA claim railguard-h100-ndr-8-rails: node affinity, rdma/rdma_shared_device_a and networks left to DRA"
        );
    }
}

#[test]
fn a_gpu_pod_with_a_claim_of_its_rails_is_left_to_dra_too() {
    // nvidia.com/gpu from the device plugin (or DRA's extended resource) and the rails'
    // claim: still DRA's to place.
    let mut p = pytorch_worker();
    p.spec.as_mut().unwrap().resource_claims = Some(vec![serde_json::from_value(
        json!({"name": "rails", "resourceClaimTemplateName": "railguard-h100-ndr-64-rails"}),
    )
    .unwrap()]);
    let (plan, out) = run(&p, &ns("ml"), &profiles());
    assert!(plan.mutations.contains(&Mutation::DraClaims));
    assert!(!plan.mutations.contains(&Mutation::Affinity));
    assert!(!plan.mutations.contains(&Mutation::Rdma));
    assert!(required_terms(&out).is_empty());
}

#[test]
fn claims_that_are_not_a_profiles_aligned_rails_change_nothing() {
    let base = mutate(&pytorch_worker(), &ns("ml"), &profiles(), &cfg()).unwrap();
    for source in [
        "railguard-h100-ndr-65-rails",
        "railguard-h100-ndr-0-rails",
        "railguard-b200-xdr-8-rails",
        "railguard-h100-ndr-gpu",
        "gpus-8",
    ] {
        let mut p = pytorch_worker();
        p.spec.as_mut().unwrap().resource_claims = Some(vec![serde_json::from_value(
            json!({"name": "rails", "resourceClaimTemplateName": source}),
        )
        .unwrap()]);
        let plan = mutate(&p, &ns("ml"), &profiles(), &cfg()).unwrap();
        assert_eq!(
            plan, base,
            "{source}: the same decision, operation for operation"
        );
        // Without GPUs such a claim does not make a training pod.
        let q = dra_worker(source, false);
        let plan = mutate(&q, &ns("ml"), &profiles(), &cfg()).unwrap();
        assert_eq!(plan.outcome, Outcome::NotTraining, "{source}");
        assert!(plan.ops.is_empty() && plan.warnings.is_empty(), "{source}");
    }
}

#[test]
fn a_claim_names_the_profile_of_a_pod_that_says_nothing_else() {
    // h100-ndr is the default; the claim is a100-hdr's.
    let p = dra_worker("railguard-a100-hdr-4-rails", false);
    let (plan, out) = run(&p, &ns("ml"), &profiles());
    assert_eq!(plan.profile.as_deref(), Some("a100-hdr"));
    assert!(plan.mutations.contains(&Mutation::DraClaims));
    assert!(required_terms(&out).is_empty());
    assert_eq!(annotation(&out, "railguard.io/profile"), Some("a100-hdr"));
    // Also where no profile is the default.
    let no_default = vec![profile(A100), profile(ROCE)];
    let (plan, _) = run(&p, &ns("ml"), &no_default);
    assert_eq!(plan.profile.as_deref(), Some("a100-hdr"));
    assert_eq!(plan.outcome, Outcome::Mutated);
}

#[test]
fn a_claim_of_another_profiles_rails_is_not_left_to_dra() {
    // The pod names h100-ndr but claims a100-hdr's rails: it is configured for h100-ndr in
    // full (affinity, RDMA) and told.
    let mut p = dra_worker("railguard-a100-hdr-8-rails", false);
    p.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("railguard.io/profile".into(), "h100-ndr".into());
    let (plan, out) = run(&p, &ns("ml"), &profiles());
    assert_eq!(plan.profile.as_deref(), Some("h100-ndr"));
    assert!(!plan.mutations.contains(&Mutation::DraClaims));
    assert!(plan.mutations.contains(&Mutation::Affinity));
    assert!(!required_terms(&out).is_empty());
    let w = profile_mismatches(&plan);
    assert_eq!(w.len(), 1, "{:?}", plan.warnings);
    assert_eq!(
        w[0].message,
        "claim railguard-a100-hdr-8-rails is profile a100-hdr's rails but profile h100-ndr applies: not left to DRA"
    );
    // A selector that picks a pool wins over the claim the same way.
    let mut q = dra_worker("railguard-a100-hdr-8-rails", false);
    q.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([(
        "node.kubernetes.io/instance-type".to_string(),
        "gpu-8x-roce".to_string(),
    )]));
    let plan = mutate(&q, &ns("ml"), &profiles(), &cfg()).unwrap();
    assert_eq!(plan.profile.as_deref(), Some("roce-cloud"));
    assert!(!plan.mutations.contains(&Mutation::DraClaims));
}

#[test]
fn a_claimed_profile_whose_pool_the_pod_rules_out_is_not_applied() {
    let mut p = dra_worker("railguard-a100-hdr-8-rails", false);
    p.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([(
        "nvidia.com/gpu.product".to_string(),
        "NVIDIA-H200".to_string(),
    )]));
    let plan = mutate(&p, &ns("ml"), &profiles(), &cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::NoProfile);
    assert!(plan.ops.is_empty());
    assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
    assert!(
        plan.warnings[0]
            .message
            .starts_with("pod's own nvidia.com/gpu.product rules out claimed profile a100-hdr"),
        "{}",
        plan.warnings[0].message
    );
}

#[test]
fn an_audited_dra_pod_records_the_decision() {
    let p = dra_worker("railguard-h100-ndr-2-rails", false);
    let plan = mutate(&p, &ns("ml"), &profiles(), &audit_cfg()).unwrap();
    assert_eq!(plan.outcome, Outcome::AuditMutate);
    let (_, record) = audited(&p, &plan);
    let mutations = record["mutations"].to_string();
    assert!(mutations.contains("dra-claims"), "{record}");
    assert!(
        !mutations.contains("affinity") && !mutations.contains("rdma"),
        "{record}"
    );
    assert!(plan.warnings.iter().any(|w| w.kind == WarningKind::Dra));
}
