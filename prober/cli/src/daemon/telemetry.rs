//! The daemon's passive rail telemetry task (issue #45 item 1): every
//! `--telemetry-interval-ms` it reads each rail's counters ([`railguard_prober::telemetry`])
//! and publishes per-rail rates on the daemon's metrics registry.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
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
            let rr = rates(&prev, &cur, now.duration_since(before));
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
        }
        taken = Some(now);
        // `cur` becomes the next tick's `prev`; the old `prev`'s storage is reused.
        state = Some((reader, cur, prev));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
