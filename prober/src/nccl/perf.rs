//! Parser for nccl-tests output (`all_reduce_perf` and friends).
//!
//! Every table format is understood: the old one with `error` columns (max error per size,
//! wrong values only in the `Out of bounds values` total), the newer one with `root` and
//! `#wrong` columns, and the layout of nccl-tests 2.17 and later (read from `src/util.cu`:
//! a `# nccl-tests version` line, `# Collective test starting: NAME` before the table,
//! optional per-iteration columns `i_min i_max i_p99 i_cv%` after each half with `-I 1`, an
//! optional `timestamp` column with `-S`, `# error: ...` lines and `# Collective test
//! concluded: NAME` at the end). Lines that are not part of the table (MPI noise, `NCCL
//! INFO` lines, job-script echoes) are skipped, so the parser can read a combined
//! stdout/stderr capture.
//!
//! A run is complete when it printed `# Avg bus bandwidth` or `# Collective test concluded`;
//! without the average the parser computes it as nccl-tests does (the mean busbw over every
//! row and both halves). A table that does neither was cut short: that is an error, never a
//! partial result.

use std::collections::BTreeSet;

use serde::Serialize;

/// Which nccl-tests table format the output used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PerfFormat {
    /// `... time algbw busbw error ...` (nccl-tests before the `#wrong` columns).
    Old,
    /// `... root time algbw busbw #wrong ...`.
    New,
}

/// Where [`PerfReport::avg_busbw_gbps`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AverageSource {
    /// The `# Avg bus bandwidth` line.
    Reported,
    /// Computed from the rows: the run concluded without printing the average.
    Computed,
}

/// Per-iteration statistics of one half of a row (nccl-tests 2.17+ with `-I 1`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct IterationStats {
    pub min_us: f64,
    pub max_us: f64,
    pub p99_us: f64,
    /// Coefficient of variation of the iteration times, in percent.
    pub cv_pct: f64,
}

/// One half (out-of-place or in-place) of a size row.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PerfPoint {
    pub time_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    /// `#wrong` count (new format); `None` for `N/A` or the old format.
    pub wrong: Option<u64>,
    /// Max error (old format); `None` for `N/A` or the new format.
    pub max_error: Option<f64>,
    /// Per-iteration statistics, when the run printed them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iterations: Option<IterationStats>,
}

/// One message size of the table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PerfRow {
    pub size_bytes: u64,
    pub count: u64,
    pub dtype: String,
    pub redop: String,
    pub out_of_place: PerfPoint,
    pub in_place: PerfPoint,
}

impl PerfRow {
    /// Bus bandwidth of the row: the mean of out-of-place and in-place.
    pub fn busbw_gbps(&self) -> f64 {
        (self.out_of_place.busbw_gbps + self.in_place.busbw_gbps) / 2.0
    }

    pub fn algbw_gbps(&self) -> f64 {
        (self.out_of_place.algbw_gbps + self.in_place.algbw_gbps) / 2.0
    }
}

/// Everything a nccl-tests output says.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PerfReport {
    pub format: PerfFormat,
    pub rows: Vec<PerfRow>,
    /// `# Avg bus bandwidth : X`, or the same mean computed from the rows (see
    /// [`PerfReport::avg_source`]).
    pub avg_busbw_gbps: f64,
    pub avg_source: AverageSource,
    /// `# Out of bounds values : N OK|FAILED`.
    pub out_of_bounds: Option<u64>,
    /// Ranks listed under `# Using devices`.
    pub ranks: Option<u32>,
    /// Distinct hosts of those ranks.
    pub nodes: Option<u32>,
    pub hosts: Vec<String>,
    /// `nGpus` of the `# nThread` header.
    pub gpus_per_process: Option<u32>,
    /// `NCCL version 2.x.y+cudaZ` when printed (newer nccl-tests print it).
    pub nccl_version: Option<String>,
    /// Lines inside the table that looked like rows but did not parse (interleaved noise).
    pub skipped_lines: usize,
    /// `# nccl-tests version 2.19.6 ...` (2.17 and later).
    pub nccl_tests_version: Option<String>,
    /// The test program named by `# Collective test starting: NAME`.
    pub collective: Option<String>,
    /// `# Collective test concluded` was printed.
    pub concluded: bool,
    /// `# error: ...` lines (NCCL's last error, printed by nccl-tests 2.17+).
    pub errors: Vec<String>,
}

