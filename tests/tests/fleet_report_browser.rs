//! The fleet's HTML report as a browser reads it: a generated fleet of 24 nodes × 8 rails,
//! one node 15% slow on one rail, rendered by `railguard_fleet::html`, loaded in
//! headless Chromium (`--dump-dom`); the assertions are on the DOM Chromium built. Then a
//! screenshot: `RAILGUARD_UPDATE_DOCS=1` writes it to docs/fleet-report.png.

use std::collections::BTreeMap;
use std::path::Path;

use railguard_api::fleet::FleetSpec;
use railguard_fleet::{
    analyze_fleet, html::render_html, Figures, FleetNode, Measurement, MeasurementKind,
};
use railguard_tests::chromium;

const NODES: usize = 24;
const RAILS: usize = 8;
const SLOW_NODE: &str = "gpu-013";
const SLOW_RAIL: &str = "mlx5_5:1";
const SHOT: (u32, u32) = (1200, 900);

fn rail(i: usize) -> String {
    format!("mlx5_{i}:1")
}

/// Healthy nodes within ±0.3% of 384 Gb/s per rail and ±1% of 360 GB/s busbw; the slow
/// node's slow rail at 85%.
fn fleet() -> Vec<FleetNode> {
    (0..NODES)
        .map(|n| {
            let name = format!("gpu-{n:03}");
            let mut figures = Figures::new();
            for r in 0..RAILS {
                let wobble = 1.0 + (((n * 31 + r * 17) % 7) as f64 - 3.0) / 1000.0;
                let slow = if name == SLOW_NODE && rail(r) == SLOW_RAIL {
                    0.85
                } else {
                    1.0
                };
                figures.insert(
                    Measurement::rail(MeasurementKind::WriteBwHost, rail(r)),
                    384.0 * wobble * slow,
                );
                figures.insert(
                    Measurement::rail(MeasurementKind::WriteBwGpu, rail(r)),
                    376.0 * wobble * slow,
                );
                figures.insert(
                    Measurement::rail(MeasurementKind::Latency, rail(r)),
                    2.4 * wobble,
                );
            }
            figures.insert(
                Measurement::node(MeasurementKind::BusbwPlateau),
                360.0 * (1.0 + ((n * 7) % 9) as f64 / 450.0 - 0.01),
            );
            FleetNode {
                name,
                state: "certified",
                certified: true,
                figures,
                healthy_rails: RAILS,
            }
        })
        .collect()
}

/// The start tags named `name` in a serialized DOM, with their attributes.
fn tags(dom: &str, name: &str) -> Vec<BTreeMap<String, String>> {
    let open = format!("<{name}");
    let mut out = Vec::new();
    for (i, _) in dom.match_indices(&open) {
        let rest = &dom[i + open.len()..];
        if !rest.starts_with([' ', '>', '/']) {
            continue;
        }
        let Some(end) = rest.find('>') else { continue };
        out.push(attributes(&rest[..end]));
    }
    out
}

/// `a="x" b="y"` as Chromium serializes attributes (always double-quoted).
fn attributes(mut s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while let Some(eq) = s.find("=\"") {
        let key = s[..eq].trim().to_string();
        let rest = &s[eq + 2..];
        let Some(close) = rest.find('"') else { break };
        let value = rest[..close]
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&");
        out.insert(key, value);
        s = &rest[close + 1..];
    }
    out
}

fn has_class(tag: &BTreeMap<String, String>, class: &str) -> bool {
    tag.get("class")
        .is_some_and(|c| c.split_whitespace().any(|c| c == class))
}

/// The section of the DOM inside `<svg class="{class}" ...> ... </svg>`.
fn svg_section<'a>(dom: &'a str, class: &str) -> Option<&'a str> {
    let start = dom.find(&format!("<svg class=\"{class}\""))?;
    let end = start + dom[start..].find("</svg>")?;
    Some(&dom[start..end])
}

fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

