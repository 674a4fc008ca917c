//! The daemon's passive rail telemetry task (issue #45 items 1 and 3): every
//! `--telemetry-interval-ms` it reads each rail's counters ([`railguard_prober::telemetry`]),
//! publishes per-rail rates on the daemon's metrics registry, and feeds each tick to the
//! grey-rail judge ([`railguard_prober::telemetry::grey`]). With `--grey-rails enforce` a rail
//! the judge turns grey (or lifts) wakes the certification loop for a prompt passive check,
//! which fails the rail with fault `grey` (and so taints it); with `observe` (the default)
//! the judge only logs and sets `railguard_prober_rail_grey`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use railguard_prober::certify::renewal::TrafficTally;
use railguard_prober::telemetry::grey::{GreyChange, GreyRailJudge, RailWindow};
use railguard_prober::telemetry::{rates, Rail, RailCounterReader, RailRates, Sample};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RailLabel {
    rail: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RailCounterLabels {
    rail: String,
    counter: String,
}

type F64Gauge = Gauge<f64, AtomicU64>;

/// The telemetry metrics (registered under the daemon's `railguard_prober` prefix).
#[derive(Clone, Default)]
pub struct TelemetryMetrics {
    tx_bytes: Family<RailLabel, F64Gauge>,
    rx_bytes: Family<RailLabel, F64Gauge>,
    tx_packets: Family<RailLabel, F64Gauge>,
    rx_packets: Family<RailLabel, F64Gauge>,
    xmit_wait: Family<RailLabel, F64Gauge>,
    errors: Family<RailCounterLabels, Counter>,
    hw_rate: Family<RailCounterLabels, F64Gauge>,
    hw_total: Family<RailCounterLabels, Counter>,
    resets: Family<RailCounterLabels, Counter>,
    read_errors: Family<RailCounterLabels, Counter>,
    grey: Family<RailLabel, Gauge>,
    ticks: Counter,
}

impl TelemetryMetrics {
    /// Registers the metrics on `registry` and returns their handles.
    pub fn register(registry: &mut Registry) -> Self {
        let m = TelemetryMetrics::default();
        let gauges = [
            ("rail_tx_bytes_per_second", "Bytes sent per second per rail (port_xmit_data × 4), passive telemetry", &m.tx_bytes),
            ("rail_rx_bytes_per_second", "Bytes received per second per rail (port_rcv_data × 4), passive telemetry", &m.rx_bytes),
            ("rail_tx_packets_per_second", "Packets sent per second per rail (port_xmit_packets), passive telemetry", &m.tx_packets),
            ("rail_rx_packets_per_second", "Packets received per second per rail (port_rcv_packets), passive telemetry", &m.rx_packets),
            ("rail_xmit_wait_per_second", "port_xmit_wait ticks per second per rail (data to send, no credits: congestion), passive telemetry", &m.xmit_wait),
        ];
        for (name, help, g) in gauges {
            registry.register(name, help, g.clone());
        }
        registry.register(
            "rail_errors",
            "Port error counter growth per rail (counters/: symbol_error, link_downed, ...) since the daemon started, passive telemetry",
            m.errors.clone(),
        );
        registry.register(
            "rail_hw_counter_rate",
            "Driver counter (hw_counters/: retransmits, timeouts, sequence errors, CNPs, ...) growth per second per rail, passive telemetry",
            m.hw_rate.clone(),
        );
        registry.register(
            "rail_hw_counter",
            "Driver counter (hw_counters/) growth per rail since the daemon started, passive telemetry",
            m.hw_total.clone(),
        );
        registry.register(
            "rail_counter_resets",
            "Times a rail's counter went down between two telemetry ticks (reset or wrap; no rate that tick)",
            m.resets.clone(),
        );
        registry.register(
            "rail_telemetry_read_errors",
            "Telemetry reads of a rail's counter file that failed or were not a number",
            m.read_errors.clone(),
        );
        registry.register(
            "rail_grey",
            "1 while the grey-rail judge holds the rail grey (an outlier among the rails the job uses, a retransmit or error burst), else 0",
            m.grey.clone(),
        );
        registry.register(
            "rail_telemetry_ticks",
            "Passive telemetry ticks done",
            m.ticks.clone(),
        );
        m
    }

    /// Publishes one tick's rates.
    pub fn record(&self, rails: &[RailRates]) {
        for r in rails {
            let rail = RailLabel {
                rail: r.rail.to_string(),
            };
            for (fam, v) in [
                (&self.tx_bytes, r.tx_bytes_per_second),
                (&self.rx_bytes, r.rx_bytes_per_second),
                (&self.tx_packets, r.tx_packets_per_second),
                (&self.rx_packets, r.rx_packets_per_second),
                (&self.xmit_wait, r.xmit_wait_per_second),
            ] {
                if let Some(v) = v {
                    fam.get_or_create(&rail).set(v);
                }
            }
            let labels = |counter: &str| RailCounterLabels {
                rail: rail.rail.clone(),
                counter: counter.to_string(),
            };
            for (c, d) in &r.error_deltas {
                self.errors.get_or_create(&labels(c)).inc_by(*d);
            }
            for (c, d) in &r.hw_deltas {
                self.hw_total.get_or_create(&labels(c)).inc_by(*d);
            }
            for (c, v) in &r.hw_rates {
                self.hw_rate.get_or_create(&labels(c)).set(*v);
            }
            for reset in &r.resets {
                self.resets.get_or_create(&labels(&reset.counter)).inc();
            }
            for e in &r.errors {
                let name = match e {
                    railguard_prober::telemetry::CounterError::Io { path, .. }
                    | railguard_prober::telemetry::CounterError::Junk { path, .. } => {
                        path.rsplit('/').next().unwrap_or_default().to_string()
                    }
                };
                self.read_errors.get_or_create(&labels(&name)).inc();
            }
        }
        self.ticks.inc();
    }
}

/// `--grey-rails`: what the grey-rail judge may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GreyMode {
    /// No judge.
    Off,
    /// Judge, log and publish `railguard_prober_rail_grey`; certificates are untouched.
    Observe,
    /// As `observe`, and a grey rail fails in the next (prompt) passive check with fault
    /// `grey`, which taints it.
    Enforce,
}