/// Why an nccl-tests output cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PerfParseError {
    #[error("nccl-tests output has no result table")]
    NoTable,
    #[error("nccl-tests output has a table header but no result rows (run cut short?)")]
    NoRows,
    #[error(
        "nccl-tests output ends after the {last_size}-byte row without `# Avg bus bandwidth` or `# Collective test concluded`: the run was cut short"
    )]
    CutShort { last_size: u64 },
    #[error("line {line}: bad `Avg bus bandwidth` value {value:?}")]
    BadAverage { line: usize, value: String },
}

/// Column layout found in the header.
#[derive(Clone, Copy, Debug)]
struct Layout {
    format: PerfFormat,
    has_root: bool,
    /// `i_min i_max i_p99 i_cv%` after each half.
    per_iteration: bool,
    /// A `timestamp` column (`YYYY-MM-DD HH:MM:SS`, two tokens) at the end of the row.
    timestamp: bool,
}

impl Layout {
    fn from_header(header: &str) -> Layout {
        let tokens: Vec<&str> = header.split_whitespace().collect();
        Layout {
            format: if tokens.contains(&"#wrong") {
                PerfFormat::New
            } else {
                PerfFormat::Old
            },
            has_root: tokens.contains(&"root"),
            per_iteration: tokens.contains(&"i_min"),
            timestamp: tokens.contains(&"timestamp"),
        }
    }

    fn half_width(self) -> usize {
        // time algbw busbw err [i_min i_max i_p99 i_cv%]
        4 + if self.per_iteration { 4 } else { 0 }
    }

    fn columns(self) -> usize {
        // size count type redop [root] half x2 [date time]
        4 + usize::from(self.has_root) + 2 * self.half_width() + if self.timestamp { 2 } else { 0 }
    }
}

/// The plateau window: rows with sizes of at least `max size / PLATEAU_SPAN`. With the usual
/// `-f 2` sweep that is the last four doublings, enough for a median that one peak line
/// cannot decide.
pub const PLATEAU_SPAN: u64 = 8;

impl PerfReport {
    /// The report of the native loopback (`nccl-ranks --single-node`): one row per size of
    /// the combined sweep (the slowest rank's time), judged by the same plateau, average and
    /// wrong-count rules as an nccl-tests table. Its all-reduces are out-of-place only, so a
    /// row's in-place half repeats the measured time (a row's mean is the measurement) and
    /// carries no wrong elements of its own (they are counted once, out of place).
    pub fn from_native(
        points: &[super::ranks::PairPoint],
        ranks: u32,
        nccl_version: &str,
    ) -> PerfReport {
        let rows: Vec<PerfRow> = points
            .iter()
            .map(|p| {
                let half = PerfPoint {
                    time_us: p.time_us,
                    algbw_gbps: p.algbw_gbps,
                    busbw_gbps: p.busbw_gbps,
                    wrong: Some(p.wrong),
                    max_error: None,
                    iterations: None,
                };
                PerfRow {
                    size_bytes: p.bytes as u64,
                    count: (p.bytes / 4) as u64,
                    dtype: "float".into(),
                    redop: "sum".into(),
                    out_of_place: half,
                    in_place: PerfPoint {
                        wrong: Some(0),
                        ..half
                    },
                }
            })
            .collect();
        let avg_busbw_gbps = if rows.is_empty() {
            0.0
        } else {
            rows.iter().map(PerfRow::busbw_gbps).sum::<f64>() / rows.len() as f64
        };
        PerfReport {
            format: PerfFormat::New,
            rows,
            avg_busbw_gbps,
            avg_source: AverageSource::Computed,
            out_of_bounds: None,
            ranks: Some(ranks),
            nodes: Some(1),
            hosts: Vec::new(),
            gpus_per_process: Some(ranks),
            nccl_version: Some(nccl_version.to_string()),
            skipped_lines: 0,
            nccl_tests_version: None,
            collective: Some("railguard native all_reduce".into()),
            concluded: true,
            errors: Vec::new(),
        }
    }

