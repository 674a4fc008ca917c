//! The chart's sample Grafana dashboard (`charts/railguard/files/grafana-fleet.json`, shipped
//! as a ConfigMap with `prober.fleet.dashboard.enabled`) and the fleet controller agree:
//!
//! - every metric a query of the dashboard selects is one the controller exports
//!   (`railguard_prober_cli::fleet::METRIC_NAMES`; a histogram's `_bucket`, `_sum` and
//!   `_count` series count as its base name), and no other metric is used;
//! - every exported metric is on at least one panel;
//! - the file is a Grafana dashboard JSON model: schemaVersion 39, a `datasource` variable of
//!   Prometheus data sources that every panel and query uses, the `profile` variable from
//!   `label_values(railguard_fleet_nodes, profile)`, panels with unique ids and refIds on a
//!   24-column grid without overlaps, and only variables that exist;
//! - Prometheus's own parser (`promtool`) accepts every expression.
//!
//! Metric names are read with a small PromQL scanner (below, with its own tests): the
//! identifiers outside label matchers, strings, ranges and grouping label lists that are
//! neither functions, aggregations nor keywords.

use std::collections::{BTreeMap, BTreeSet};

use railguard_prober_cli::fleet::METRIC_NAMES;
use railguard_tests::workspace_root;
use serde_json::Value as Json;

const DASHBOARD: &str = "charts/railguard/files/grafana-fleet.json";

/// The series suffixes of a Prometheus histogram, each mapping to the histogram's name.
const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

// ------------------------------------------------------------------- the PromQL scanner

/// Keywords that are never metric names (binary operators, modifiers).
const KEYWORDS: [&str; 10] = [
    "and", "or", "unless", "atan2", "bool", "offset", "by", "without", "on", "ignoring",
];
/// Keywords followed by a parenthesized list of label names.
const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The index just past the string literal that starts at `i` (`"…"`, `'…'` or `` `…` ``).
fn skip_string(s: &[char], i: usize) -> usize {
    let quote = s[i];
    let mut j = i + 1;
    while j < s.len() {
        match s[j] {
            '\\' if quote != '`' => j += 2,
            c if c == quote => return j + 1,
            _ => j += 1,
        }
    }
    j
}

/// The index just past the bracket group that opens at `i`, strings inside skipped.
fn skip_group(s: &[char], i: usize, open: char, close: char) -> usize {
    let mut depth = 0;
    let mut j = i;
    while j < s.len() {
        match s[j] {
            '"' | '\'' | '`' => {
                j = skip_string(s, j);
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return j + 1;
                }
            }
            _ => {}
        }
        j += 1;
    }
    j
}

fn next_non_space(s: &[char], mut i: usize) -> Option<(usize, char)> {
    while i < s.len() && s[i].is_whitespace() {
        i += 1;
    }
    s.get(i).map(|&c| (i, c))
}

/// The identifier that starts at `i` (empty when none does).
fn word_at(s: &[char], i: usize) -> String {
    s[i..]
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == '_' || **c == ':')
        .collect()
}

/// The metric names an expression selects, in order of appearance.
fn metric_names(expr: &str) -> Vec<String> {
    let s: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i);
        } else if c == '{' {
            // Label matchers (`{__name__="x"}` alone is not used by the dashboard).
            i = skip_group(&s, i, '{', '}');
        } else if c == '[' {
            // A range or subquery duration.
            i = skip_group(&s, i, '[', ']');
        } else if c.is_ascii_digit() || (c == '.' && s.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '.') {
                i += 1;
            }
        } else if c == '$' {
            // A Grafana variable outside a matcher: not a metric.
            i += 1;
            while i < s.len() && (s[i].is_ascii_alphanumeric() || "_{}".contains(s[i])) {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let word = word_at(&s, i);
            i += word.len();
            let next = next_non_space(&s, i);
            if GROUPING.contains(&word.as_str()) {
                if let Some((j, '(')) = next {
                    i = skip_group(&s, j, '(', ')');
                }
            } else if matches!(next, Some((_, '(')))
                || KEYWORDS.contains(&word.as_str())
                || next.is_some_and(|(j, _)| ["by", "without"].contains(&word_at(&s, j).as_str()))
            {
                // A function or an aggregation (`sum by (le) (…)`), or an operator.
            } else {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The exported metric a selected series belongs to, if any.
fn exported_metric<'a>(name: &str, exported: &[&'a str]) -> Option<&'a str> {
    if let Some(m) = exported.iter().find(|m| **m == name) {
        return Some(m);
    }
    HISTOGRAM_SUFFIXES.iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        exported.iter().find(|m| **m == base).copied()
    })
}

