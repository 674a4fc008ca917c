//! Every admission's log lines are in an `admission` span naming the request (uid,
//! namespace, pod, user). A test binary of its own: the subscriber is the process' global
//! one, set before any span exists, so no other test's thread can cache a callsite as
//! uninteresting first.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use railguard_webhook::FailureMode;

#[tokio::test]
async fn an_admissions_log_lines_carry_its_request_in_the_admission_span() {
    let log = tempfile::NamedTempFile::new().unwrap();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(log.reopen().unwrap())
        .init();
    let ca = Ca::new("span-ca");
    let (cert, key) = ca.serving_pair();
    let volume = SecretVolume::new(&cert, &key);
    let server = start(&volume, FailureMode::Open).await;
    let review = gpu_sample();
    let (status, body) = post_json(&client(&ca.pem()), server.addr, "/mutate", &review).await;
    assert_eq!(status, 200, "{body}");

    let text = std::fs::read_to_string(log.path()).unwrap();
    let request = &review["request"];
    let span = format!(
        "admission{{uid={} namespace=\"{}\" pod=\"{}\" user={}}}",
        request["uid"].as_str().unwrap(),
        request["namespace"].as_str().unwrap_or(""),
        request["name"].as_str().unwrap_or(""),
        request["userInfo"]["username"].as_str().unwrap(),
    );
    assert!(
        text.lines()
            .any(|l| l.contains(&span) && l.contains("outcome=")),
        "no line in {span}:\n{text}"
    );
}