    /// Stable large-message bus bandwidth: the median busbw of the plateau window.
    pub fn plateau_busbw_gbps(&self) -> Option<f64> {
        median(self.plateau_rows().map(PerfRow::busbw_gbps).collect())
    }

    /// Stable large-message algorithm bandwidth (same window as the busbw plateau).
    pub fn plateau_algbw_gbps(&self) -> Option<f64> {
        median(self.plateau_rows().map(PerfRow::algbw_gbps).collect())
    }

    /// The single highest busbw of any row and direction (reported, never judged on).
    pub fn max_busbw_gbps(&self) -> Option<f64> {
        self.rows
            .iter()
            .flat_map(|r| [r.out_of_place.busbw_gbps, r.in_place.busbw_gbps])
            .reduce(f64::max)
    }

    /// Total wrong values: the sum of `#wrong` columns, or the out-of-bounds total of the old
    /// format. `None` when the run did not validate (`N/A` everywhere, no total).
    pub fn wrong(&self) -> Option<u64> {
        let mut any = false;
        let mut sum = 0u64;
        for r in &self.rows {
            for p in [r.out_of_place, r.in_place] {
                if let Some(w) = p.wrong {
                    any = true;
                    sum = sum.saturating_add(w);
                }
            }
        }
        match (any, self.out_of_bounds) {
            (true, Some(oob)) => Some(sum.max(oob)),
            (true, None) => Some(sum),
            (false, oob) => oob,
        }
    }

    fn plateau_rows(&self) -> impl Iterator<Item = &PerfRow> {
        let max = self.rows.iter().map(|r| r.size_bytes).max().unwrap_or(0);
        let floor = max / PLATEAU_SPAN;
        self.rows
            .iter()
            .filter(move |r| r.size_bytes >= floor && r.size_bytes > 0)
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Parses nccl-tests output. `Ok(None)` when the text holds no nccl-tests table at all (e.g.
/// a pure NCCL debug log); a table that does not finish is an error.
pub fn parse_perf_output(text: &str) -> Result<Option<PerfReport>, PerfParseError> {
    let mut layout: Option<Layout> = None;
    let mut rows: Vec<PerfRow> = Vec::new();
    let mut avg: Option<f64> = None;
    let mut out_of_bounds = None;
    let mut rank_ids = BTreeSet::new();
    let mut hosts: Vec<String> = Vec::new();
    let mut gpus_per_process = None;
    let mut nccl_version = None;
    let mut skipped = 0usize;
    let mut nccl_tests_version = None;
    let mut collective = None;
    let mut concluded = false;
    let mut errors: Vec<String> = Vec::new();

    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim_start();
            if rest.starts_with("size") && rest.contains("busbw") {
                layout = Some(Layout::from_header(rest));
            } else if let Some(v) = rest.strip_prefix("nccl-tests version") {
                nccl_tests_version = v.split_whitespace().next().map(str::to_string);
            } else if let Some(v) = rest.strip_prefix("Collective test starting:") {
                collective = Some(v.trim().to_string()).filter(|c| !c.is_empty());
            } else if rest.starts_with("Collective test concluded") {
                concluded = true;
            } else if let Some(v) = rest.strip_prefix("error:") {
                let v = v.trim();
                if !v.is_empty() && !errors.iter().any(|e| e == v) {
                    errors.push(v.to_string());
                }
            } else if let Some(v) = rest.strip_prefix("Avg bus bandwidth") {
                let v = v.trim_start().trim_start_matches(':').trim();
                let parsed = v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0);
                match parsed {
                    Some(x) => avg = Some(x),
                    None => {
                        return Err(PerfParseError::BadAverage {
                            line: i + 1,
                            value: v.to_string(),
                        })
                    }
                }
            } else if let Some(v) = rest.strip_prefix("Out of bounds values") {
                let v = v.trim_start().trim_start_matches(':').trim();
                out_of_bounds = v.split_whitespace().next().and_then(|n| n.parse().ok());
            } else if rest.starts_with("Rank") {
                if let Some((rank, host)) = parse_rank_line(rest) {
                    if rank_ids.insert(rank) && !hosts.contains(&host) {
                        hosts.push(host);
                    }
                }
            } else if rest.starts_with("nThread") {
                gpus_per_process = header_value(rest, "nGpus");
            } else if let Some(v) = rest.strip_prefix("NCCL version") {
                nccl_version = v.split_whitespace().next().map(str::to_string);
            }
            continue;
        }
        if let Some(v) = line.strip_prefix("NCCL version") {
            nccl_version = v.split_whitespace().next().map(str::to_string);
            continue;
        }
        let Some(l) = layout else { continue };
        if !line.as_bytes().first().is_some_and(u8::is_ascii_digit) {
            continue;
        }
        match parse_row(line, l) {
            Some(row) => rows.push(row),
            None => skipped += 1,
        }
    }