// --------------------------------------------------------------------- the dashboard

fn dashboard() -> Json {
    let path = workspace_root().join(DASHBOARD);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every panel, rows' nested panels included.
fn panels(dash: &Json) -> Vec<&Json> {
    fn walk<'a>(list: &'a Json, out: &mut Vec<&'a Json>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

/// (panel title, refId, expression) of every query of every panel.
fn panel_queries(dash: &Json) -> Vec<(String, String, String)> {
    panels(dash)
        .into_iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            p["targets"].as_array().into_iter().flatten().map(move |t| {
                (
                    title.clone(),
                    t["refId"].as_str().unwrap_or_default().to_string(),
                    t["expr"].as_str().unwrap_or_default().to_string(),
                )
            })
        })
        .collect()
}

fn variables(dash: &Json) -> Vec<&Json> {
    dash["templating"]["list"]
        .as_array()
        .map(|l| l.iter().collect())
        .unwrap_or_default()
}

/// The series selector of a `label_values(selector, label)` variable query.
fn label_values_selector(query: &str) -> Option<&str> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    inner.rsplit_once(',').map(|(sel, _)| sel.trim())
}

/// The Grafana variables an expression refers to (`$name`, `${name}`, `[[name]]`), built-ins
/// (`$__rate_interval`, ...) left out.
fn variable_refs(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let s: Vec<char> = expr.chars().collect();
    let word = |from: usize| -> String {
        s[from..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
            .collect()
    };
    for i in 0..s.len() {
        let name = match (s[i], s.get(i + 1)) {
            ('$', Some('{')) => word(i + 2),
            ('$', _) => word(i + 1),
            ('[', Some('[')) => word(i + 2),
            _ => continue,
        };
        if !name.is_empty() && !name.starts_with("__") {
            out.insert(name);
        }
    }
    out
}

#[test]
fn every_metric_of_the_dashboard_is_exported_and_every_exported_metric_is_shown() {
    let dash = dashboard();
    let queries = panel_queries(&dash);
    assert!(queries.len() >= 8, "only {} queries", queries.len());
    let mut problems = Vec::new();
    let mut shown: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (title, ref_id, expr) in &queries {
        let names = metric_names(expr);
        if names.is_empty() {
            problems.push(format!("{title} {ref_id}: `{expr}` selects no metric"));
        }
        for name in names {
            match exported_metric(&name, METRIC_NAMES) {
                Some(m) => shown.entry(m).or_default().push(title.clone()),
                None => problems.push(format!(
                    "{title} {ref_id}: {name} is not exported by the fleet controller"
                )),
            }
        }
    }
    // Variables may select series too; they must exist as well, but do not count as shown.
    for v in variables(&dash) {
        if v["type"] != "query" {
            continue;
        }
        let query = v["query"]["query"]
            .as_str()
            .or_else(|| v["query"].as_str())
            .unwrap_or_default();
        let selector = label_values_selector(query).unwrap_or(query);
        for name in metric_names(selector) {
            if exported_metric(&name, METRIC_NAMES).is_none() {
                problems.push(format!(
                    "variable {}: {name} is not exported by the fleet controller",
                    v["name"]
                ));
            }
        }
    }
    for m in METRIC_NAMES {
        if !shown.contains_key(m) {
            problems.push(format!("{m} is exported but on no panel"));
        }
    }
    assert!(
        problems.is_empty(),
        "the dashboard and the fleet controller's metrics disagree:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_dashboard_is_a_grafana_dashboard_model_on_a_prometheus_variable() {
    let dash = dashboard();
    let mut problems = Vec::new();
    let schema = dash["schemaVersion"].as_u64().unwrap_or_default();
    assert_eq!(schema, 39, "schemaVersion");
    for key in ["uid", "title"] {
        let v = dash[key].as_str().unwrap_or_default();
        assert!(!v.is_empty() && v.len() <= 40, "{key}: {v:?}");
    }
    assert!(dash["time"]["from"].is_string() && dash["templating"]["list"].is_array());

    // The variables: Prometheus data sources, and the profiles from the node count.
    let vars: BTreeMap<&str, &Json> = variables(&dash)
        .into_iter()
        .map(|v| (v["name"].as_str().unwrap_or_default(), v))
        .collect();
    let ds = vars.get("datasource").expect("a `datasource` variable");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(ds["query"], "prometheus");
    let profile = vars.get("profile").expect("a `profile` variable");
    assert_eq!(profile["type"], "query");
    assert_eq!(
        profile["definition"],
        "label_values(railguard_fleet_nodes, profile)"
    );
    assert_eq!(
        profile["query"]["query"],
        "label_values(railguard_fleet_nodes, profile)"
    );
    let prometheus = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
    for (name, v) in &vars {
        if v["type"] == "query" && v["datasource"] != prometheus {
            problems.push(format!("variable {name}: datasource {}", v["datasource"]));
        }
    }

    // Panels: unique ids, on the grid, not overlapping, every query on the variable.
    let all = panels(&dash);
    let mut ids = BTreeSet::new();
    let mut boxes: Vec<(String, u64, u64, u64, u64)> = Vec::new();
    for p in &all {
        let title = p["title"].as_str().unwrap_or_default().to_string();
        if !ids.insert(p["id"].as_u64().unwrap_or_default()) || p["id"].as_u64().is_none() {
            problems.push(format!("{title}: id {} missing or repeated", p["id"]));
        }
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap_or(99),
            g["y"].as_u64().unwrap_or(0),
            g["w"].as_u64().unwrap_or(0),
            g["h"].as_u64().unwrap_or(0),
        );
        if w == 0 || h == 0 || x + w > 24 {
            problems.push(format!("{title}: gridPos {g} is off the 24-column grid"));
        }
        for (other, ox, oy, ow, oh) in &boxes {
            if x < ox + ow && *ox < x + w && y < oy + oh && *oy < y + h {
                problems.push(format!("{title} overlaps {other}"));
            }
        }
        boxes.push((title.clone(), x, y, w, h));
        if p["type"] == "row" {
            continue;
        }
        if p["type"].as_str().is_none_or(str::is_empty) {
            problems.push(format!("{title}: no type"));
        }
        if p["datasource"] != prometheus {
            problems.push(format!("{title}: datasource {}", p["datasource"]));
        }
        let targets = p["targets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("{title}: no query"));
        }
        let mut refs = BTreeSet::new();
        for t in targets {
            let r = t["refId"].as_str().unwrap_or_default();
            if r.is_empty() || !refs.insert(r) {
                problems.push(format!("{title}: refId {r:?} missing or repeated"));
            }
            if t["datasource"] != prometheus {
                problems.push(format!("{title} {r}: datasource {}", t["datasource"]));
            }
            let expr = t["expr"].as_str().unwrap_or_default();
            for v in variable_refs(expr) {
                if !vars.contains_key(v.as_str()) {
                    problems.push(format!("{title} {r}: no variable ${v}"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{DASHBOARD}:\n{}", problems.join("\n"));

    // What the issue asks to look at: the node × rail matrix of bandwidth relative to the
    // baseline, and the worst nodes by distance.
    let matrix = all
        .iter()
        .find(|p| {
            p["targets"][0]["expr"]
                .as_str()
                .is_some_and(|e| metric_names(e) == ["railguard_fleet_node_rail_relative"])
        })
        .expect("a node × rail panel");
    let grouping = matrix["transformations"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["id"] == "groupingToMatrix")
        .expect("rows by node, columns by rail");
    assert_eq!(grouping["options"]["rowField"], "node");
    assert_eq!(grouping["options"]["columnField"], "rail");
    assert!(
        panel_queries(&dash)
            .iter()
            .any(|(_, _, e)| e.starts_with("bottomk(")
                && metric_names(e) == ["railguard_fleet_node_distance_spreads"]),
        "the worst nodes by distance"
    );
}

/// Grafana's built-in interval variables and the dashboard's own, replaced by values
/// Prometheus's parser accepts.
fn concrete(expr: &str, vars: &[&str]) -> String {
    let mut e = expr
        .replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h");
    for v in vars {
        e = e
            .replace(&format!("${{{v}}}"), ".*")
            .replace(&format!("${v}"), ".*");
    }
    e
}

#[test]
fn prometheus_parses_every_expression() {
    // tests/scripts/install-deps.sh installs Debian's prometheus package for promtool.
    let out = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .expect("promtool (Debian package prometheus) is installed");
    assert!(out.status.success(), "promtool --version");
    let dash = dashboard();
    let names: Vec<String> = variables(&dash)
        .iter()
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut exprs: Vec<String> = panel_queries(&dash)
        .into_iter()
        .map(|(_, _, e)| e)
        .collect();
    for v in variables(&dash) {
        if let Some(sel) = v["query"]["query"].as_str().and_then(label_values_selector) {
            exprs.push(sel.to_string());
        }
    }
    let mut rules = String::from("groups:\n  - name: grafana-fleet\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = serde_json::to_string(&concrete(e, &names)).unwrap();
        rules.push_str(&format!(
            "      - record: dashboard:expr{i}\n        expr: {e}\n"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, rules).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool rejects an expression:\n{text}"
    );
    assert!(
        text.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "{text}"
    );
}

// ---------------------------------------------------------------- the scanner's tests

#[test]
fn the_scanner_finds_selected_metrics_only() {
    let cases: [(&str, &[&str]); 9] = [
        ("up", &["up"]),
        (
            r#"railguard_fleet_nodes{profile=~"$profile"}"#,
            &["railguard_fleet_nodes"],
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket[$__rate_interval])))",
            &["x_seconds_bucket"],
        ),
        ("bottomk(20, a{node!=\"b{c}\"})", &["a"]),
        (
            "a / on (profile, measurement) group_left (node) b",
            &["a", "b"],
        ),
        ("sum without(instance) (a) > bool 0.5", &["a"]),
        ("a offset 5m and b unless c or atan2", &["a", "b", "c"]),
        (r#"count({__name__=~"railguard_.*"})"#, &[]),
        (
            "sum(rate(x_sum[5m])) / sum(rate(x_count[5m])) * 1e3",
            &["x_sum", "x_count"],
        ),
    ];
    for (expr, want) in cases {
        assert_eq!(metric_names(expr), want, "{expr}");
    }
}

#[test]
fn histogram_series_map_to_their_metric_and_nothing_else_does() {
    let exported = ["h_seconds", "c_total", "g"];
    assert_eq!(
        exported_metric("h_seconds_bucket", &exported),
        Some("h_seconds")
    );
    assert_eq!(
        exported_metric("h_seconds_sum", &exported),
        Some("h_seconds")
    );
    assert_eq!(
        exported_metric("h_seconds_count", &exported),
        Some("h_seconds")
    );
    assert_eq!(exported_metric("c_total", &exported), Some("c_total"));
    assert_eq!(exported_metric("g", &exported), Some("g"));
    assert_eq!(exported_metric("c", &exported), None);
    assert_eq!(exported_metric("g_max", &exported), None);
    assert_eq!(exported_metric("h_seconds_total", &exported), None);
}

#[test]
fn variable_references_and_label_values_queries_are_read() {
    assert_eq!(
        variable_refs(r#"a{p=~"$profile", m=~"${measurement}", x="[[old]]"}[$__rate_interval]"#),
        ["measurement", "old", "profile"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    assert_eq!(
        label_values_selector(r#"label_values(a{p=~"$profile"}, measurement)"#),
        Some(r#"a{p=~"$profile"}"#)
    );
    assert_eq!(label_values_selector("query_result(a)"), None);
    assert_eq!(
        concrete(r#"rate(a{p=~"$profile"}[$__rate_interval])"#, &["profile"]),
        r#"rate(a{p=~".*"}[5m])"#
    );
}
