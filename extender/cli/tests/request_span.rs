//! Every scheduling call logs inside an `extender_request` span. A test binary of its own:
//! the subscriber is the process' global one, set before any span is created, so no other
//! test's thread can cache a callsite as uninteresting first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serving::{h100_pod, post, standalone, start};
use common::*;
use serde_json::Value;

#[tokio::test]
async fn every_scheduling_call_logs_inside_an_extender_request_span() {
    let log = tempfile::NamedTempFile::new().unwrap();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(log.reopen().unwrap())
        .init();
    let r = start(standalone()).await;
    let mut args: Value = serde_json::from_str(ARGS_NAMES).unwrap();
    args["Pod"] = h100_pod();
    let (status, _) = post(&r, "/filter", args.to_string()).await;
    assert_eq!(status, 200);
    let (status, _) = post(&r, "/filter", "{not json").await;
    assert_eq!(status, 400);
    let text = std::fs::read_to_string(log.path()).unwrap();
    let names = args["NodeNames"].as_array().map_or(0, Vec::len);
    assert!(
        text.contains(&format!(
            "extender_request{{verb=\"filter\" mode=\"names\" nodes={names}}}"
        )),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("extender_request{verb=\"filter\"}")
                && l.contains("filter request failed")),
        "{text}"
    );
}
