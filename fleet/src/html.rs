//! The fleet report as one self-contained HTML page: per profile a summary, a node × rail
//! heatmap of host write bandwidth relative to the fleet median, the distribution of the
//! NCCL busbw plateau and the outlier marks.
//!
//! Inline CSS and inline SVG only: no JavaScript and no external resource (the page's
//! Content-Security-Policy forbids both), so it can be mailed, archived or opened from a
//! ticket as is. The SVG is built with the `svg` crate, which escapes text and attribute
//! values; the HTML around it goes through [`escape`].

use std::fmt::Write as _;

use jiff::Timestamp;
use svg::node::element::{
    Definitions, Group, Line, LinearGradient, Rectangle, Stop, Text, Title, SVG,
};
use svg::Document;

use super::report::{self, NodeRow};
use super::{FleetAnalysis, Measurement, MeasurementKind};

/// The low end of the colour scale: 85% of the median (15% slow, the size of fault the
/// fleet check is for) and worse is full red.
pub const SCALE_LOW: f64 = 0.85;
/// The high end: 105% and better is full blue (faster than the fleet is rarer and matters
/// less, so the scale is lopsided around 100%).
pub const SCALE_HIGH: f64 = 1.05;

/// Rows never grow taller than this, nor shrink below [`MIN_CELL_H`].
const MAX_CELL_H: u32 = 18;
/// At 1,000 nodes a row is 2 px: the heatmap is 2,000 px tall and still shows every node.
const MIN_CELL_H: u32 = 2;
/// The height the heatmap aims for before rows reach [`MIN_CELL_H`].
const TARGET_HEATMAP_H: u32 = 720;
/// Node and rail labels are at least this far apart; the others are left out.
const LABEL_PITCH: u32 = 12;
const FONT_PX: u32 = 10;
/// The longest node name shown in full on the axis (the cell titles carry the whole name).
const MAX_LABEL_CHARS: usize = 32;

const RED: (f64, f64, f64) = (178.0, 24.0, 43.0);
const MID: (f64, f64, f64) = (247.0, 247.0, 247.0);
const BLUE: (f64, f64, f64) = (33.0, 102.0, 172.0);
const NO_FIGURE: &str = "#bdbdbd";

