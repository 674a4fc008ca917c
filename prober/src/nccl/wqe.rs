//! NCCL's own work-request latency lines (NCCL ≥ 2.31, `NCCL_IB_WQE_LATENCY_THRESHOLD_NS`
//! and `NCCL_IB_WQE_LATENCY_REPORT`): each names the local HCA and port of one QP, so a slow
//! or stalled rail is named by the job that suffered it.
//!
//! The three formats, as the real `libnccl.so.2` 2.32.3 holds them (its
//! `transport/net_ib/wqe_lat_mon.cc`; `prober/tests/wqe_real_format.rs` reads them out of the
//! library and parses lines filled from them):
//!
//! * [`SLOW`]: `NET/IB: WQE slow: peer=%s | local: qpn=%u dev=%s port=%u lid=%u localGid=%s |
//!   remote: qpn=%u port=%u lid=%u remoteGid=%s | thr=%luns delta=%luns mean=%.0fns
//!   stddev=%.0fns p50=%luns p90=%luns p99=%luns p99.9=%luns max=%luns count=%lu | t_post=%lu
//!   t_poll=%lu` — one completion took longer than the threshold;
//! * [`STALL`]: `NET/IB: WQE stall (no CQE): peer=%s | local: qpn=%u dev=%s port=%u lid=%u
//!   localGid=%s | remote: qpn=%u port=%u lid=%u remoteGid=%s | stall_thr=%luns age=%luns
//!   inflight=%u` — a posted work request has had no completion for `age`;
//! * [`SUMMARY`]: `NET/IB: WQE latency summary [%s peer=%s dev=%s qpn=%u port=%u]: n=%lu
//!   slow=%lu thr=%luns | post-to-poll ns: mean=%.0f std=%.0f p50=%lu p90=%lu p99=%lu
//!   p99.9=%lu max=%lu` — one QP's totals when its communicator closes.
//!
//! A line is read as `key=value` fields; `local:` and `remote:` open the two sides of the QP
//! and only the local side names our rail. A line cut short or with a junk number is an
//! [`WqeLineError`] that names the field, never a zero.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// The slow-completion line's prefix.
pub const SLOW: &str = "NET/IB: WQE slow: ";
/// The stalled-request line's prefix.
pub const STALL: &str = "NET/IB: WQE stall (no CQE): ";
/// The per-QP summary's prefix.
pub const SUMMARY: &str = "NET/IB: WQE latency summary [";

/// At most this many distinct unreadable lines are kept (one broken logger repeats itself).
pub const MAX_UNREADABLE: usize = 32;

/// One completion slower than the threshold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WqeSlow {
    pub peer: String,
    /// `dev:port` of the local side.
    pub rail: String,
    pub qpn: u32,
    pub threshold_ns: u64,
    /// This completion's post-to-poll time.
    pub delta_ns: u64,
    pub max_ns: u64,
    /// Completions the QP has had so far.
    pub count: u64,
}

/// A posted work request without a completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WqeStall {
    pub peer: String,
    pub rail: String,
    pub qpn: u32,
    pub stall_threshold_ns: u64,
    pub age_ns: u64,
    pub inflight: u64,
}

/// One QP's totals at close.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WqeSummary {
    /// The bracket's first word, as NCCL prints it (the QP's role).
    pub role: String,
    pub peer: String,
    pub rail: String,
    pub qpn: u32,
    pub completions: u64,
    pub slow: u64,
    pub threshold_ns: u64,
    pub max_ns: u64,
}

/// One WQE latency line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WqeLine {
    Slow(WqeSlow),
    Stall(WqeStall),
    Summary(WqeSummary),
}

/// Why a WQE latency line could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WqeLineError {
    #[error("unreadable NCCL WQE latency line (no {field}): {line}")]
    Missing { field: &'static str, line: String },
    #[error("unreadable NCCL WQE latency line ({field} is not a number: {value:?}): {line}")]
    NotANumber {
        field: &'static str,
        value: String,
        line: String,
    },
}

/// The `key=value` fields of a line; the local side's keys bare, the remote side's with a
/// `remote.` prefix.
struct Fields<'a> {
    line: &'a str,
    map: BTreeMap<String, &'a str>,
}