    let Some(layout) = layout else {
        return if avg.is_some() {
            Err(PerfParseError::NoRows)
        } else {
            Ok(None)
        };
    };
    if rows.is_empty() {
        return Err(PerfParseError::NoRows);
    }
    let (avg_busbw_gbps, avg_source) = match avg {
        Some(a) => (a, AverageSource::Reported),
        None if concluded => (mean_busbw(&rows), AverageSource::Computed),
        None => {
            let last_size = rows.last().map(|r| r.size_bytes).unwrap_or(0);
            return Err(PerfParseError::CutShort { last_size });
        }
    };
    let ranks = if rank_ids.is_empty() {
        None
    } else {
        u32::try_from(rank_ids.len()).ok()
    };
    let nodes = if hosts.is_empty() {
        None
    } else {
        u32::try_from(hosts.len()).ok()
    };
    Ok(Some(PerfReport {
        format: layout.format,
        rows,
        avg_busbw_gbps,
        avg_source,
        out_of_bounds,
        ranks,
        nodes,
        hosts,
        gpus_per_process,
        nccl_version,
        skipped_lines: skipped,
        nccl_tests_version,
        collective,
        concluded,
        errors,
    }))
}

/// nccl-tests' own average: the mean busbw over every row, out-of-place and in-place.
fn mean_busbw(rows: &[PerfRow]) -> f64 {
    // rows is non-empty here (checked before). Each value divided first: finite values near
    // f64::MAX would sum to infinity.
    let n = rows.len() as f64 * 2.0;
    rows.iter()
        .map(|r| r.out_of_place.busbw_gbps / n + r.in_place.busbw_gbps / n)
        .sum()
}

fn header_value(line: &str, key: &str) -> Option<u32> {
    let mut it = line.split_whitespace();
    while let Some(t) = it.next() {
        if t == key {
            return it.next().and_then(|v| v.parse().ok());
        }
    }
    None
}

/// `Rank  0 Group  0 Pid 6899 on host device 0 [..] NAME` or `Rank 0 Pid 1 on host device 0`.
fn parse_rank_line(rest: &str) -> Option<(u32, String)> {
    let mut it = rest.split_whitespace();
    if it.next()? != "Rank" {
        return None;
    }
    let rank: u32 = it.next()?.parse().ok()?;
    while let Some(t) = it.next() {
        if t == "on" {
            return Some((rank, it.next()?.to_string()));
        }
    }
    None
}

