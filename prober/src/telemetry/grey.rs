//! The grey-rail judge (issue #45 item 3): a rail that still links up but has gone bad under
//! the job's own traffic. Pure: one window of every rail's rates in, the rails that turned
//! grey or were lifted out.
//!
//! What counts as a window's evidence against a rail:
//!
//! * **Symmetry** (rails the job uses only). In a rail-optimized job NCCL spreads every
//!   collective over all its rails' channels, so the rails it uses carry about the same bytes
//!   each second. Among the used rails (at least [`MIN_SIBLINGS`]), a rail is a robust
//!   outlier when it is more than `outlier_spreads` spreads from the siblings' median, low in
//!   throughput or high in `port_xmit_wait` or retransmits. Median and spread are the fleet
//!   controller's ([`railguard_fleet::median`], [`railguard_fleet::MAD_SCALE`] × MAD, floored
//!   at `min_spread_percent` of the median so that near-identical rails never make a tiny
//!   spread). A rail is "used" while it carried at least `min_used_bytes_per_second` in one of
//!   the last `usage_memory_windows` windows: a rail that falls silent mid-job stays in the
//!   comparison, a rail the job never used is never judged by it. Symmetry is judged only in
//!   windows where at least [`MIN_SIBLINGS`] rails carry traffic at once, so tests that drive
//!   one rail after another are never read as a job's collectives (the daemon also pauses
//!   the judge during its own invasive runs).
//! * **Absolute signals** (any rail): retransmits ([`RETRANSMIT_COUNTERS`]) or port error
//!   counters growing past a burst threshold within one window. (NCCL's WQE stall lines are
//!   read by `analyze`, [`crate::nccl::wqe`]; the daemon does not see the job's logs.)
//!
//! A rail turns grey after `fail_after_windows` windows in a row with evidence, and is
//! lifted after `lift_after_windows` clean windows in a row (damped: one clean second after a
//! flapping link is not health). A window without data for a rail changes nothing for it.

use std::collections::BTreeMap;
use std::sync::Arc;

use railguard_fleet::{median, MAD_SCALE};

use super::{RailRates, PORT_ERROR_COUNTERS};

/// Symmetry needs at least this many used rails: with two, which one is the outlier?
pub const MIN_SIBLINGS: usize = 3;

/// `hw_counters/` that count retransmission or its causes (a lost or out-of-order packet),
/// as the kernel drivers name them. mlx5 (`drivers/infiniband/hw/mlx5/counters.c`,
/// `out_of_seq_q_cnts`, `retrans_q_cnts`, `extended_err_cnts`): `out_of_sequence`,
/// `packet_seq_err`, `implied_nak_seq_err`, `local_ack_timeout_err`, `duplicate_request`,
/// `roce_adp_retrans`, `roce_adp_retrans_to`. rxe (`drivers/infiniband/sw/rxe/
/// rxe_hw_counters.c`): `completer_retry_err` (the requester resending after a timeout or a
/// NAK), `rcvd_seq_err`, `out_of_seq_request`, `duplicate_request`, `retry_exceeded_err`.
pub const RETRANSMIT_COUNTERS: &[&str] = &[
    "out_of_sequence",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "duplicate_request",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "completer_retry_err",
    "rcvd_seq_err",
    "out_of_seq_request",
    "retry_exceeded_err",
];

/// The judge's settings (the daemon's `--grey-*` flags).
#[derive(Clone, Debug, PartialEq)]
pub struct GreyPolicy {
    /// Windows in a row with evidence before a rail turns grey (N).
    pub fail_after_windows: u32,
    /// Clean windows in a row before a grey rail is lifted (M).
    pub lift_after_windows: u32,
    /// How far from the siblings' median, in spreads, a rail is an outlier.
    pub outlier_spreads: f64,
    /// The spread's floor, percent of the median.
    pub min_spread_percent: f64,
    /// A rail carrying at least this (sent + received) counts as used.
    pub min_used_bytes_per_second: f64,
    /// The same for a rail whose driver counts packets only (rxe).
    pub min_used_packets_per_second: f64,
    /// How long a rail stays used after its traffic stops, windows.
    pub usage_memory_windows: u32,
    /// Retransmits within one window that are evidence on any rail.
    pub retransmit_burst: u64,
    /// Port error counter growth within one window that is evidence on any rail.
    pub error_burst: u64,
    /// `port_xmit_wait` ticks per second below which no rail is a wait outlier.
    pub min_wait_per_second: f64,
}