/// What the telemetry task learns from the jobs' traffic, shared with the certification
/// loop: the grey rails the judge holds and the bytes each rail carried since the last
/// passive check (the evidence a renewal rests on).
#[derive(Debug, Default)]
pub struct LiveEvidence {
    rails: Mutex<BTreeMap<String, String>>,
    changed: AtomicBool,
    wake: tokio::sync::Notify,
    /// Set during the daemon's own invasive runs: their traffic is not a job's.
    paused: AtomicBool,
    traffic: Mutex<TrafficTally>,
}

impl LiveEvidence {
    /// Rail (`hca:port`) → the evidence it turned grey on.
    pub fn current(&self) -> BTreeMap<String, String> {
        self.rails.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, rails: BTreeMap<String, String>) {
        *self.rails.lock().unwrap_or_else(|p| p.into_inner()) = rails;
        self.changed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Whether the grey set changed since the last call.
    pub fn take_changed(&self) -> bool {
        self.changed.swap(false, Ordering::SeqCst)
    }

    /// Resolves when the grey set changes (at once if it changed unobserved).
    pub async fn changed(&self) {
        self.wake.notified().await;
    }

    pub fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }

    fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Adds one tick's bytes (sent + received, rate × `dt`) to the tally.
    fn add_traffic(&self, rr: &[RailRates], dt: Duration) {
        let now = jiff::Timestamp::now();
        let mut t = self.traffic.lock().unwrap_or_else(|p| p.into_inner());
        t.start.get_or_insert(now);
        t.end = Some(now);
        for r in rr {
            let per_second =
                r.tx_bytes_per_second.unwrap_or(0.0) + r.rx_bytes_per_second.unwrap_or(0.0);
            let bytes = (per_second * dt.as_secs_f64()).max(0.0) as u64;
            *t.bytes_per_rail.entry(r.rail.to_string()).or_default() += bytes;
        }
    }

    /// The tally since the last call (with the rails grey now), and a fresh one begun.
    pub fn take_traffic(&self) -> TrafficTally {
        let mut t = std::mem::take(&mut *self.traffic.lock().unwrap_or_else(|p| p.into_inner()));
        t.grey = self.current().into_keys().collect();
        t
    }
}

/// The judge and what it may do.
pub struct GreyJudging {
    pub judge: GreyRailJudge,
    pub enforce: bool,
    pub shared: Arc<LiveEvidence>,
}