impl<'a> Fields<'a> {
    fn of(line: &'a str, body: &'a str) -> Self {
        let mut map = BTreeMap::new();
        // `|` separates the sections; `remote:` opens the only one whose keys are not ours.
        for section in body.split('|') {
            let section = section.trim_start();
            let (remote, section) = match section.strip_prefix("remote:") {
                Some(rest) => (true, rest),
                None => (false, section.strip_prefix("local:").unwrap_or(section)),
            };
            for token in section.split(|c: char| c.is_whitespace() || c == ']') {
                let Some((k, v)) = token.split_once('=') else {
                    continue;
                };
                let key = if remote {
                    format!("remote.{k}")
                } else {
                    k.to_string()
                };
                // The first wins: a later `key=` in free text does not replace it.
                map.entry(key).or_insert(v);
            }
        }
        Fields { line, map }
    }

    fn text(&self, field: &'static str) -> Result<&'a str, WqeLineError> {
        match self.map.get(field) {
            Some(v) if !v.is_empty() => Ok(*v),
            _ => Err(WqeLineError::Missing {
                field,
                line: self.line.to_string(),
            }),
        }
    }

    /// A number, with the `ns` unit some fields carry dropped.
    fn number(&self, field: &'static str) -> Result<u64, WqeLineError> {
        let v = self.text(field)?;
        v.strip_suffix("ns")
            .unwrap_or(v)
            .parse()
            .map_err(|_| WqeLineError::NotANumber {
                field,
                value: v.to_string(),
                line: self.line.to_string(),
            })
    }

    fn rail(&self) -> Result<String, WqeLineError> {
        Ok(format!("{}:{}", self.text("dev")?, self.number("port")?))
    }

    fn qpn(&self) -> Result<u32, WqeLineError> {
        let n = self.number("qpn")?;
        u32::try_from(n).map_err(|_| WqeLineError::NotANumber {
            field: "qpn",
            value: n.to_string(),
            line: self.line.to_string(),
        })
    }
}

/// Reads an NCCL message (the text after `NCCL INFO ` or `NCCL WARN `): `None` when it is
/// not a WQE latency line.
pub fn parse_wqe_line(msg: &str) -> Option<Result<WqeLine, WqeLineError>> {
    let msg = msg.trim();
    // Matched without the prefixes' trailing space, which a trimmed line cut there lacks.
    if let Some(body) = msg.strip_prefix(SLOW.trim_end()) {
        Some(slow(&Fields::of(msg, body)))
    } else if let Some(body) = msg.strip_prefix(STALL.trim_end()) {
        Some(stall(&Fields::of(msg, body)))
    } else {
        let body = msg.strip_prefix(SUMMARY)?;
        let role = body
            .split_whitespace()
            .next()
            .filter(|r| !r.contains('='))
            .unwrap_or_default();
        Some(summary(role, &Fields::of(msg, body)))
    }
}

fn slow(f: &Fields<'_>) -> Result<WqeLine, WqeLineError> {
    // The last field: a line cut short loses it first.
    f.number("t_poll")?;
    Ok(WqeLine::Slow(WqeSlow {
        peer: f.text("peer")?.to_string(),
        rail: f.rail()?,
        qpn: f.qpn()?,
        threshold_ns: f.number("thr")?,
        delta_ns: f.number("delta")?,
        max_ns: f.number("max")?,
        count: f.number("count")?,
    }))
}

fn stall(f: &Fields<'_>) -> Result<WqeLine, WqeLineError> {
    Ok(WqeLine::Stall(WqeStall {
        peer: f.text("peer")?.to_string(),
        rail: f.rail()?,
        qpn: f.qpn()?,
        stall_threshold_ns: f.number("stall_thr")?,
        age_ns: f.number("age")?,
        inflight: f.number("inflight")?,
    }))
}

fn summary(role: &str, f: &Fields<'_>) -> Result<WqeLine, WqeLineError> {
    Ok(WqeLine::Summary(WqeSummary {
        role: role.to_string(),
        peer: f.text("peer")?.to_string(),
        rail: f.rail()?,
        qpn: f.qpn()?,
        completions: f.number("n")?,
        slow: f.number("slow")?,
        threshold_ns: f.number("thr")?,
        max_ns: f.number("max")?,
    }))
}

/// What the WQE lines say about one local HCA port. Keys are a contract (`analyze --json`,
/// key `wqe`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PortWqe {
    /// `WQE slow` lines.
    pub slow_lines: u64,
    /// `WQE stall` lines.
    pub stall_lines: u64,
    /// The oldest stalled request's age.
    pub worst_stall_age_ns: Option<u64>,
    /// The slowest completion any line reports.
    pub max_ns: Option<u64>,
    /// Completions the summaries count.
    pub completions: u64,
    /// Slow completions the summaries count.
    pub slow_completions: u64,
    /// Distinct local QPs the lines name.
    pub qps: usize,
    #[serde(skip)]
    qp_set: BTreeSet<u32>,
}