fn parse_row(line: &str, layout: Layout) -> Option<PerfRow> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    if tokens.len() != layout.columns() {
        return None;
    }
    let size_bytes = tokens[0].parse().ok()?;
    let count = tokens[1].parse().ok()?;
    let dtype = tokens[2].to_string();
    let redop = tokens[3].to_string();
    let base = if layout.has_root { 5 } else { 4 };
    if layout.has_root {
        tokens[4].parse::<i64>().ok()?;
    }
    let point = |at: usize| -> Option<PerfPoint> {
        let time_us = finite(tokens[at])?;
        let algbw_gbps = finite(tokens[at + 1])?;
        let busbw_gbps = finite(tokens[at + 2])?;
        let last = tokens[at + 3];
        let (wrong, max_error) = match (last, layout.format) {
            ("N/A", _) => (None, None),
            // `%6g`: a large count prints as `1e+06`.
            (v, PerfFormat::New) => (Some(wrong_count(v)?), None),
            (v, PerfFormat::Old) => (None, Some(finite(v)?)),
        };
        let iterations = if layout.per_iteration {
            Some(IterationStats {
                min_us: finite(tokens[at + 4])?,
                max_us: finite(tokens[at + 5])?,
                p99_us: finite(tokens[at + 6])?,
                cv_pct: finite(tokens[at + 7])?,
            })
        } else {
            None
        };
        Some(PerfPoint {
            time_us,
            algbw_gbps,
            busbw_gbps,
            wrong,
            max_error,
            iterations,
        })
    };
    Some(PerfRow {
        size_bytes,
        count,
        dtype,
        redop,
        out_of_place: point(base)?,
        in_place: point(base + layout.half_width())?,
    })
}

fn wrong_count(s: &str) -> Option<u64> {
    if let Ok(n) = s.parse::<u64>() {
        return Some(n);
    }
    let v = finite(s)?;
    (v.fract() == 0.0 && v <= u64::MAX as f64).then_some(v as u64)
}