impl GreyJudging {
    /// One tick's rates through the judge: changes logged and published.
    fn tick(&mut self, rr: &[RailRates], metrics: &TelemetryMetrics, was_paused: &mut bool) {
        if self.shared.is_paused() {
            *was_paused = true;
            return;
        }
        if std::mem::take(was_paused) {
            self.judge.forget_traffic();
        }
        let windows: Vec<RailWindow> = rr.iter().map(RailWindow::of).collect();
        let changes = self.judge.judge(&windows);
        for c in &changes {
            match c {
                GreyChange::Failed { rail, evidence } => {
                    tracing::warn!(rail = %rail, evidence = %evidence, enforce = self.enforce, "rail grey under the job's traffic");
                    metrics
                        .grey
                        .get_or_create(&RailLabel {
                            rail: rail.to_string(),
                        })
                        .set(1);
                }
                GreyChange::Lifted { rail } => {
                    tracing::info!(rail = %rail, clean_windows = self.judge.policy().lift_after_windows, enforce = self.enforce, "grey rail lifted");
                    metrics
                        .grey
                        .get_or_create(&RailLabel {
                            rail: rail.to_string(),
                        })
                        .set(0);
                }
            }
        }
        if self.enforce && !changes.is_empty() {
            self.shared.set(self.judge.grey());
        }
    }
}

