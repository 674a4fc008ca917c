//! Progress of a campaign: each round is planned, each pair test a step.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use railguard_prober::progress::RecordingProgress;

fn profile() -> railguard_api::FabricProfile {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/fixtures/profiles/dgx-h100-ndr.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    railguard_api::profiles_from_yaml(&text).unwrap().remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_campaign_round_is_planned_and_each_pair_test_is_a_step() {
    use railguard_campaign::coordinator::{run_campaign_with, CampaignNode, CampaignSettings};
    let p = profile();
    let mut settings = CampaignSettings::from_profile(&p, &[7u8; 32]).unwrap();
    settings.io_timeout = Duration::from_millis(300);
    settings.test_timeout = Duration::from_secs(1);
    // Endpoints that refuse connections: every test is inconclusive, quickly.
    let nodes: Vec<CampaignNode> = (1..=4)
        .map(|i| CampaignNode {
            name: format!("node-{i}"),
            endpoint: format!("127.0.0.1:{i}"),
        })
        .collect();
    let progress = RecordingProgress::default();
    let report = run_campaign_with(&nodes, &settings, jiff::Timestamp::now(), &progress)
        .await
        .unwrap();
    let events = progress.events();
    let planned: u64 = events
        .iter()
        .filter_map(|e| e.strip_prefix("plan "))
        .map(|n| n.parse::<u64>().unwrap())
        .sum();
    assert_eq!(planned as usize, report.tests.len(), "{events:?}");
    assert_eq!(
        events.iter().filter(|e| *e == "done").count(),
        report.tests.len()
    );
    assert!(
        events.iter().any(|e| e.starts_with("step round 1: ")),
        "{events:?}"
    );
}
