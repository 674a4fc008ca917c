//! The baseline, outlier and drift rules over generated fleets.

use super::*;
use railguard_api::fleet::FleetSpec;

const RAILS: usize = 8;

fn rail(i: usize) -> String {
    format!("mlx5_{i}:1")
}

/// A certified node whose rails measure `bw` Gb/s (with a small deterministic wobble) and
/// whose NCCL plateau is `busbw`.
fn node(name: &str, bw: f64, busbw: f64, seed: u64) -> FleetNode {
    let mut figures = Figures::new();
    for i in 0..RAILS {
        // ±0.3%: the run-to-run noise of a healthy rail.
        let wobble = 1.0 + (((seed * 31 + i as u64 * 17) % 7) as f64 - 3.0) / 1000.0;
        figures.insert(
            Measurement::rail(MeasurementKind::WriteBwHost, rail(i)),
            bw * wobble,
        );
        figures.insert(
            Measurement::rail(MeasurementKind::WriteBwGpu, rail(i)),
            bw * 0.98 * wobble,
        );
        figures.insert(
            Measurement::rail(MeasurementKind::Latency, rail(i)),
            2.5 * wobble,
        );
    }
    figures.insert(Measurement::node(MeasurementKind::BusbwPlateau), busbw);
    FleetNode {
        name: name.to_string(),
        state: "certified",
        certified: true,
        figures,
        healthy_rails: RAILS,
    }
}

fn fleet(n: usize, bw: f64) -> Vec<FleetNode> {
    (0..n)
        .map(|i| node(&format!("gpu-{i:03}"), bw, 360.0, i as u64))
        .collect()
}

fn host(r: usize) -> Measurement {
    Measurement::rail(MeasurementKind::WriteBwHost, rail(r))
}

#[test]
fn a_uniform_fleet_has_a_baseline_and_no_outlier() {
    let a = analyze_fleet("h100", &FleetSpec::default(), fleet(64, 384.0));
    assert_eq!(a.certified, 64);
    assert!(a.no_baseline.is_none());
    assert!(a.outliers.is_empty(), "{:?}", a.outliers);
    assert!(a.split.is_empty());
    let b = &a.baseline[&host(3)];
    assert!((b.median - 384.0).abs() < 1.0, "{b:?}");
    // The wobble is far below the 1% floor: the floor is the spread.
    assert!((b.spread - b.median * 0.01).abs() < 1e-9, "{b:?}");
}

#[test]
fn one_slow_rail_among_64_nodes_marks_that_node_only() {
    let mut nodes = fleet(64, 384.0);
    *nodes[17].figures.get_mut(&host(5)).expect("rail") *= 0.85;
    let a = analyze_fleet("h100", &FleetSpec::default(), nodes);
    assert_eq!(
        a.outliers.keys().collect::<Vec<_>>(),
        vec!["gpu-017"],
        "{:?}",
        a.outliers
    );
    let marks = &a.outliers["gpu-017"];
    assert_eq!(marks.len(), 1);
    assert_eq!(marks[0].measurement, host(5));
    assert!((marks[0].worse_percent() - 15.0).abs() < 0.5, "{marks:?}");
    let text = marks[0].to_string();
    assert!(
        text.starts_with("rail mlx5_5:1 writeBwHost 326.")
            && text.contains("% below the fleet median 384."),
        "{text}"
    );
}

#[test]
fn higher_latency_is_the_worse_side() {
    let mut nodes = fleet(20, 384.0);
    let lat = Measurement::rail(MeasurementKind::Latency, rail(0));
    *nodes[3].figures.get_mut(&lat).expect("rail") *= 1.5;
    // Lower latency than the fleet is not blame.
    *nodes[4].figures.get_mut(&lat).expect("rail") *= 0.5;
    let a = analyze_fleet("h100", &FleetSpec::default(), nodes);
    assert_eq!(a.outliers.keys().collect::<Vec<_>>(), vec!["gpu-003"]);
    assert!(a.outliers["gpu-003"][0]
        .to_string()
        .contains("above the fleet median"));
}

