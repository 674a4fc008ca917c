//! The HTML report's structure, escaping and size over generated fleets.

use super::*;
use crate::{analyze_fleet, Figures, FleetNode};
use railguard_api::fleet::FleetSpec;

fn rail(i: usize) -> String {
    format!("mlx5_{i}:1")
}

fn host(r: usize) -> Measurement {
    Measurement::rail(MeasurementKind::WriteBwHost, rail(r))
}

fn node(name: &str, rails: usize, seed: usize) -> FleetNode {
    let mut figures = Figures::new();
    for i in 0..rails {
        let wobble = 1.0 + (((seed * 31 + i * 17) % 7) as f64 - 3.0) / 1000.0;
        figures.insert(host(i), 384.0 * wobble);
        figures.insert(
            Measurement::rail(MeasurementKind::Latency, rail(i)),
            2.5 * wobble,
        );
    }
    figures.insert(
        Measurement::node(MeasurementKind::BusbwPlateau),
        360.0 + (seed % 5) as f64,
    );
    FleetNode {
        name: name.to_string(),
        state: "certified",
        certified: true,
        figures,
        healthy_rails: rails,
    }
}

/// `n` nodes × `rails` rails, node `slow` 15% slow on rail 5.
fn fleet(n: usize, rails: usize, slow: Option<usize>) -> FleetAnalysis {
    let mut nodes: Vec<FleetNode> = (0..n)
        .map(|i| node(&format!("gpu-{i:04}"), rails, i))
        .collect();
    if let Some(s) = slow {
        *nodes[s].figures.get_mut(&host(5)).expect("rail") *= 0.85;
    }
    analyze_fleet("h100", &FleetSpec::default(), nodes)
}

fn at() -> Timestamp {
    Timestamp::from_second(1_800_000_000).expect("time")
}