#[test]
fn chromium_sees_one_cell_per_node_and_rail_and_the_slow_rail_marked() {
    let analysis = analyze_fleet("h100-sxm", &FleetSpec::default(), fleet());
    assert_eq!(
        analysis.outliers.keys().collect::<Vec<_>>(),
        vec![SLOW_NODE],
        "{:?}",
        analysis.outliers
    );
    let at = jiff::Timestamp::from_second(1_796_083_200).expect("time");
    let html = render_html(std::slice::from_ref(&analysis), at);
    let dir = tempfile::tempdir().expect("temp dir");
    let page = dir.path().join("fleet-report.html");
    std::fs::write(&page, &html).expect("write page");

    let dom = chromium::dump_dom(&page).expect("chromium --dump-dom");
    assert!(
        !dom.to_lowercase().contains("<script"),
        "a script in the DOM"
    );

    // One heatmap cell per node × rail, each pair once.
    let cells: Vec<_> = tags(&dom, "rect")
        .into_iter()
        .filter(|t| has_class(t, "cell"))
        .collect();
    assert_eq!(cells.len(), NODES * RAILS, "cells in the DOM");
    let mut pairs: BTreeMap<(String, String), usize> = BTreeMap::new();
    for c in &cells {
        *pairs
            .entry((c["data-node"].clone(), c["data-rail"].clone()))
            .or_default() += 1;
    }
    assert_eq!(pairs.len(), NODES * RAILS);
    assert!(pairs.values().all(|n| *n == 1));
    for n in 0..NODES {
        for r in 0..RAILS {
            assert!(pairs.contains_key(&(format!("gpu-{n:03}"), rail(r))));
        }
    }

    // Exactly the slow node's slow rail is marked, at about 85% of the median.
    let marked: Vec<_> = cells
        .iter()
        .filter(|c| c.get("data-outlier").map(String::as_str) == Some("true"))
        .collect();
    assert_eq!(marked.len(), 1, "{marked:?}");
    assert_eq!(marked[0]["data-node"], SLOW_NODE);
    assert_eq!(marked[0]["data-rail"], SLOW_RAIL);
    let rel: f64 = marked[0]["data-relative"].parse().expect("relative");
    assert!((rel - 0.85).abs() < 0.01, "{rel}");
    assert!(cells
        .iter()
        .filter(|c| c["data-node"] != SLOW_NODE || c["data-rail"] != SLOW_RAIL)
        .all(|c| c["data-outlier"] == "false"
            && c["data-relative"]
                .parse::<f64>()
                .is_ok_and(|r| (r - 1.0).abs() < 0.01)));

    // The busbw histogram: every node counted once, the median drawn.
    let hist = svg_section(&dom, "histogram").expect("busbw histogram in the DOM");
    let bars: Vec<_> = tags(hist, "rect")
        .into_iter()
        .filter(|t| has_class(t, "bar"))
        .collect();
    assert!(!bars.is_empty());
    let counted: usize = bars
        .iter()
        .map(|b| b["data-count"].parse::<usize>().expect("count"))
        .sum();
    assert_eq!(counted, NODES);
    let median = tags(hist, "line")
        .into_iter()
        .find(|t| has_class(t, "median"))
        .expect("median line");
    let m: f64 = median["data-median"].parse().expect("median");
    assert!((m - 360.0).abs() < 4.0, "{m}");

    // The outlier table names the node and its mark.
    assert!(
        dom.contains(&format!(
            "<tr><td>{SLOW_NODE}</td><td>rail {SLOW_RAIL} writeBwHost"
        )),
        "outlier table"
    );

    // A screenshot of what an operator sees.
    let png = dir.path().join("fleet-report.png");
    chromium::screenshot(&page, &png, SHOT.0, SHOT.1).expect("chromium --screenshot");
    assert_eq!(png_size(&std::fs::read(&png).expect("png")), SHOT);
    if std::env::var_os("RAILGUARD_UPDATE_DOCS").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/fleet-report.png");
        std::fs::copy(&png, &docs).expect("copy the screenshot into docs");
    }
}