const CSS: &str = "\
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #ccc}
h3{font-size:15px;margin:20px 0 6px}
.generated{color:#666;margin:0 0 16px}
.figures{display:flex;flex-wrap:wrap;gap:0 40px;align-items:flex-start}
ul.summary{margin:4px 0;padding-left:20px}
.warn{color:#a11}
svg{display:block}
svg text{font:10px system-ui,sans-serif;fill:#333}
svg text.outlier{fill:#b2182b;font-weight:600}
svg text.uncertified{fill:#888;font-style:italic}
rect.outline{fill:none;stroke:#000;stroke-width:2px}
line.median{stroke:#000;stroke-width:1.5px;stroke-dasharray:4 3}
rect.bar{fill:#4a77b4}
rect.bar.outlier{fill:#b2182b}
table.outliers{border-collapse:collapse;margin:4px 0}
table.outliers td,table.outliers th{border:1px solid #ccc;padding:2px 8px;text-align:left;vertical-align:top}
table.outliers th{background:#f3f3f3}
";

/// The page for every analysed profile.
pub fn render_html(analyses: &[FleetAnalysis], generated_at: Timestamp) -> String {
    let mut out = String::with_capacity(
        4096 + analyses
            .iter()
            .map(|a| a.nodes.len() * 256 * report::rails(a).len().max(1))
            .sum::<usize>(),
    );
    out.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" \
         content=\"default-src 'none'; style-src 'unsafe-inline'\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>railguard fleet report</title>\n<style>\n",
    );
    out.push_str(CSS);
    out.push_str("</style>\n</head>\n<body>\n<h1>railguard fleet report</h1>\n");
    let _ = writeln!(
        out,
        "<p class=\"generated\">generated {}</p>",
        escape(&generated_at.to_string())
    );
    if analyses.is_empty() {
        out.push_str("<p>No profile to report.</p>\n");
    }
    for (i, a) in analyses.iter().enumerate() {
        profile_section(&mut out, i, a);
    }
    out.push_str("</body>\n</html>\n");
    out
}

fn profile_section(out: &mut String, index: usize, a: &FleetAnalysis) {
    let rails = report::rails(a);
    let rows = report::rows(a);
    let _ = writeln!(
        out,
        "<section class=\"profile\" data-profile=\"{p}\">\n<h2>profile {p}</h2>",
        p = escape(&a.profile)
    );
    summary(out, a);
    // Side by side where the page is wide enough, one under the other where not.
    out.push_str("<div class=\"figures\">\n<div class=\"figure\">\n");
    out.push_str("<h3>Host write bandwidth per rail, relative to the fleet median</h3>\n");
    if rows.is_empty() || rails.is_empty() {
        out.push_str("<p>No per-rail figures.</p>\n");
    } else {
        let _ = writeln!(out, "{}", heatmap(a, &rails, &rows));
        let _ = writeln!(out, "{}", legend(index));
    }
    out.push_str("</div>\n<div class=\"figure\">\n<h3>NCCL all_reduce busbw plateau</h3>\n");
    match histogram(a) {
        Some(svg) => {
            let _ = writeln!(out, "{svg}");
        }
        None => out.push_str("<p>No busbwPlateau figures.</p>\n"),
    }
    out.push_str("</div>\n</div>\n");
    out.push_str("<h3>Outlier marks</h3>\n");
    outlier_table(out, a);
    out.push_str("</section>\n");
}

fn summary(out: &mut String, a: &FleetAnalysis) {
    out.push_str("<ul class=\"summary\">\n");
    let _ = writeln!(
        out,
        "<li>{} node(s), {} certified (the baseline's nodes)</li>",
        a.nodes.len(),
        a.certified
    );
    let _ = writeln!(
        out,
        "<li class=\"outliers\">{} outlier node(s)</li>",
        a.outliers.len()
    );
    if let Some(why) = &a.no_baseline {
        let _ = writeln!(
            out,
            "<li class=\"no-baseline warn\">no baseline: {}</li>",
            escape(why)
        );
    }
    for (m, n) in &a.split {
        let _ = writeln!(
            out,
            "<li class=\"split warn\">split: {} would mark {n} nodes, more than the profile \
             allows: none marked</li>",
            escape(&m.to_string())
        );
    }
    out.push_str("</ul>\n");
}

/// An `<svg>` for inline use in HTML: the HTML parser puts it in the SVG namespace, so the
/// `xmlns` the crate sets (the page's only URL) is left out.
fn inline_svg(class: &str, width: u32, height: u32) -> SVG {
    let mut doc = Document::new()
        .set("class", class)
        .set("width", width)
        .set("height", height)
        .set("viewBox", (0, 0, width, height));
    doc.get_attributes_mut().remove("xmlns");
    doc
}

/// The fill of a cell `rel` times the median: red below, blue above, near-white at 100%.
pub fn colour(rel: f64) -> String {
    let (to, t) = if rel < 1.0 {
        (RED, ((1.0 - rel) / (1.0 - SCALE_LOW)).clamp(0.0, 1.0))
    } else {
        (BLUE, ((rel - 1.0) / (SCALE_HIGH - 1.0)).clamp(0.0, 1.0))
    };
    let mix = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(MID.0, to.0),
        mix(MID.1, to.1),
        mix(MID.2, to.2)
    )
}

/// The row height for `nodes` rows.
fn cell_height(nodes: usize) -> u32 {
    let n = u32::try_from(nodes.max(1)).unwrap_or(u32::MAX);
    (TARGET_HEATMAP_H / n).clamp(MIN_CELL_H, MAX_CELL_H)
}

/// Every `stride`th label keeps labels [`LABEL_PITCH`] apart.
fn label_stride(pitch: u32) -> usize {
    LABEL_PITCH.div_ceil(pitch.max(1)).max(1) as usize
}

fn short(name: &str) -> String {
    if name.chars().count() <= MAX_LABEL_CHARS {
        name.to_string()
    } else {
        let head: String = name.chars().take(MAX_LABEL_CHARS - 1).collect();
        format!("{head}…")
    }
}

fn heatmap(a: &FleetAnalysis, rails: &[String], rows: &[NodeRow]) -> SVG {
    let cell_h = cell_height(rows.len());
    let cell_w: u32 = match rails.len() {
        0..=16 => 64,
        n => (1024 / u32::try_from(n).unwrap_or(u32::MAX)).max(8),
    };
    let longest = rows
        .iter()
        .map(|r| short(&r.node).chars().count())
        .max()
        .unwrap_or(4);
    let left = 12 + 6 * u32::try_from(longest).unwrap_or(0);
    let top: u32 = 24;
    let n_rails = u32::try_from(rails.len()).unwrap_or(u32::MAX);
    let n_rows = u32::try_from(rows.len()).unwrap_or(u32::MAX);
    let grid_w = cell_w * n_rails;
    let grid_h = cell_h * n_rows;
    // Outlier names are repeated, in red, on the right of the grid.
    let right_w = if a.outliers.is_empty() { 8 } else { left + 12 };
    let mut doc = inline_svg("heatmap", left + grid_w + right_w, top + grid_h + 8)
        .set("data-profile", a.profile.as_str())
        .set("data-nodes", rows.len())
        .set("data-rails", rails.len());

    let mut axis = Group::new().set("class", "rails");
    let rail_stride = (60 / cell_w.max(1)).max(1) as usize;
    for (j, rail) in rails.iter().enumerate().step_by(rail_stride) {
        let x = left + cell_w * u32::try_from(j).unwrap_or(0) + cell_w / 2;
        axis = axis.add(
            Text::new(rail.as_str())
                .set("x", x)
                .set("y", top - 8)
                .set("text-anchor", "middle"),
        );
    }
    doc = doc.add(axis);

    let node_stride = label_stride(cell_h);
    let mut names = Group::new().set("class", "nodes");
    let mut flagged = Group::new().set("class", "outlier-names");
    let mut last_flag: Option<u32> = None;
    let mut cells = Group::new().set("class", "cells");
    let mut outlines = Group::new().set("class", "outlines");
    for (i, row) in rows.iter().enumerate() {
        let y = top + cell_h * u32::try_from(i).unwrap_or(0);
        let text_y = y + cell_h / 2 + FONT_PX / 2 - 1;
        let marks = a.outliers.get(&row.node);
        let certified = a.nodes.get(i).is_none_or(|n| n.certified);
        if i % node_stride == 0 {
            let mut t = Text::new(short(&row.node))
                .set("x", left - 6)
                .set("y", text_y)
                .set("text-anchor", "end");
            if !certified {
                t = t.set("class", "uncertified");
            }
            names = names.add(t);
        }
        if marks.is_some() && last_flag.is_none_or(|l| y >= l + LABEL_PITCH) {
            last_flag = Some(y);
            flagged = flagged.add(
                Text::new(format!("◀ {}", short(&row.node)))
                    .set("class", "outlier")
                    .set("x", left + grid_w + 6)
                    .set("y", text_y),
            );
        }
        for (j, rail) in rails.iter().enumerate() {
            let x = left + cell_w * u32::try_from(j).unwrap_or(0);
            let rel = row.relative.get(j).copied().flatten();
            let rail_marks: Vec<String> = marks
                .into_iter()
                .flatten()
                .filter(|o| o.measurement.rail.as_deref() == Some(rail.as_str()))
                .map(ToString::to_string)
                .collect();
            let outlier = !rail_marks.is_empty();
            let mut title = format!("{} · {rail}: ", row.node);
            match rel {
                Some(r) => {
                    let _ = write!(title, "{:.1}% of the fleet median", r * 100.0);
                }
                None => title.push_str("no figure against a baseline"),
            }
            if !certified {
                let _ = write!(title, " (node {})", row.state);
            }
            for m in &rail_marks {
                title.push('\n');
                title.push_str(m);
            }
            cells = cells.add(
                rect(
                    "cell",
                    (x, y),
                    cell_w - 1,
                    cell_h.saturating_sub(u32::from(cell_h > 4)).max(1),
                )
                .set("fill", rel.map_or_else(|| NO_FIGURE.to_string(), colour))
                .set("data-node", row.node.as_str())
                .set("data-rail", rail.as_str())
                .set(
                    "data-relative",
                    rel.map_or_else(String::new, |r| format!("{r:.3}")),
                )
                .set("data-outlier", outlier)
                .add(Title::new(title)),
            );
            if outlier {
                // Drawn after every cell so no neighbour covers the outline.
                outlines = outlines.add(rect("outline", (x, y), cell_w - 1, cell_h.max(2)));
            }
        }
    }
    doc.add(names).add(cells).add(outlines).add(flagged)
}

/// A rectangle of CSS `class` with its top left corner at `(x, y)`.
fn rect(class: &str, (x, y): (u32, u32), width: u32, height: u32) -> Rectangle {
    Rectangle::new()
        .set("class", class)
        .set("x", x)
        .set("y", y)
        .set("width", width)
        .set("height", height)
}

fn legend(index: usize) -> SVG {
    let id = format!("scale-{index}");
    let (x0, w, y0, h) = (24u32, 300u32, 6u32, 12u32);
    let mid = (1.0 - SCALE_LOW) / (SCALE_HIGH - SCALE_LOW) * 100.0;
    let stop = |offset: f64, rel: f64| {
        Stop::new()
            .set("offset", format!("{offset:.0}%"))
            .set("stop-color", colour(rel))
    };
    let gradient = LinearGradient::new()
        .set("id", id.as_str())
        .add(stop(0.0, SCALE_LOW))
        .add(stop(mid, 1.0))
        .add(stop(100.0, SCALE_HIGH));
    let mut doc = inline_svg("legend", 620, 44)
        .add(Definitions::new().add(gradient))
        .add(
            Rectangle::new()
                .set("x", x0)
                .set("y", y0)
                .set("width", w)
                .set("height", h)
                .set("stroke", "#999")
                .set("fill", format!("url(#{id})")),
        );
    let steps = ((SCALE_HIGH - SCALE_LOW) * 100.0 / 5.0).round() as u32;
    for k in 0..=steps {
        let pct = SCALE_LOW * 100.0 + 5.0 * f64::from(k);
        let x = f64::from(x0) + f64::from(w) * f64::from(k) / f64::from(steps);
        doc = doc
            .add(
                Line::new()
                    .set("x1", px(x))
                    .set("x2", px(x))
                    .set("y1", y0 + h)
                    .set("y2", y0 + h + 4)
                    .set("stroke", "#666"),
            )
            .add(
                Text::new(format!(
                    "{}{pct:.0}%{}",
                    if k == 0 { "≤" } else { "" },
                    if k == steps { "≥" } else { "" }
                ))
                .set("x", px(x))
                .set("y", y0 + h + 15)
                .set("text-anchor", "middle"),
            );
    }
    let sx = x0 + w + 30;
    doc.add(
        Rectangle::new()
            .set("x", sx)
            .set("y", y0)
            .set("width", 16)
            .set("height", h)
            .set("fill", NO_FIGURE),
    )
    .add(Text::new("no figure").set("x", sx + 20).set("y", y0 + 10))
    .add(rect("outline", (sx + 90, y0), 16, h))
    .add(
        Text::new("outlier mark on the rail")
            .set("x", sx + 110)
            .set("y", y0 + 10),
    )
}

/// One decimal is plenty for pixels and keeps the page small.
fn px(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// The histogram of the nodes' busbw plateaus with the baseline median; `None` when no node
/// has the figure.
fn histogram(a: &FleetAnalysis) -> Option<SVG> {
    let m = Measurement::node(MeasurementKind::BusbwPlateau);
    let values: Vec<(f64, bool)> = a
        .nodes
        .iter()
        .filter_map(|n| {
            let v = *n.figures.get(&m)?;
            let marked = a
                .outliers
                .get(&n.name)
                .is_some_and(|l| l.iter().any(|o| o.measurement == m));
            Some((v, marked))
        })
        .collect();
    if values.is_empty() {
        return None;
    }
    let median = a.baseline.get(&m).map(|b| b.median);
    let mut lo = values.iter().map(|v| v.0).fold(f64::INFINITY, f64::min);
    let mut hi = values.iter().map(|v| v.0).fold(f64::NEG_INFINITY, f64::max);
    if let Some(med) = median {
        lo = lo.min(med);
        hi = hi.max(med);
    }
    if hi - lo < hi.abs() * 1e-3 {
        // All alike: a bar one percent wide either side.
        let pad = (hi.abs() * 0.01).max(1e-3);
        lo -= pad;
        hi += pad;
    }
    let bins = ((values.len() as f64).sqrt().ceil() as usize).clamp(5, 40);
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![(0usize, false); bins];
    for (v, marked) in &values {
        let b = (((v - lo) / width).floor() as usize).min(bins - 1);
        counts[b].0 += 1;
        counts[b].1 |= *marked;
    }
    let max = counts.iter().map(|c| c.0).max().unwrap_or(1).max(1);
    let (left, top, plot_w, plot_h) = (40.0, 20.0, 380.0, 160.0);
    let bar_w = plot_w / bins as f64;
    let x_of = |v: f64| left + (v - lo) / (hi - lo) * plot_w;
    let mut doc = inline_svg("histogram", 440, 200)
        .set("data-profile", a.profile.as_str())
        .set("data-nodes", values.len());
    let mut bars = Group::new().set("class", "bars");
    for (b, (count, marked)) in counts.iter().enumerate() {
        let from = lo + width * b as f64;
        let h = plot_h * *count as f64 / max as f64;
        bars = bars.add(
            Rectangle::new()
                .set("class", if *marked { "bar outlier" } else { "bar" })
                .set("x", px(left + bar_w * b as f64 + 0.5))
                .set("y", px(top + plot_h - h))
                .set("width", px((bar_w - 1.0).max(0.5)))
                .set("height", px(h))
                .set("data-count", *count)
                .add(Title::new(format!(
                    "{:.1}–{:.1} GB/s: {count} node(s)",
                    from,
                    from + width
                ))),
        );
    }
    doc = doc
        .add(bars)
        .add(
            Line::new()
                .set("x1", left)
                .set("x2", left + plot_w)
                .set("y1", top + plot_h)
                .set("y2", top + plot_h)
                .set("stroke", "#333"),
        )
        .add(
            Text::new(format!("{lo:.1}"))
                .set("x", left)
                .set("y", top + plot_h + 14.0)
                .set("text-anchor", "start"),
        )
        .add(
            Text::new(format!("{hi:.1} GB/s"))
                .set("x", left + plot_w)
                .set("y", top + plot_h + 14.0)
                .set("text-anchor", "end"),
        )
        .add(
            Text::new(format!("{max}"))
                .set("x", left - 4.0)
                .set("y", top + 4.0)
                .set("text-anchor", "end"),
        )
        .add(
            Text::new("nodes")
                .set("x", left - 4.0)
                .set("y", top + 16.0)
                .set("text-anchor", "end"),
        );
    match median {
        Some(med) => {
            let x = px(x_of(med));
            doc = doc
                .add(
                    Line::new()
                        .set("class", "median")
                        .set("data-median", format!("{med:.3}"))
                        .set("x1", x)
                        .set("x2", x)
                        .set("y1", top - 6.0)
                        .set("y2", top + plot_h)
                        .add(Title::new(format!("fleet median {med:.1} GB/s"))),
                )
                .add(
                    Text::new(format!("median {med:.1} GB/s"))
                        .set("x", x)
                        .set("y", top - 8.0)
                        .set("text-anchor", "middle"),
                )
        }
        None => {
            doc = doc.add(
                Text::new("no baseline median")
                    .set("x", left + plot_w / 2.0)
                    .set("y", top - 8.0)
                    .set("text-anchor", "middle"),
            )
        }
    }
    Some(doc)
}

fn outlier_table(out: &mut String, a: &FleetAnalysis) {
    if a.outliers.is_empty() {
        out.push_str("<p class=\"no-outliers\">No outlier marks.</p>\n");
        return;
    }
    out.push_str("<table class=\"outliers\">\n<tr><th>node</th><th>mark</th></tr>\n");
    for (node, marks) in &a.outliers {
        for o in marks {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td></tr>",
                escape(node),
                escape(&o.to_string())
            );
        }
    }
    out.push_str("</table>\n");
}

/// Escapes text and attribute values of the HTML around the SVG.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
#[path = "html_tests.rs"]
mod tests;