impl Default for GreyPolicy {
    fn default() -> Self {
        GreyPolicy {
            fail_after_windows: 3,
            lift_after_windows: 30,
            outlier_spreads: 4.0,
            min_spread_percent: 5.0,
            min_used_bytes_per_second: 1024.0 * 1024.0,
            // 1 MiB/s in 4 KiB packets.
            min_used_packets_per_second: 256.0,
            usage_memory_windows: 30,
            retransmit_burst: 10,
            error_burst: 1,
            min_wait_per_second: 1000.0,
        }
    }
}

/// One rail's traffic over one window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RailWindow {
    pub rail: Arc<str>,
    /// Sent + received bytes per second (`port_xmit_data`, `port_rcv_data`); `None` where
    /// either has no rate this tick (absent, unreadable, reset).
    pub bytes_per_second: Option<f64>,
    /// Sent + received packets per second, from `counters/` or else rxe's `sent_pkts` and
    /// `rcvd_pkts`: the throughput rxe has, which keeps no data counters.
    pub packets_per_second: Option<f64>,
    pub xmit_wait_per_second: Option<f64>,
    /// Growth of the [`RETRANSMIT_COUNTERS`] present, by name.
    pub retransmits: Vec<(Arc<str>, u64)>,
    /// Growth of the port error counters, by name.
    pub errors: Vec<(Arc<str>, u64)>,
}

/// Sent + received, only where both were read this tick: one side alone (a counter reset,
/// a read that failed) would look like a rail at half its siblings' traffic.
fn both(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? + b?)
}

impl RailWindow {
    /// The window of one rail's rates (a tick of the telemetry task).
    pub fn of(r: &RailRates) -> Self {
        let hw_rate = |name: &str| {
            r.hw_rates
                .iter()
                .find(|(n, _)| &**n == name)
                .map(|(_, v)| *v)
        };
        RailWindow {
            rail: r.rail.clone(),
            bytes_per_second: both(r.tx_bytes_per_second, r.rx_bytes_per_second),
            packets_per_second: both(r.tx_packets_per_second, r.rx_packets_per_second)
                .or_else(|| both(hw_rate("sent_pkts"), hw_rate("rcvd_pkts"))),
            xmit_wait_per_second: r.xmit_wait_per_second,
            retransmits: r
                .hw_deltas
                .iter()
                .filter(|(n, d)| *d > 0 && RETRANSMIT_COUNTERS.contains(&&**n))
                .cloned()
                .collect(),
            errors: r
                .error_deltas
                .iter()
                .filter(|(n, d)| *d > 0 && PORT_ERROR_COUNTERS.contains(&&**n))
                .cloned()
                .collect(),
        }
    }

    /// Whether the rail carries traffic in this window (the policy's floors).
    pub fn carries(&self, p: &GreyPolicy) -> bool {
        match (self.bytes_per_second, self.packets_per_second) {
            (Some(b), _) => b >= p.min_used_bytes_per_second,
            (None, Some(n)) => n >= p.min_used_packets_per_second,
            (None, None) => false,
        }
    }

    fn has_data(&self) -> bool {
        self.bytes_per_second.is_some() || self.packets_per_second.is_some()
    }

    fn retransmit_total(&self) -> u64 {
        self.retransmits.iter().map(|(_, d)| d).sum()
    }

    fn error_total(&self) -> u64 {
        self.errors.iter().map(|(_, d)| d).sum()
    }
}

/// The median and the robust spread of `values`, as the fleet reckons them.
fn robust(values: &[f64], min_spread_percent: f64, floor: f64) -> Option<(f64, f64)> {
    let mut v = values.to_vec();
    let med = median(&mut v)?;
    let mut dev: Vec<f64> = values.iter().map(|x| (x - med).abs()).collect();
    let mad = median(&mut dev).unwrap_or(0.0);
    let spread = (MAD_SCALE * mad)
        .max(med.abs() * min_spread_percent / 100.0)
        .max(floor);
    (spread > 0.0 && spread.is_finite()).then_some((med, spread))
}

