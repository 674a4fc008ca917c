//! The GID a rail's RDMA tests run on reaches the certificate: on a simulated RoCE node
//! (mlx5's GID table: a v1 and a v2 entry per address, link-local first) the simulated engine
//! chooses as the verbs engine does, NCCL's IPv4 RoCE v2 entry (index 3), and certification
//! records it as `rails[].gidIndex`.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use railguard_prober::certify::run::bench_rails;
use railguard_prober::progress::NoProgress;
use railguard_sim::node::rdma_model;
use railguard_sim::rdma::SimulatedRdmaEngine;
use railguard_sim::NodeModel;

fn manifest(p: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../prober")).join(p)
}

#[tokio::test]
async fn roce_rails_are_benchmarked_on_nccls_v2_gid_and_the_certificate_says_which() {
    let model = NodeModel::load(&manifest("models/roce-cloud.yaml")).unwrap();
    let text =
        std::fs::read_to_string(manifest("../api/fixtures/profiles/roce-cloud.yaml")).unwrap();
    let profile = railguard_api::profiles_from_yaml(&text).unwrap().remove(0);
    let engine = SimulatedRdmaEngine::new(rdma_model(&model, "node-a")).unwrap();
    let benches = bench_rails(Arc::new(engine), &profile.spec, &[], Arc::new(NoProgress)).await;
    assert_eq!(benches.len(), profile.spec.rails.len());
    for b in &benches {
        assert_eq!(b.error, None, "{}:{}", b.hca, b.port);
        assert_eq!(
            b.gid_index,
            Some(3),
            "{}:{}: the IPv4 RoCE v2 entry",
            b.hca,
            b.port
        );
    }
    // Serialized as the certificate carries it.
    let rail = railguard_api::RailResult {
        gid_index: benches[0].gid_index,
        ..serde_json::from_value(serde_json::json!({
            "hca": "mlx5_0", "port": 1, "verdict": "healthy"}))
        .unwrap()
    };
    assert_eq!(serde_json::to_value(&rail).unwrap()["gidIndex"], 3);
}