/// The opening tags of `<rect class="cell" ...>`.
fn cells(html: &str) -> Vec<&str> {
    html.match_indices("<rect ")
        .filter_map(|(i, _)| {
            let tag = &html[i..i + html[i..].find('>')?];
            tag.contains(r#"class="cell""#).then_some(tag)
        })
        .collect()
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    Some(&tag[start..start + tag[start..].find('"')?])
}

#[test]
fn one_cell_per_node_and_rail_and_only_the_slow_rail_is_marked() {
    let a = fleet(24, 8, Some(7));
    assert_eq!(a.outliers.keys().collect::<Vec<_>>(), vec!["gpu-0007"]);
    let html = render_html(std::slice::from_ref(&a), at());
    let cells = cells(&html);
    assert_eq!(cells.len(), 24 * 8);
    let marked: Vec<(&str, &str)> = cells
        .iter()
        .filter(|c| attr(c, "data-outlier") == Some("true"))
        .map(|c| {
            (
                attr(c, "data-node").expect("node"),
                attr(c, "data-rail").expect("rail"),
            )
        })
        .collect();
    assert_eq!(marked, vec![("gpu-0007", "mlx5_5:1")]);
    assert!(cells
        .iter()
        .all(|c| matches!(attr(c, "data-outlier"), Some("true" | "false"))));
    let slow = cells
        .iter()
        .find(|c| attr(c, "data-outlier") == Some("true"))
        .expect("slow cell");
    let rel: f64 = attr(slow, "data-relative")
        .expect("relative")
        .parse()
        .expect("number");
    assert!((rel - 0.85).abs() < 0.005, "{slow}");
    assert_eq!(attr(slow, "fill"), Some(colour(rel).as_str()));
    // Its title names the node, the rail, the percentage and the mark.
    let title_at = html.find(slow).expect("cell") + slow.len();
    let title = &html[title_at..title_at + html[title_at..].find("</title>").expect("title")];
    assert!(
        title.contains(&format!(
            "gpu-0007 · mlx5_5:1: {:.1}% of the fleet median",
            rel * 100.0
        )) && title.contains("rail mlx5_5:1 writeBwHost"),
        "{title}"
    );
    // One visible outline, the histogram with its median and the table row.
    assert_eq!(html.matches(r#"<rect class="outline""#).count(), 2); // + the legend's swatch
    assert!(html.contains(r#"class="histogram""#));
    assert!(html.contains(r#"<line class="median""#));
    assert!(html.contains("<table class=\"outliers\">"));
    assert!(html.contains("<tr><td>gpu-0007</td><td>rail mlx5_5:1 writeBwHost"));
    assert!(html.contains("<li>24 node(s), 24 certified"), "{html}");
    assert!(html.contains("<li class=\"outliers\">1 outlier node(s)</li>"));
}

#[test]
fn a_small_fleet_says_why_it_has_no_baseline_and_its_cells_are_empty() {
    let a = fleet(5, 8, None);
    let html = render_html(&[a], at());
    assert!(
        html.contains("no baseline: 5 certified node(s), the baseline needs 8"),
        "{html}"
    );
    let cells = cells(&html);
    assert_eq!(cells.len(), 5 * 8);
    assert!(cells
        .iter()
        .all(|c| attr(c, "data-relative") == Some("") && attr(c, "data-outlier") == Some("false")));
    assert!(html.contains("no baseline median"));
    assert!(html.contains("No outlier marks."));
}

#[test]
fn a_split_measurement_is_listed() {
    let mut nodes: Vec<FleetNode> = (0..20).map(|i| node(&format!("n{i}"), 8, i)).collect();
    for n in nodes.iter_mut().take(8) {
        *n.figures.get_mut(&host(1)).expect("rail") *= 0.8;
    }
    let a = analyze_fleet("h100", &FleetSpec::default(), nodes);
    assert_eq!(a.split.len(), 1);
    let html = render_html(&[a], at());
    assert!(
        html.contains("split: writeBwHost/mlx5_1:1 would mark 8 nodes"),
        "{html}"
    );
}

#[test]
fn names_and_messages_are_escaped() {
    let evil = "<script>alert(\"x\")</script>&'";
    let mut nodes: Vec<FleetNode> = (0..10).map(|i| node(&format!("{evil}{i}"), 8, i)).collect();
    *nodes[3].figures.get_mut(&host(5)).expect("rail") *= 0.8;
    let mut a = analyze_fleet(evil, &FleetSpec::default(), nodes);
    a.split
        .push((Measurement::rail(MeasurementKind::Latency, evil), 9));
    let mut small = fleet(3, 8, None);
    small.no_baseline = Some(evil.to_string());
    let html = render_html(&[a, small], at());
    assert!(!html.to_lowercase().contains("<script"), "{html}");
    // Quotes need no escaping in text, only in attributes.
    assert!(html.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"));
    // The SVG crate's escaping: attributes and text.
    assert!(html
        .contains(r#"data-node="&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&apos;3""#));
    assert!(html.contains("&lt;script&gt;alert(\"x\")&lt;/script&gt;&amp;'3 · mlx5_5:1"));
    assert_eq!(cells(&html).len(), 13 * 8);
}

#[test]
fn the_page_has_no_script_and_loads_nothing() {
    let html = render_html(&[fleet(30, 8, Some(2)), fleet(9, 4, None)], at());
    let lower = html.to_lowercase();
    for banned in [
        "<script", "http://", "https://", "src=", "href=", "@import", "<link", "<iframe",
        "<object", "<embed", "<img", " on",
    ] {
        // " on": no event handler attribute (onload=, onclick=, ...) on any tag.
        if banned == " on" {
            for tag in html.split('<').skip(1) {
                let tag = &tag[..tag.find('>').unwrap_or(tag.len())];
                assert!(
                    !tag.split_whitespace().skip(1).any(|a| a.starts_with("on")),
                    "{tag}"
                );
            }
            continue;
        }
        assert!(!lower.contains(banned), "{banned}");
    }
    // The only url() is the legend's own gradient.
    assert!(lower
        .match_indices("url(")
        .all(|(i, _)| lower[i..].starts_with("url(#scale-")));
    assert!(html.contains("default-src 'none'"));
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(
        html.contains("generated 2027-01-15T08:00:00Z"),
        "{}",
        &html[..600]
    );
}

#[test]
fn the_colour_scale_diverges_around_the_median() {
    assert_eq!(colour(1.0), "#f7f7f7");
    assert_eq!(colour(SCALE_LOW), "#b2182b");
    assert_eq!(colour(0.5), "#b2182b");
    assert_eq!(colour(SCALE_HIGH), "#2166ac");
    assert_eq!(colour(2.0), "#2166ac");
    let red = |c: &str| u8::from_str_radix(&c[1..3], 16).expect("hex");
    let blue = |c: &str| u8::from_str_radix(&c[5..7], 16).expect("hex");
    // Monotone on each side.
    assert!(blue(&colour(0.9)) < blue(&colour(0.95)));
    assert!(red(&colour(1.02)) > red(&colour(1.04)));
}

#[test]
fn a_thousand_nodes_stay_readable_and_bounded() {
    let a = fleet(1000, 8, Some(500));
    let html = render_html(&[a], at());
    assert_eq!(cells(&html).len(), 8000);
    // Rows shrink to the minimum height and the node labels thin out to one per
    // LABEL_PITCH px.
    let first = cells(&html)[0];
    assert_eq!(attr(first, "height"), Some(MIN_CELL_H.to_string().as_str()));
    let group = &html[html.find(r#"<g class="nodes">"#).expect("labels")..];
    let group = &group[..group.find("</g>").expect("end")];
    let labels = group.matches("<text ").count();
    assert_eq!(labels, 1000_usize.div_ceil(label_stride(MIN_CELL_H)));
    assert!(labels * LABEL_PITCH as usize <= 1000 * MIN_CELL_H as usize + LABEL_PITCH as usize);
    // The outlier is named on the right whatever the thinning left out.
    assert!(html.contains("◀ gpu-0500"));
    // An upper bound on the page: about 230 bytes a cell, 8,000 cells.
    let size = html.len();
    eprintln!("1,000 nodes × 8 rails: {size} bytes");
    assert!(size < 2_500_000, "{size} bytes");
}