#[test]
fn a_fleet_wide_drop_is_drift_and_marks_nobody() {
    let spec = FleetSpec::default();
    let t0 = Timestamp::from_second(1_800_000_000).expect("time");
    let before = analyze_fleet("h100", &spec, fleet(64, 384.0));
    let mut history = Vec::new();
    for h in 0..5 {
        let at = t0 + jiff::SignedDuration::from_hours(h);
        history = record_snapshot(&spec, &history, &before, at);
    }
    assert_eq!(history.len(), 5);
    let after = analyze_fleet("h100", &spec, fleet(64, 384.0 * 0.9));
    assert!(after.outliers.is_empty(), "{:?}", after.outliers);
    let status = fleet_status(
        &spec,
        &after,
        &history,
        t0 + jiff::SignedDuration::from_hours(6),
    );
    let drifted: Vec<&str> = status
        .drift
        .iter()
        .map(|d| d.measurement.as_str())
        .collect();
    // Every rail's host and GPU bandwidth dropped; latency and busbw did not move.
    assert_eq!(drifted.len(), 2 * RAILS, "{drifted:?}");
    assert!(
        drifted.iter().all(|m| m.starts_with("writeBw")),
        "{drifted:?}"
    );
    for d in &status.drift {
        assert!((d.worse_percent - 10.0).abs() < 0.5, "{d:?}");
    }
    assert_eq!(status.outliers, 0);
    assert_eq!(status.history.len(), 6);
}

#[test]
fn a_steady_fleet_has_no_drift() {
    let spec = FleetSpec::default();
    let t0 = Timestamp::from_second(1_800_000_000).expect("time");
    let a = analyze_fleet("h100", &spec, fleet(16, 384.0));
    let history = record_snapshot(&spec, &[], &a, t0);
    assert!(drift(&spec, &history, &medians(&a)).is_empty());
    // No history: nothing to drift from.
    assert!(drift(&spec, &[], &medians(&a)).is_empty());
}

#[test]
fn small_fleets_have_no_baseline() {
    let spec = FleetSpec::default();
    let mut nodes = fleet(7, 384.0);
    *nodes[2].figures.get_mut(&host(0)).expect("rail") *= 0.5;
    let a = analyze_fleet("h100", &spec, nodes);
    assert!(a.baseline.is_empty());
    assert!(a.outliers.is_empty());
    assert_eq!(
        a.no_baseline.as_deref(),
        Some("7 certified node(s), the baseline needs 8")
    );
    // Uncertified nodes do not count towards the minimum.
    let mut nodes = fleet(8, 384.0);
    nodes[0].certified = false;
    nodes[0].state = "degraded";
    assert!(analyze_fleet("h100", &spec, nodes).no_baseline.is_some());
    // Nor is a small fleet's history recorded.
    let t0 = Timestamp::from_second(1_800_000_000).expect("time");
    assert!(record_snapshot(&spec, &[], &a, t0).is_empty());
}

#[test]
fn half_a_fleet_is_never_marked() {
    // A roll-out half done: 24 of 64 nodes 12% slower on every rail.
    let mut nodes = fleet(64, 384.0);
    for n in nodes.iter_mut().take(24) {
        for (m, v) in n.figures.iter_mut() {
            if m.kind == MeasurementKind::WriteBwHost {
                *v *= 0.88;
            }
        }
    }
    let a = analyze_fleet("h100", &FleetSpec::default(), nodes);
    assert!(a.outliers.is_empty(), "{:?}", a.outliers.keys());
    assert_eq!(a.split.len(), RAILS);
    assert!(a.split.iter().all(|(_, n)| *n == 24));
}

#[test]
fn uncertified_nodes_are_listed_but_neither_counted_nor_marked() {
    let mut nodes = fleet(10, 384.0);
    let mut bad = node("gpu-bad", 100.0, 100.0, 3);
    bad.certified = false;
    bad.state = "failed";
    nodes.push(bad);
    let a = analyze_fleet("h100", &FleetSpec::default(), nodes);
    assert_eq!(a.certified, 10);
    assert!(a.outliers.is_empty());
    assert_eq!(a.nodes.len(), 11);
    assert!((a.baseline[&host(0)].median - 384.0).abs() < 1.0);
}