impl PortWqe {
    /// Whether any line shows this port slow.
    pub fn slow(&self) -> bool {
        self.slow_lines > 0 || self.slow_completions > 0
    }

    fn qp(&mut self, qpn: u32) {
        self.qp_set.insert(qpn);
        self.qps = self.qp_set.len();
    }

    fn max(&mut self, ns: u64) {
        self.max_ns = Some(self.max_ns.map_or(ns, |m| m.max(ns)));
    }
}

/// Every WQE latency line of one or more logs, by local port (`mlx5_0:1`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WqeReport {
    pub ports: BTreeMap<String, PortWqe>,
    /// Lines that began as WQE lines and could not be read (at most [`MAX_UNREADABLE`]).
    pub unreadable: Vec<String>,
}

impl WqeReport {
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && self.unreadable.is_empty()
    }

    /// Takes one NCCL message in; `false` when it is not a WQE latency line.
    pub fn read_line(&mut self, msg: &str) -> bool {
        let Some(parsed) = parse_wqe_line(msg) else {
            return false;
        };
        match parsed {
            Err(e) => {
                let e = e.to_string();
                if self.unreadable.len() < MAX_UNREADABLE && !self.unreadable.contains(&e) {
                    self.unreadable.push(e);
                }
            }
            Ok(WqeLine::Slow(s)) => {
                let p = self.ports.entry(s.rail).or_default();
                p.slow_lines += 1;
                p.max(s.delta_ns.max(s.max_ns));
                p.qp(s.qpn);
            }
            Ok(WqeLine::Stall(s)) => {
                let p = self.ports.entry(s.rail).or_default();
                p.stall_lines += 1;
                p.worst_stall_age_ns =
                    Some(p.worst_stall_age_ns.map_or(s.age_ns, |a| a.max(s.age_ns)));
                p.qp(s.qpn);
            }
            Ok(WqeLine::Summary(s)) => {
                let p = self.ports.entry(s.rail).or_default();
                p.completions += s.completions;
                p.slow_completions += s.slow;
                p.max(s.max_ns);
                p.qp(s.qpn);
            }
        }
        true
    }
}