fn finite(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: &str = "\
# nThread 1 nGpus 1 minBytes 8 maxBytes 64 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   1 on a device  0 [0000:04:00] NVIDIA H100
#  Rank  1 Group  0 Pid   2 on b device  0 [0000:04:00] NVIDIA H100
#
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    10.0    1.00    2.00      0    10.0    1.00    2.00      0
          16             4     float     sum      -1    10.0    2.00    4.00      1    10.0    2.00    4.00      2
# Out of bounds values : 3 FAILED
# Avg bus bandwidth    : 3
";

    #[test]
    fn new_format_counts_wrong_and_ranks() {
        let r = parse_perf_output(NEW).unwrap().unwrap();
        assert_eq!(r.format, PerfFormat::New);
        assert_eq!(r.rows.len(), 2);
        assert_eq!(r.wrong(), Some(3));
        assert_eq!(r.ranks, Some(2));
        assert_eq!(r.nodes, Some(2));
        assert_eq!(r.gpus_per_process, Some(1));
        assert_eq!(r.avg_busbw_gbps, 3.0);
    }

    #[test]
    fn missing_average_is_cut_short() {
        let cut: String = NEW
            .lines()
            .filter(|l| !l.contains("Avg bus") && !l.contains("Out of bounds"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(
            parse_perf_output(&cut),
            Err(PerfParseError::CutShort { last_size: 16 })
        );
    }

    #[test]
    fn header_without_rows_is_an_error_and_no_table_is_none() {
        let header_only: String = NEW.lines().take(8).collect::<Vec<_>>().join("\n");
        assert_eq!(parse_perf_output(&header_only), Err(PerfParseError::NoRows));
        assert_eq!(
            parse_perf_output("host:1:1 [0] NCCL INFO Using network IB\n"),
            Ok(None)
        );
    }

    #[test]
    fn garbage_average_is_rejected() {
        let bad = NEW.replace("Avg bus bandwidth    : 3", "Avg bus bandwidth    : fast");
        assert!(matches!(
            parse_perf_output(&bad),
            Err(PerfParseError::BadAverage { .. })
        ));
    }

    /// The 2.17+ layout with `-I 1` (per-iteration columns) and `-S` would put a timestamp
    /// after the in-place half; this one has per-iteration columns, an `# error:` line and
    /// concludes without the average (the column layout is that of nccl-tests 2.19's
    /// `writeResultHeader` / `writeBenchmarkLineBody`).
    const PER_ITERATION: &str = "\
# nccl-tests version 2.19.6 nccl-headers=22803 nccl-library=22803
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 8 minBytes 1024 maxBytes 2048 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
# Per-Iteration Report: CUDA event timing; i_* uses max over process rows
#
#                                                   out-of-place (+ per-iteration)                                in-place (+ per-iteration)
#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%)     (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%)
        1024           256     float     sum      -1    20.00    0.05    0.09       0    19.00    25.00    24.00     3.10    20.00    0.05    0.09       0    19.10    24.00    23.90     2.90
        2048           512     float     sum      -1    20.00    0.10    0.18   1e+06    19.50    26.00    25.00     4.00    20.00    0.10    0.18       0    19.40    25.50    25.10     3.80
# error: remote process exited or there was a network error
#
# Collective test concluded: all_reduce_perf
";

    #[test]
    fn per_iteration_columns_and_a_concluded_run_without_average() {
        let r = parse_perf_output(PER_ITERATION).unwrap().unwrap();
        assert_eq!(r.rows.len(), 2, "skipped {}", r.skipped_lines);
        assert_eq!(r.nccl_tests_version.as_deref(), Some("2.19.6"));
        assert_eq!(r.collective.as_deref(), Some("all_reduce_perf"));
        assert!(r.concluded);
        assert_eq!(r.avg_source, AverageSource::Computed);
        // (0.09 + 0.09 + 0.18 + 0.18) / 4
        assert!(
            (r.avg_busbw_gbps - 0.135).abs() < 1e-9,
            "{}",
            r.avg_busbw_gbps
        );
        assert_eq!(r.wrong(), Some(1_000_000));
        let it = r.rows[0].in_place.iterations.unwrap();
        assert_eq!((it.min_us, it.max_us, it.cv_pct), (19.1, 24.0, 2.9));
        assert_eq!(
            r.errors,
            vec!["remote process exited or there was a network error".to_string()]
        );
    }

    #[test]
    fn timestamp_column_is_read_past() {
        let text = "\
# Collective test starting: all_reduce_perf
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong            timestamp
        1024           256     float     sum      -1    20.00    0.05    0.09       0    20.00    0.05    0.09       0  2026-07-09 16:03:21
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.09
#
# Collective test concluded: all_reduce_perf
";
        let r = parse_perf_output(text).unwrap().unwrap();
        assert_eq!(r.rows.len(), 1);
        assert_eq!(r.avg_source, AverageSource::Reported);
        assert_eq!(r.avg_busbw_gbps, 0.09);
    }

    #[test]
    fn a_started_run_that_neither_averages_nor_concludes_is_cut_short() {
        let cut: String = PER_ITERATION
            .lines()
            .filter(|l| !l.contains("concluded"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(
            parse_perf_output(&cut),
            Err(PerfParseError::CutShort { last_size: 2048 })
        );
    }

    #[test]
    fn plateau_is_a_median_not_a_peak() {
        // One spike at 2 GiB must not set the plateau.
        let mut rows = String::new();
        let sizes = [
            (1u64 << 27, 100.0),
            (1 << 28, 150.0),
            (1 << 29, 180.0),
            (1 << 30, 182.0),
            (1 << 31, 260.0),
            (1 << 32, 184.0),
        ];
        for (s, b) in sizes {
            rows.push_str(&format!(
                "{s} {c} float sum -1 1.0 {a} {b} 0 1.0 {a} {b} 0\n",
                c = s / 4,
                a = b / 2.0
            ));
        }
        let text = format!(
            "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n{rows}# Avg bus bandwidth : 1\n"
        );
        let r = parse_perf_output(&text).unwrap().unwrap();
        assert_eq!(r.max_busbw_gbps(), Some(260.0));
        // window: sizes >= 4 GiB / 8 = 512 MiB -> 180, 182, 260, 184 -> median 183
        assert_eq!(r.plateau_busbw_gbps(), Some(183.0));
    }
}