fn fmt_rate(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2} k", v / 1e3)
    } else {
        format!("{v:.0} ")
    }
}

fn counts(list: &[(Arc<str>, u64)]) -> String {
    list.iter()
        .map(|(n, d)| format!("{n} +{d}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Pure: each rail's evidence in one window. `used` says which rails the job uses now.
pub fn window_evidence(
    policy: &GreyPolicy,
    windows: &[RailWindow],
    used: &dyn Fn(&RailWindow) -> bool,
) -> BTreeMap<Arc<str>, Vec<String>> {
    let mut out: BTreeMap<Arc<str>, Vec<String>> = BTreeMap::new();
    let mut note = |rail: &Arc<str>, why: String| out.entry(rail.clone()).or_default().push(why);
    for w in windows {
        let retrans = w.retransmit_total();
        if retrans >= policy.retransmit_burst {
            note(
                &w.rail,
                format!(
                    "{retrans} retransmits in one window ({}; burst threshold {})",
                    counts(&w.retransmits),
                    policy.retransmit_burst
                ),
            );
        }
        let errors = w.error_total();
        if errors >= policy.error_burst {
            note(
                &w.rail,
                format!(
                    "port error counters grew in one window ({})",
                    counts(&w.errors)
                ),
            );
        }
    }
    let siblings: Vec<&RailWindow> = windows.iter().filter(|w| w.has_data() && used(w)).collect();
    // Symmetry only while the job drives several rails at once: a test that exercises one
    // rail after another (ib_write_bw, a campaign's pair tests) is not a job's collective.
    let carrying = siblings.iter().filter(|w| w.carries(policy)).count();
    if siblings.len() < MIN_SIBLINGS || carrying < MIN_SIBLINGS {
        return out;
    }
    // Bytes where every sibling has them; packets (rxe) where every sibling has those.
    let (throughput, unit): (Vec<Option<f64>>, &str) =
        if siblings.iter().all(|w| w.bytes_per_second.is_some()) {
            (siblings.iter().map(|w| w.bytes_per_second).collect(), "B/s")
        } else {
            (
                siblings.iter().map(|w| w.packets_per_second).collect(),
                "pkt/s",
            )
        };
    let n = siblings.len();
    if throughput.iter().all(Option::is_some) {
        let values: Vec<f64> = throughput.iter().flatten().copied().collect();
        if let Some((med, spread)) = robust(&values, policy.min_spread_percent, 0.0) {
            for (w, v) in siblings.iter().zip(&values) {
                let d = (med - v) / spread;
                if d > policy.outlier_spreads {
                    note(
                        &w.rail,
                        format!(
                            "throughput {}{unit}, {d:.1} spreads below the median {}{unit} of {n} used rails",
                            fmt_rate(*v),
                            fmt_rate(med)
                        ),
                    );
                }
            }
        }
    }
    let mut high_outliers = |what: &str, values: Vec<Option<f64>>, floor: f64| {
        if !values.iter().all(Option::is_some) {
            return;
        }
        let values: Vec<f64> = values.into_iter().flatten().collect();
        let Some((med, spread)) = robust(&values, policy.min_spread_percent, floor) else {
            return;
        };
        for (w, v) in siblings.iter().zip(&values) {
            let d = (v - med) / spread;
            if d > policy.outlier_spreads {
                note(
                    &w.rail,
                    format!(
                        "{what} {}/s, {d:.1} spreads above the median {}/s of {n} used rails",
                        fmt_rate(*v).trim_end(),
                        fmt_rate(med).trim_end()
                    ),
                );
            }
        }
    };
    high_outliers(
        "port_xmit_wait",
        siblings.iter().map(|w| w.xmit_wait_per_second).collect(),
        policy.min_wait_per_second,
    );
    high_outliers(
        "retransmits",
        siblings
            .iter()
            .map(|w| Some(w.retransmit_total() as f64))
            .collect(),
        policy.retransmit_burst as f64 / 4.0,
    );
    out
}

#[derive(Clone, Debug, Default)]
struct RailState {
    bad: u32,
    clean: u32,
    /// The evidence it turned grey on.
    grey: Option<String>,
    /// The window the rail last carried traffic.
    last_used: Option<u64>,
}

/// A rail's change of state in one window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GreyChange {
    /// Turned grey: the evidence, with how many windows in a row it held.
    Failed { rail: Arc<str>, evidence: String },
    /// Lifted after enough clean windows.
    Lifted { rail: Arc<str> },
}

/// The judge's memory across windows.
#[derive(Clone, Debug)]
pub struct GreyRailJudge {
    policy: GreyPolicy,
    rails: BTreeMap<Arc<str>, RailState>,
    window: u64,
}

impl GreyRailJudge {
    pub fn new(policy: GreyPolicy) -> Self {
        GreyRailJudge {
            policy,
            rails: BTreeMap::new(),
            window: 0,
        }
    }

    pub fn policy(&self) -> &GreyPolicy {
        &self.policy
    }

    /// Takes one window in; returns the rails that turned grey or were lifted in it.
    pub fn judge(&mut self, windows: &[RailWindow]) -> Vec<GreyChange> {
        self.window += 1;
        let now = self.window;
        let p = &self.policy;
        for w in windows {
            let s = self.rails.entry(w.rail.clone()).or_default();
            if w.carries(p) {
                s.last_used = Some(now);
            }
        }
        let memory = u64::from(p.usage_memory_windows);
        let rails = &self.rails;
        let used = |w: &RailWindow| {
            rails
                .get(&w.rail)
                .and_then(|s| s.last_used)
                .is_some_and(|at| now - at < memory.max(1))
        };
        let mut evidence = window_evidence(p, windows, &used);
        let mut changes = Vec::new();
        for w in windows.iter().filter(|w| w.has_data()) {
            let Some(s) = self.rails.get_mut(&w.rail) else {
                continue;
            };
            match evidence.remove(&w.rail) {
                Some(why) => {
                    s.bad += 1;
                    s.clean = 0;
                    if s.grey.is_none() && s.bad >= p.fail_after_windows {
                        let e = format!("grey for {} windows in a row: {}", s.bad, why.join("; "));
                        s.grey = Some(e.clone());
                        changes.push(GreyChange::Failed {
                            rail: w.rail.clone(),
                            evidence: e,
                        });
                    }
                }
                None => {
                    s.clean += 1;
                    s.bad = 0;
                    if s.grey.is_some() && s.clean >= p.lift_after_windows {
                        s.grey = None;
                        changes.push(GreyChange::Lifted {
                            rail: w.rail.clone(),
                        });
                    }
                }
            }
        }
        changes
    }

    /// Forgets which rails carried traffic and every streak (the grey verdicts stay): after
    /// traffic that was not a job's (the daemon's own invasive run).
    pub fn forget_traffic(&mut self) {
        for s in self.rails.values_mut() {
            s.last_used = None;
            s.bad = 0;
            s.clean = 0;
        }
    }

    /// The rails grey now, with the evidence each turned grey on.
    pub fn grey(&self) -> BTreeMap<String, String> {
        self.rails
            .iter()
            .filter_map(|(r, s)| s.grey.as_ref().map(|e| (r.to_string(), e.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(rail: &str, gbytes: f64) -> RailWindow {
        RailWindow {
            rail: rail.into(),
            bytes_per_second: Some(gbytes * 1e9),
            xmit_wait_per_second: Some(0.0),
            ..RailWindow::default()
        }
    }

    fn eight(slow: Option<(usize, f64)>) -> Vec<RailWindow> {
        (0..8)
            .map(|i| {
                let gb = match slow {
                    Some((at, v)) if at == i => v,
                    _ => 45.0 + (i as f64) * 0.3,
                };
                window(&format!("mlx5_{i}:1"), gb)
            })
            .collect()
    }

    #[test]
    fn symmetric_rails_are_clean_and_a_slow_one_is_an_outlier() {
        let p = GreyPolicy::default();
        let all = |_: &RailWindow| true;
        assert!(window_evidence(&p, &eight(None), &all).is_empty());
        let e = window_evidence(&p, &eight(Some((3, 20.0))), &all);
        assert_eq!(e.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["mlx5_3:1"]);
        assert!(
            e.values().next().unwrap()[0].contains("spreads below the median"),
            "{e:?}"
        );
        // 10% below its siblings is within the spread floor's reach: no blame.
        assert!(window_evidence(&p, &eight(Some((3, 41.0))), &all).is_empty());
    }

    #[test]
    fn rails_the_job_does_not_use_are_not_judged_by_symmetry() {
        let p = GreyPolicy::default();
        let mut w = eight(None);
        w[7].bytes_per_second = Some(0.0);
        let used = |x: &RailWindow| &*x.rail != "mlx5_7:1";
        assert!(window_evidence(&p, &w, &used).is_empty());
        // Two used rails are too few to name an outlier.
        let two = |x: &RailWindow| ["mlx5_0:1", "mlx5_7:1"].contains(&&*x.rail);
        assert!(window_evidence(&p, &w, &two).is_empty());
    }

    #[test]
    fn one_rail_after_another_is_not_a_job() {
        let mut j = GreyRailJudge::new(GreyPolicy::default());
        // ib_write_bw on each rail in turn: at most one carries at a time.
        for round in 0..40 {
            let mut w: Vec<RailWindow> = (0..8)
                .map(|i| window(&format!("mlx5_{i}:1"), 0.0))
                .collect();
            w[round % 8].bytes_per_second = Some(48e9);
            assert!(j.judge(&w).is_empty(), "round {round}: {:?}", j.grey());
        }
    }

    #[test]
    fn a_retransmit_burst_counts_on_any_rail() {
        let p = GreyPolicy::default();
        let mut w = vec![window("rxe0:1", 0.0)];
        w[0].retransmits = vec![("completer_retry_err".into(), 40)];
        let e = window_evidence(&p, &w, &|_| false);
        assert!(e["rxe0:1"][0].contains("40 retransmits"), "{e:?}");
    }

    #[test]
    fn a_rail_turns_grey_after_n_windows_and_is_lifted_after_m_clean_ones() {
        let p = GreyPolicy {
            fail_after_windows: 3,
            lift_after_windows: 5,
            ..GreyPolicy::default()
        };
        let mut j = GreyRailJudge::new(p);
        for _ in 0..10 {
            assert!(j.judge(&eight(None)).is_empty());
        }
        // A single bad window (a job's phase change) is not enough.
        assert!(j.judge(&eight(Some((2, 5.0)))).is_empty());
        assert!(j.judge(&eight(None)).is_empty());
        assert!(j.judge(&eight(Some((2, 5.0)))).is_empty());
        assert!(j.judge(&eight(Some((2, 5.0)))).is_empty());
        let c = j.judge(&eight(Some((2, 5.0))));
        assert!(
            matches!(&c[..], [GreyChange::Failed { rail, evidence }] if &**rail == "mlx5_2:1" && evidence.starts_with("grey for 3 windows")),
            "{c:?}"
        );
        assert_eq!(j.grey().len(), 1);
        // The rail falls silent: it was used a moment ago, so it stays judged (and grey).
        for _ in 0..4 {
            assert!(j.judge(&eight(Some((2, 0.0)))).is_empty());
        }
        for _ in 0..4 {
            assert!(j.judge(&eight(None)).is_empty());
        }
        assert_eq!(
            j.judge(&eight(None)),
            vec![GreyChange::Lifted {
                rail: "mlx5_2:1".into()
            }]
        );
        assert!(j.grey().is_empty());
    }

    #[test]
    fn the_window_of_rxe_rates_uses_its_packet_counters() {
        let r = RailRates {
            rail: "rxe0:1".into(),
            hw_rates: vec![("sent_pkts".into(), 100.0), ("rcvd_pkts".into(), 50.0)],
            hw_deltas: vec![("completer_retry_err".into(), 3), ("rdma_sends".into(), 9)],
            ..RailRates::default()
        };
        let w = RailWindow::of(&r);
        assert_eq!(w.bytes_per_second, None);
        assert_eq!(w.packets_per_second, Some(150.0));
        // One side reset this tick: no throughput at all, never half of it.
        let half = RailRates {
            rail: "mlx5_0:1".into(),
            tx_bytes_per_second: Some(4e10),
            ..RailRates::default()
        };
        assert_eq!(RailWindow::of(&half).bytes_per_second, None);
        assert_eq!(
            w.retransmits,
            vec![(Arc::<str>::from("completer_retry_err"), 3)]
        );
    }
}