/// Pure: the rails the WQE lines blame, each with its reason. A stall blames its port
/// outright (a request the HCA never completed). Slow completions blame a port only while a
/// sibling port the lines also name had none: slow on every port is the peer's or the
/// fabric's doing, not one rail's.
pub fn wqe_faults(report: &WqeReport) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let clean_sibling = report
        .ports
        .iter()
        .find(|(_, p)| !p.slow() && p.stall_lines == 0)
        .map(|(rail, _)| rail.as_str());
    for (rail, p) in &report.ports {
        if p.stall_lines > 0 {
            out.push((
                rail.clone(),
                format!(
                    "NCCL WQE stall on {rail}: a work request had no completion for {} ns ({} stall lines)",
                    p.worst_stall_age_ns.unwrap_or_default(),
                    p.stall_lines
                ),
            ));
        } else if p.slow() {
            if let Some(sibling) = clean_sibling {
                out.push((
                    rail.clone(),
                    format!(
                        "NCCL WQE slow completions on {rail} ({} lines, {} of {} completions in summaries, max {} ns) while {sibling} had none",
                        p.slow_lines,
                        p.slow_completions,
                        p.completions,
                        p.max_ns.unwrap_or_default()
                    ),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOW_LINE: &str = "NET/IB: WQE slow: peer=10.0.0.2<43211> | local: qpn=1234 dev=mlx5_3 port=1 lid=0 localGid=fe80::1 | remote: qpn=999 port=1 lid=0 remoteGid=fe80::2 | thr=100000ns delta=250000ns mean=12000ns stddev=3000ns p50=11000ns p90=15000ns p99=90000ns p99.9=200000ns max=250000ns count=4096 | t_post=1000 t_poll=251000";
    const STALL_LINE: &str = "NET/IB: WQE stall (no CQE): peer=10.0.0.2<43211> | local: qpn=77 dev=mlx5_1 port=1 lid=0 localGid=fe80::1 | remote: qpn=88 port=2 lid=0 remoteGid=fe80::2 | stall_thr=1000000000ns age=3500000000ns inflight=4";
    const SUMMARY_LINE: &str = "NET/IB: WQE latency summary [send peer=10.0.0.2<43211> dev=mlx5_0 qpn=55 port=1]: n=100000 slow=0 thr=100000ns | post-to-poll ns: mean=9000 std=1000 p50=8800 p90=9900 p99=12000 p99.9=30000 max=41000";

    #[test]
    fn the_three_lines_name_the_local_port() {
        let Some(Ok(WqeLine::Slow(s))) = parse_wqe_line(SLOW_LINE) else {
            panic!("slow line not read");
        };
        assert_eq!(
            (s.rail.as_str(), s.qpn, s.delta_ns, s.count),
            ("mlx5_3:1", 1234, 250_000, 4096)
        );
        let Some(Ok(WqeLine::Stall(s))) = parse_wqe_line(STALL_LINE) else {
            panic!("stall line not read");
        };
        // The remote side's port 2 is not ours.
        assert_eq!(
            (s.rail.as_str(), s.age_ns, s.inflight),
            ("mlx5_1:1", 3_500_000_000, 4)
        );
        let Some(Ok(WqeLine::Summary(s))) = parse_wqe_line(SUMMARY_LINE) else {
            panic!("summary not read");
        };
        assert_eq!(
            (s.role.as_str(), s.rail.as_str(), s.completions, s.max_ns),
            ("send", "mlx5_0:1", 100_000, 41_000)
        );
        assert_eq!(parse_wqe_line("NET/IB : Using [0]mlx5_0:1/IB"), None);
    }

    #[test]
    fn a_line_cut_short_names_what_is_missing() {
        let cut = &SLOW_LINE[..SLOW_LINE.find("count=").unwrap()];
        let err = parse_wqe_line(cut).unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                WqeLineError::Missing {
                    field: "t_poll",
                    ..
                }
            ),
            "{err}"
        );
        let junk = STALL_LINE.replace("age=3500000000ns", "age=35x0ns");
        let err = parse_wqe_line(&junk).unwrap().unwrap_err();
        assert!(err.to_string().contains("age is not a number"), "{err}");
    }

    #[test]
    fn a_stall_blames_its_port_and_slowness_needs_a_clean_sibling() {
        let mut r = WqeReport::default();
        for l in [SLOW_LINE, STALL_LINE, SUMMARY_LINE] {
            assert!(r.read_line(l));
        }
        let faults = wqe_faults(&r);
        let rails: Vec<&str> = faults.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(rails, vec!["mlx5_1:1", "mlx5_3:1"]);
        assert!(
            faults[1].1.contains("while mlx5_0:1 had none"),
            "{}",
            faults[1].1
        );

        // Slow everywhere: no rail is to blame.
        let mut all_slow = WqeReport::default();
        all_slow.read_line(SLOW_LINE);
        all_slow.read_line(&SLOW_LINE.replace("dev=mlx5_3", "dev=mlx5_2"));
        assert_eq!(all_slow.ports.len(), 2);
        assert!(wqe_faults(&all_slow).is_empty());
    }
}