/// Pure: the tick interval `--telemetry-interval-ms` asks for; `None`: telemetry off (0).
pub fn interval(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Reads the rails' counters every `every` until `stop`, publishing on `metrics`. Reads run
/// on the blocking pool (a driver's show() may query its firmware). A counter's error is
/// logged when it starts failing and when it reads again, never once a tick.
pub async fn run(
    root: std::path::PathBuf,
    rails: Vec<Rail>,
    every: Duration,
    metrics: TelemetryMetrics,
    live: Arc<LiveEvidence>,
    mut grey: Option<GreyJudging>,
    stop: CancellationToken,
) {
    let opened = tokio::task::spawn_blocking(move || RailCounterReader::open(&root, &rails)).await;
    let Ok((reader, problems)) = opened else {
        tracing::warn!("rail telemetry: the reader could not be opened");
        return;
    };
    for p in &problems {
        tracing::warn!(problem = %p, "rail telemetry: rail not watched");
    }
    tracing::info!(
        counters = reader.counter_count(),
        interval_ms = every.as_millis() as u64,
        "rail telemetry started"
    );
    let mut state = Some((reader, Sample::default(), Sample::default()));
    let mut taken: Option<Instant> = None;
    let mut failing: std::collections::BTreeSet<Arc<str>> = Default::default();
    let mut was_paused = false;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let Some((mut reader, prev, mut cur)) = state.take() else {
            break;
        };
        let joined = tokio::task::spawn_blocking(move || {
            reader.sample_into(&mut cur);
            let now = Instant::now();
            (reader, prev, cur, now)
        })
        .await;
        let Ok((reader, prev, cur, now)) = joined else {
            tracing::warn!("rail telemetry: a tick failed; stopped");
            break;
        };
        if let Some(before) = taken {
            let dt = now.duration_since(before);
            let rr = rates(&prev, &cur, dt);
            let mut now_failing = std::collections::BTreeSet::new();
            for e in rr.iter().flat_map(|r| &r.errors) {
                let key: Arc<str> = e.to_string().into();
                if !failing.contains(&key) {
                    tracing::warn!(error = %e, "rail telemetry: counter unreadable");
                }
                now_failing.insert(key);
            }
            for k in failing.difference(&now_failing) {
                tracing::info!(was = %k, "rail telemetry: counter reads again");
            }
            failing = now_failing;
            metrics.record(&rr);
            if !live.is_paused() {
                live.add_traffic(&rr, dt);
            }
            if let Some(g) = grey.as_mut() {
                g.tick(&rr, &metrics, &mut was_paused);
            }
        }
        taken = Some(now);
        // `cur` becomes the next tick's `prev`; the old `prev`'s storage is reused.
        state = Some((reader, cur, prev));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates_of(gbytes: &[f64]) -> Vec<RailRates> {
        gbytes
            .iter()
            .enumerate()
            .map(|(i, g)| RailRates {
                rail: format!("mlx5_{i}:1").into(),
                tx_bytes_per_second: Some(g * 1e9),
                rx_bytes_per_second: Some(g * 1e9),
                xmit_wait_per_second: Some(0.0),
                ..RailRates::default()
            })
            .collect()
    }

    fn judging(enforce: bool) -> GreyJudging {
        GreyJudging {
            judge: GreyRailJudge::new(railguard_prober::telemetry::grey::GreyPolicy::default()),
            enforce,
            shared: Arc::new(LiveEvidence::default()),
        }
    }

    #[test]
    fn enforce_shares_a_grey_rail_and_observe_only_publishes_it() {
        let lagging = rates_of(&[24.0, 24.1, 23.9, 24.2, 3.0, 24.0, 23.8, 24.1]);
        for enforce in [true, false] {
            let mut registry = Registry::with_prefix("railguard_prober");
            let m = TelemetryMetrics::register(&mut registry);
            let mut g = judging(enforce);
            let mut paused = false;
            for _ in 0..3 {
                g.tick(&lagging, &m, &mut paused);
            }
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            assert!(
                text.contains(r#"railguard_prober_rail_grey{rail="mlx5_4:1"} 1"#),
                "{text}"
            );
            assert_eq!(g.shared.take_changed(), enforce);
            let shared = g.shared.current();
            if enforce {
                assert_eq!(shared.keys().collect::<Vec<_>>(), vec!["mlx5_4:1"]);
                assert!(
                    shared["mlx5_4:1"].contains("spreads below the median"),
                    "{shared:?}"
                );
            } else {
                assert!(
                    shared.is_empty(),
                    "observe changes no certificate: {shared:?}"
                );
            }
        }
    }

    #[test]
    fn a_paused_judge_ignores_the_daemons_own_test_traffic() {
        let m = TelemetryMetrics::default();
        let mut g = judging(true);
        let mut paused = false;
        g.shared.pause(true);
        // An invasive run drives one rail at a time (and the judge would see asymmetry).
        for i in 0..8 {
            let mut one = vec![0.0; 8];
            one[i] = 24.0;
            for _ in 0..5 {
                g.tick(&rates_of(&one), &m, &mut paused);
            }
        }
        g.shared.pause(false);
        g.tick(&rates_of(&[0.0; 8]), &m, &mut paused);
        assert!(!g.shared.take_changed());
        assert!(g.judge.grey().is_empty());
    }

    #[test]
    fn the_tally_adds_bytes_per_rail_and_starts_afresh_when_taken() {
        let live = LiveEvidence::default();
        let rr = rates_of(&[1.0, 2.0, 3.0]);
        live.add_traffic(&rr, Duration::from_millis(500));
        live.add_traffic(&rr, Duration::from_millis(500));
        let t = live.take_traffic();
        // 1 GB/s each way for a second: 2e9 bytes.
        assert_eq!(t.bytes_per_rail["mlx5_0:1"], 2_000_000_000);
        assert_eq!(t.bytes_per_rail["mlx5_2:1"], 6_000_000_000);
        assert!(t.start.is_some() && t.end >= t.start);
        assert_eq!(live.take_traffic(), TrafficTally::default());
    }

    #[test]
    fn zero_turns_telemetry_off() {
        assert_eq!(interval(0), None);
        assert_eq!(interval(1000), Some(Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn the_task_publishes_rates_and_read_errors() {
        let d = tempfile::tempdir().unwrap();
        let pd = d.path().join("sys/class/infiniband/mlx5_0/ports/1");
        std::fs::create_dir_all(pd.join("counters")).unwrap();
        std::fs::create_dir_all(pd.join("hw_counters")).unwrap();
        std::fs::write(pd.join("counters/port_xmit_data"), "0\n").unwrap();
        std::fs::write(pd.join("counters/symbol_error"), "1\n").unwrap();
        std::fs::write(pd.join("hw_counters/np_cnp_sent"), "0\n").unwrap();
        std::fs::write(pd.join("hw_counters/roce_adp_retrans"), "junk\n").unwrap();
        let mut registry = Registry::with_prefix("railguard_prober");
        let m = TelemetryMetrics::register(&mut registry);
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(
            d.path().to_path_buf(),
            vec![Rail {
                hca: "mlx5_0".into(),
                port: 1,
            }],
            Duration::from_millis(20),
            m.clone(),
            Arc::new(LiveEvidence::default()),
            None,
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        std::fs::write(pd.join("counters/port_xmit_data"), "1000000\n").unwrap();
        std::fs::write(pd.join("counters/symbol_error"), "4\n").unwrap();
        std::fs::write(pd.join("hw_counters/np_cnp_sent"), "10\n").unwrap();
        let encode = || {
            let mut s = String::new();
            prometheus_client::encoding::text::encode(&mut s, &registry).unwrap();
            s
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let text = loop {
            let s = encode();
            if s.contains(r#"railguard_prober_rail_errors_total{rail="mlx5_0:1",counter="symbol_error"} 3"#)
                && s.contains(r#"railguard_prober_rail_hw_counter_total{rail="mlx5_0:1",counter="np_cnp_sent"} 10"#)
            {
                break s;
            }
            assert!(Instant::now() < deadline, "{s}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        stop.cancel();
        task.await.unwrap();
        assert!(
            text.contains(r#"railguard_prober_rail_tx_bytes_per_second{rail="mlx5_0:1"}"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"railguard_prober_rail_hw_counter_rate{rail="mlx5_0:1",counter="np_cnp_sent"}"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"railguard_prober_rail_telemetry_read_errors_total{rail="mlx5_0:1",counter="roce_adp_retrans"}"#),
            "{text}"
        );
    }
}
