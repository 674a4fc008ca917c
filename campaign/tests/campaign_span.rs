//! A campaign's log lines carry where they come from: the `campaign` span (profile, node
//! count), the round's `campaign_round` and the pair test's `campaign_pair` with both node
//! names. A test binary of its own: the subscriber is the process' global one, set before
//! any span exists, so no other test's thread can cache a callsite as uninteresting first.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use railguard_campaign::coordinator::{run_campaign, CampaignNode, CampaignSettings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_tests_failure_is_logged_inside_its_campaign_round_and_pair_spans() {
    let log = tempfile::NamedTempFile::new().unwrap();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(log.reopen().unwrap())
        .init();

    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/fixtures/profiles/dgx-h100-ndr.yaml");
    let profile = railguard_api::profiles_from_yaml(&std::fs::read_to_string(path).unwrap())
        .unwrap()
        .remove(0);
    let mut settings = CampaignSettings::from_profile(&profile, &[7u8; 32]).unwrap();
    settings.io_timeout = Duration::from_millis(300);
    settings.test_timeout = Duration::from_secs(1);
    // Endpoints that refuse connections: every pair test fails to start, and says so.
    let nodes: Vec<CampaignNode> = (1..=3)
        .map(|i| CampaignNode {
            name: format!("node-{i}"),
            endpoint: format!("127.0.0.1:{i}"),
        })
        .collect();
    let report = run_campaign(&nodes, &settings, jiff::Timestamp::now())
        .await
        .unwrap();
    let first = &report.tests[0];

    let text = std::fs::read_to_string(log.path()).unwrap();
    let campaign = format!("campaign{{profile={} nodes=3}}", profile.name());
    let pair = format!(
        "campaign_pair{{initiator={} responder={}}}",
        first.initiator, first.responder
    );
    assert!(
        text.lines().any(|l| l.contains(&format!(
            "{campaign}:campaign_round{{round=1 tests={}}}",
            report.tests.iter().filter(|t| t.round == 1).count()
        )) && l.contains("campaign round")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.contains(&campaign)
            && l.contains(&pair)
            && l.contains("pair test without a result")),
        "{text}"
    );
}