#[test]
fn history_keeps_one_snapshot_per_interval_and_at_most_the_depth() {
    let spec = FleetSpec {
        history_depth: 3,
        history_interval_seconds: 60,
        ..FleetSpec::default()
    };
    let a = analyze_fleet("h100", &spec, fleet(8, 384.0));
    let t0 = Timestamp::from_second(1_800_000_000).expect("time");
    let mut h = record_snapshot(&spec, &[], &a, t0);
    h = record_snapshot(&spec, &h, &a, t0 + jiff::SignedDuration::from_secs(30));
    assert_eq!(h.len(), 1, "within the interval: no new snapshot");
    for i in 1..=5 {
        h = record_snapshot(&spec, &h, &a, t0 + jiff::SignedDuration::from_secs(60 * i));
    }
    assert_eq!(h.len(), 3);
    assert_eq!(h[2].at.0, t0 + jiff::SignedDuration::from_secs(300));
}

#[test]
fn measurements_read_rails_nccl_and_pair_tests_and_skip_junk() {
    let text = r#"{"version":1,"generation":1,"issuedAt":"2026-12-01T00:00:00Z",
      "expiresAt":"2026-12-02T00:00:00Z","profile":"p","signature":"s","verdict":"certified",
      "rails":[{"hca":"mlx5_0","port":1,"state":"ACTIVE","writeBwHostGbps":384.5,
                "writeBwGpuGbps":370.0,"latencyUs":2.4,"verdict":"healthy"},
               {"hca":"mlx5_1","port":1,"state":"DOWN","writeBwHostGbps":0.0,"verdict":"failed"}],
      "nccl":{"busbwPlateauGBps":361.0},
      "ncclPairs":[{"peer":"b","busbwGBps":300.0,"ok":true},{"peer":"c","busbwGBps":320.0,"ok":true},
                   {"peer":"b","rail":"mlx5_0:1","busbwGBps":45.0,"ok":true}]}"#;
    let cert = Certificate::from_annotation(text).expect("certificate");
    let f = measurements(&cert);
    let keys: Vec<String> = f.keys().map(ToString::to_string).collect();
    assert_eq!(
        keys,
        [
            "writeBwHost/mlx5_0:1",
            "writeBwGpu/mlx5_0:1",
            "latency/mlx5_0:1",
            "busbwPlateau",
            "pairBusbw",
            "pairBusbw/mlx5_0:1"
        ]
    );
    assert_eq!(f[&Measurement::node(MeasurementKind::PairBusbw)], 310.0);
    for k in &keys {
        assert!(kind_of_key(k).is_some(), "{k}");
    }
}

#[test]
fn the_table_names_the_outlier_and_its_rail() {
    let mut nodes = fleet(12, 384.0);
    *nodes[4].figures.get_mut(&host(2)).expect("rail") *= 0.85;
    let a = analyze_fleet("h100", &FleetSpec::default(), nodes);
    let t = report::table(&a);
    assert!(
        t.starts_with("profile h100: 12 certified node(s), 1 outlier(s)\n"),
        "{t}"
    );
    let line = t.lines().find(|l| l.starts_with("gpu-004")).expect("row");
    assert!(line.contains("yes") && line.contains("85."), "{line}");
    assert!(t.contains("rail mlx5_2:1 writeBwHost"), "{t}");
    let rows = report::rows(&a);
    assert_eq!(rows.len(), 12);
    assert!(rows[4].worst_distance.expect("distance") < -10.0);
    assert!(rows[0].worst_distance.expect("distance") > -1.0);
}

