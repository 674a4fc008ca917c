//! `mutate()` on an 8-GPU, 3-container pod (trainer + two sidecars), against the DGX H100
//! profile; plus the whole review path (decode, mutate, encode) for context.
//!
//! Run: `cargo bench -p railguard-webhook --bench mutate`

#![allow(clippy::expect_used, clippy::unwrap_used)] // bench harness: a failed setup should abort loudly

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use k8s_openapi::api::core::v1::Pod;
use railguard_webhook::review;
use railguard_webhook::{mutate, FailureMode, NamespaceInfo, WebhookConfig};
use serde_json::json;

const H100: &str = include_str!("../../api/fixtures/profiles/dgx-h100-ndr.yaml");

fn pod() -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "llama-worker-3", "namespace": "ml",
            "labels": {"training.kubeflow.org/job-name": "llama", "training.kubeflow.org/replica-type": "worker"}},
        "spec": {
            "containers": [
                {"name": "pytorch", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                 "command": ["torchrun", "--nnodes=16", "--nproc-per-node=8", "train.py"],
                 "env": [{"name": "MASTER_ADDR", "value": "llama-master-0"}, {"name": "MASTER_PORT", "value": "23456"}],
                 "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1600Gi"},
                               "requests": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1600Gi"}},
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "log-shipper", "image": "fluent/fluent-bit:3.0"},
                {"name": "dcgm-exporter", "image": "nvidia/dcgm-exporter:3.3.5", "resources": {"limits": {"cpu": "1"}}}
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "llama-data"}}]
        }
    })
}

fn bench(c: &mut Criterion) {
    let profiles = railguard_api::profiles_from_yaml(H100).expect("fixture profile");
    let config = WebhookConfig::default();
    let ns = NamespaceInfo::new("ml");
    let p: Pod = serde_json::from_value(pod()).expect("pod");
    let plan = mutate(&p, &ns, &profiles, &config).expect("plan");
    assert_eq!(
        plan.mutations.len(),
        5,
        "the bench must exercise a full mutation"
    );

    c.bench_function("mutate/8gpu-3container", |b| {
        b.iter(|| mutate(black_box(&p), black_box(&ns), black_box(&profiles), &config))
    });

    // Parts of the path, to see where the time goes.
    c.bench_function("parts/profile-signature", |b| {
        b.iter(|| black_box(&profiles[0]).spec.signature())
    });
    c.bench_function("parts/patch-write", |b| {
        b.iter(|| {
            let mut out = String::new();
            railguard_webhook::patch::write_patch(black_box(&plan.ops), &mut out);
            out
        })
    });
    let pod_json = serde_json::to_string(&pod()).expect("pod json");
    c.bench_function("parts/pod-decode", |b| {
        b.iter(|| serde_json::from_str::<Pod>(black_box(&pod_json)))
    });

    let body = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "0b7f8a2e-9d43-4c1e-8a51-0d7a5c1f2e11",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml", "operation": "CREATE", "object": pod()}
    }))
    .expect("review");
    c.bench_function("review/decode-mutate-encode", |b| {
        b.iter(|| {
            let req = review::decode(black_box(&body)).expect("decode");
            let a = review::admit(&req, &ns, &profiles, &config, FailureMode::Open);
            a.response.encode()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