#[test]
fn the_condition_names_the_worst_marks_and_events_follow_transitions() {
    use marks::mark_event;
    let node_condition = |a: &FleetAnalysis, name: &str| {
        marks::node_condition(a, a.nodes.iter().find(|n| n.name == name))
    };
    let mut nodes = fleet(12, 384.0);
    *nodes[4].figures.get_mut(&host(2)).expect("rail") *= 0.85;
    nodes[7].certified = false;
    nodes[7].state = "degraded";
    let a = analyze_fleet("h100", &FleetSpec::default(), nodes);
    let slow = node_condition(&a, "gpu-004");
    assert_eq!((slow.status, slow.reason), ("True", "FleetOutlier"));
    assert!(
        slow.message.starts_with("rail mlx5_2:1 writeBwHost ")
            && slow.message.ends_with("(profile h100, 11 certified nodes)"),
        "{}",
        slow.message
    );
    let fine = node_condition(&a, "gpu-000");
    assert_eq!((fine.status, fine.reason), ("False", "WithinFleetBaseline"));
    let degraded = node_condition(&a, "gpu-007");
    assert_eq!(
        (degraded.status, degraded.reason),
        ("Unknown", "NoFleetBaseline")
    );
    assert!(
        degraded.message.contains("degraded"),
        "{}",
        degraded.message
    );

    let ev = mark_event(None, &slow).expect("an outlier is news");
    assert_eq!((ev.kind, ev.reason), ("Warning", "FleetOutlier"));
    assert_eq!(ev.message, slow.message);
    assert!(
        mark_event(Some("True"), &slow).is_none(),
        "still an outlier: no news"
    );
    let cleared = mark_event(Some("True"), &fine).expect("cleared is news");
    assert_eq!(
        (cleared.kind, cleared.reason),
        ("Normal", "FleetOutlierCleared")
    );
    assert!(mark_event(Some("False"), &fine).is_none());
    assert!(mark_event(None, &degraded).is_none());

    let small = analyze_fleet("h100", &FleetSpec::default(), fleet(3, 384.0));
    let c = node_condition(&small, "gpu-000");
    assert_eq!(c.status, "Unknown");
    assert_eq!(
        c.message,
        "profile h100 has no fleet baseline: 3 certified node(s), the baseline needs 8"
    );
}

#[test]
fn rails_are_listed_in_natural_order() {
    let mut n = node("a", 384.0, 360.0, 1);
    for r in ["mlx5_10:1", "mlx5_2:1", "mlx5_1:2"] {
        n.figures
            .insert(Measurement::rail(MeasurementKind::WriteBwHost, r), 1.0);
    }
    let a = analyze_fleet("h100", &FleetSpec::default(), vec![n]);
    let rails = report::rails(&a);
    let pos = |r: &str| rails.iter().position(|x| x == r).expect(r);
    assert!(pos("mlx5_0:1") < pos("mlx5_1:1"));
    assert!(pos("mlx5_1:1") < pos("mlx5_1:2"));
    assert!(pos("mlx5_2:1") < pos("mlx5_7:1"));
    assert!(pos("mlx5_7:1") < pos("mlx5_10:1"));
    assert_eq!(rails.len(), RAILS + 2);
}

#[test]
fn the_consistent_rail_count_is_the_fewest_healthy_rails_of_a_certified_node() {
    let t0 = Timestamp::from_second(1_800_000_000).expect("time");
    let spec = FleetSpec::default();
    let mut nodes = fleet(3, 384.0);
    nodes[1].healthy_rails = 7;
    // A node that takes no jobs does not lower what the job's nodes can all give.
    nodes[2].certified = false;
    nodes[2].state = "failed";
    nodes[2].healthy_rails = 2;
    // Fewer nodes than a baseline needs: the count is still published.
    let a = analyze_fleet("h100", &spec, nodes);
    assert!(a.no_baseline.is_some());
    assert_eq!(a.consistent_rail_count, Some(7));
    let status = fleet_status(&spec, &a, &[], t0);
    assert_eq!(status.consistent_rail_count, Some(7));
    let json = serde_json::to_value(&status).expect("json");
    assert_eq!(json["consistentRailCount"], 7);
    // Without a certified node there is no count at all, not a zero.
    let mut none = fleet(2, 384.0);
    for n in &mut none {
        n.certified = false;
    }
    let status = fleet_status(&spec, &analyze_fleet("h100", &spec, none), &[], t0);
    assert_eq!(status.consistent_rail_count, None);
    assert!(serde_json::to_value(&status).expect("json")["consistentRailCount"].is_null());
}
