//! Fast passive rail telemetry (issue #45 item 1): every rail's port counters and driver
//! counters read from sysfs once a tick (a second by default), turned into per-rail rates.
//!
//! Pure core, thin shell: [`RailCounterReader`] opens the counter files of the profile's
//! rails once and re-reads each from offset 0 every tick (`pread`, std's
//! [`FileExt::read_at`]: kernfs regenerates an attribute on a read at offset 0, so a tick is
//! one system call per counter, no open, no directory walk, no allocation); [`rates`] turns
//! two [`Sample`]s into [`RailRates`] and is pure. The daemon's task publishes them as
//! Prometheus gauges (`railguard-prober-cli`, `daemon::telemetry`).
//!
//! What is read, per rail `<hca>:<port>`, under `<root>/sys/class/infiniband/<hca>/ports/<port>/`:
//!
//! * `counters/` — the IB PMA port counters [`PORT_COUNTERS`] (`drivers/infiniband/core/
//!   sysfs.c`: `PORT_PMA_ATTR(port_xmit_data, ...)`, ..., the `pma_group` of each port).
//!   `port_xmit_data` and `port_rcv_data` count 4-octet words (IB spec, PortCounters and
//!   PortCountersExtended; sysfs.c shows them unscaled), so bytes are 4 × the delta.
//!   `port_xmit_wait` counts ticks the port had data to send and no credits: congestion.
//! * `hw_counters/` — every file but `lifespan` (the driver's cache period, not a counter):
//!   names are driver-specific and all are read, unknown ones too. mlx5
//!   (`drivers/infiniband/hw/mlx5/counters.c`: `basic_q_cnts`, `out_of_seq_q_cnts`,
//!   `retrans_q_cnts`, `cong_cnts`, `extended_err_cnts`, `roce_accl_cnts`) answers e.g.
//!   `out_of_buffer`, `out_of_sequence`, `duplicate_request`, `rnr_nak_retry_err`,
//!   `packet_seq_err`, `implied_nak_seq_err`, `local_ack_timeout_err`, `rp_cnp_ignored`,
//!   `rp_cnp_handled`, `np_ecn_marked_roce_packets`, `np_cnp_sent`,
//!   `req_transport_retries_exceeded`, `roce_adp_retrans`, `roce_adp_retrans_to`,
//!   `roce_slow_restart`; its queue counters are 32 bits wide (`be32_to_cpu`). rxe
//!   (`drivers/infiniband/sw/rxe/rxe_hw_counters.c`, `rxe_counter_name`) answers
//!   `sent_pkts`, `rcvd_pkts`, `duplicate_request`, `out_of_seq_request`, `rcvd_rnr_err`,
//!   `send_rnr_err`, `rcvd_seq_err`, `ack_deferred`, `retry_exceeded_err`,
//!   `retry_rnr_exceeded_err`, `completer_retry_err`, `send_err`, `link_downed`,
//!   `rdma_sends`, `rdma_recvs`.
//!
//! A counter that went down between two samples was reset (or wrapped: a 32-bit queue
//! counter, a 16-bit `symbol_error` cleared by `perfquery -R`): [`rates`] reports the reset
//! and no rate for that tick, never a negative one. A file that reads as something other
//! than a decimal number is that counter's error ([`CounterError::Junk`]), never a zero.

pub mod grey;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The port counters read from `counters/` (those present; `drivers/infiniband/core/sysfs.c`).
pub const PORT_COUNTERS: [&str; 11] = [
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "port_xmit_wait",
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
];

/// The [`PORT_COUNTERS`] that count errors (published as totals): every one after
/// `port_xmit_wait`.
pub const PORT_ERROR_COUNTERS: &[&str] = PORT_COUNTERS.split_at(5).1;

/// `port_xmit_data`/`port_rcv_data` unit: 4 octets (IB spec).
pub const DATA_WORD_BYTES: f64 = 4.0;

/// Which directory a counter lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CounterKind {
    /// `counters/` (IB PMA port counters).
    Port,
    /// `hw_counters/` (driver-specific).
    Hw,
}

/// Why one counter has no value this tick.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CounterError {
    #[error("{path}: {error}")]
    Io { path: Arc<str>, error: String },
    #[error("{path}: not a counter: {text:?}")]
    Junk { path: Arc<str>, text: String },
}

/// One counter's reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    pub name: Arc<str>,
    pub kind: CounterKind,
    pub value: Result<u64, CounterError>,
}

/// One rail's readings of one tick, in the reader's (stable) counter order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailSample {
    /// `hca:port`.
    pub rail: Arc<str>,
    pub counters: Vec<Counter>,
}

/// Every rail's readings of one tick.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub rails: Vec<RailSample>,
}

/// A rail the reader watches: the HCA and the port (1-based).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rail {
    pub hca: String,
    pub port: u32,
}

impl Rail {
    pub fn id(&self) -> String {
        format!("{}:{}", self.hca, self.port)
    }
}

impl From<&railguard_api::profile::RailSpec> for Rail {
    fn from(r: &railguard_api::profile::RailSpec) -> Self {
        Rail {
            hca: r.hca.clone(),
            port: r.port,
        }
    }
}

struct CounterFile {
    name: Arc<str>,
    kind: CounterKind,
    path: Arc<str>,
    /// `None` after a failed read: opened again on the next tick (a driver reload).
    file: Option<File>,
}

struct RailFiles {
    rail: Arc<str>,
    files: Vec<CounterFile>,
}

/// Opens the counter files of a set of rails once and re-reads them each tick.
pub struct RailCounterReader {
    rails: Vec<RailFiles>,
}

/// Largest counter file read: a u64 is 20 digits; anything longer is junk anyway.
const READ_BUF: usize = 64;

impl RailCounterReader {
    /// Opens `counters/{PORT_COUNTERS}` and every `hw_counters/*` of each rail under
    /// `root` (`/` on a node). Returns the reader and what was missing at open (a rail
    /// without a port directory, no counter at all): those are not retried, the rest are.
    pub fn open(root: &Path, rails: &[Rail]) -> (Self, Vec<String>) {
        let mut problems = Vec::new();
        let mut out = Vec::with_capacity(rails.len());
        for r in rails {
            let pdir = root
                .join("sys/class/infiniband")
                .join(&r.hca)
                .join("ports")
                .join(r.port.to_string());
            let mut files = Vec::new();
            if !pdir.is_dir() {
                problems.push(format!("{}: no such port directory", pdir.display()));
            } else {
                for name in PORT_COUNTERS {
                    let path = pdir.join("counters").join(name);
                    if path.exists() {
                        files.push(CounterFile::open(name, CounterKind::Port, path));
                    }
                }
                let hw = pdir.join("hw_counters");
                if let Ok(dir) = std::fs::read_dir(&hw) {
                    let mut names: Vec<String> = dir
                        .filter_map(Result::ok)
                        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
                        .filter_map(|e| e.file_name().into_string().ok())
                        .filter(|n| n != "lifespan")
                        .collect();
                    names.sort();
                    for n in names {
                        let path = hw.join(&n);
                        files.push(CounterFile::open(&n, CounterKind::Hw, path));
                    }
                }
                if files.is_empty() {
                    problems.push(format!(
                        "{}: no counters/ or hw_counters/ files",
                        pdir.display()
                    ));
                }
            }
            out.push(RailFiles {
                rail: r.id().into(),
                files,
            });
        }
        (RailCounterReader { rails: out }, problems)
    }

    /// How many counter files a tick reads.
    pub fn counter_count(&self) -> usize {
        self.rails.iter().map(|r| r.files.len()).sum()
    }

    /// One tick's readings, in a new [`Sample`].
    pub fn sample(&mut self) -> Sample {
        let mut s = Sample::default();
        self.sample_into(&mut s);
        s
    }

    /// One tick's readings into `into`, reusing its storage (no allocation once it has the
    /// reader's shape, unless a counter fails).
    pub fn sample_into(&mut self, into: &mut Sample) {
        let shaped = into.rails.len() == self.rails.len()
            && into
                .rails
                .iter()
                .zip(&self.rails)
                .all(|(s, r)| s.counters.len() == r.files.len() && s.rail == r.rail);
        if !shaped {
            into.rails = self
                .rails
                .iter()
                .map(|r| RailSample {
                    rail: r.rail.clone(),
                    counters: r
                        .files
                        .iter()
                        .map(|f| Counter {
                            name: f.name.clone(),
                            kind: f.kind,
                            value: Ok(0),
                        })
                        .collect(),
                })
                .collect();
        }
        let mut buf = [0u8; READ_BUF];
        for (rs, rf) in into.rails.iter_mut().zip(self.rails.iter_mut()) {
            for (c, f) in rs.counters.iter_mut().zip(rf.files.iter_mut()) {
                c.value = f.read(&mut buf);
            }
        }
    }
}

impl CounterFile {
    fn open(name: &str, kind: CounterKind, path: PathBuf) -> Self {
        let file = File::open(&path).ok();
        CounterFile {
            name: name.into(),
            kind,
            path: path.display().to_string().into(),
            file,
        }
    }

    fn read(&mut self, buf: &mut [u8; READ_BUF]) -> Result<u64, CounterError> {
        let file = match self.file.take() {
            Some(f) => f,
            None => File::open(&*self.path).map_err(|e| self.io(&e))?,
        };
        let n = read_whole(&file, buf).map_err(|e| self.io(&e))?;
        self.file = Some(file);
        parse_counter(&buf[..n]).ok_or_else(|| CounterError::Junk {
            path: self.path.clone(),
            text: String::from_utf8_lossy(&buf[..n]).trim_end().to_string(),
        })
    }

    fn io(&self, e: &std::io::Error) -> CounterError {
        CounterError::Io {
            path: self.path.clone(),
            error: e.to_string(),
        }
    }
}

/// Reads from offset 0 until the buffer is full or the file ends.
fn read_whole(file: &File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Pure: a sysfs counter's text (`"1234\n"`) as a number; `None` for anything else.
pub fn parse_counter(text: &[u8]) -> Option<u64> {
    let t = text.trim_ascii();
    if t.is_empty() || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// A counter that went down between two samples (reset or wrapped): no rate this tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reset {
    pub counter: Arc<str>,
    pub before: u64,
    pub after: u64,
}

/// One rail's rates over the interval between two samples. A rate is `None` where either
/// sample lacks the counter (absent, unreadable, junk) or it went down ([`Reset`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RailRates {
    pub rail: Arc<str>,
    pub tx_bytes_per_second: Option<f64>,
    pub rx_bytes_per_second: Option<f64>,
    pub tx_packets_per_second: Option<f64>,
    pub rx_packets_per_second: Option<f64>,
    pub xmit_wait_per_second: Option<f64>,
    /// Growth of each [`PORT_ERROR_COUNTERS`] counter read both times (0 included).
    pub error_deltas: Vec<(Arc<str>, u64)>,
    /// Growth of each `hw_counters/` counter read both times.
    pub hw_deltas: Vec<(Arc<str>, u64)>,
    /// Per second rate of each `hw_counters/` counter read both times.
    pub hw_rates: Vec<(Arc<str>, f64)>,
    pub resets: Vec<Reset>,
    /// The counters `cur` could not read.
    pub errors: Vec<CounterError>,
}

/// Pure: per-rail rates from two samples `dt` apart (rails and counters matched by name, so
/// samples of differently opened readers compare too). A `dt` of zero gives deltas and no
/// rates.
pub fn rates(prev: &Sample, cur: &Sample, dt: Duration) -> Vec<RailRates> {
    let secs = dt.as_secs_f64();
    let per_second = |d: u64| (secs > 0.0).then(|| d as f64 / secs);
    cur.rails
        .iter()
        .map(|rc| {
            let mut out = RailRates {
                rail: rc.rail.clone(),
                ..RailRates::default()
            };
            let rp = prev.rails.iter().find(|r| r.rail == rc.rail);
            for c in &rc.counters {
                let now = match &c.value {
                    Ok(v) => *v,
                    Err(e) => {
                        out.errors.push(e.clone());
                        continue;
                    }
                };
                let Some(before) = rp.and_then(|r| {
                    r.counters
                        .iter()
                        .find(|p| p.kind == c.kind && p.name == c.name)
                        .and_then(|p| p.value.as_ref().ok().copied())
                }) else {
                    continue;
                };
                let Some(d) = now.checked_sub(before) else {
                    out.resets.push(Reset {
                        counter: c.name.clone(),
                        before,
                        after: now,
                    });
                    continue;
                };
                match c.kind {
                    CounterKind::Hw => {
                        out.hw_deltas.push((c.name.clone(), d));
                        if let Some(r) = per_second(d) {
                            out.hw_rates.push((c.name.clone(), r));
                        }
                    }
                    CounterKind::Port => match &*c.name {
                        "port_xmit_data" => {
                            out.tx_bytes_per_second = per_second(d).map(|r| r * DATA_WORD_BYTES)
                        }
                        "port_rcv_data" => {
                            out.rx_bytes_per_second = per_second(d).map(|r| r * DATA_WORD_BYTES)
                        }
                        "port_xmit_packets" => out.tx_packets_per_second = per_second(d),
                        "port_rcv_packets" => out.rx_packets_per_second = per_second(d),
                        "port_xmit_wait" => out.xmit_wait_per_second = per_second(d),
                        n if PORT_ERROR_COUNTERS.contains(&n) => {
                            out.error_deltas.push((c.name.clone(), d));
                        }
                        _ => {}
                    },
                }
            }
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(p: PathBuf, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn port(root: &Path, hca: &str, port: u32) -> PathBuf {
        root.join(format!("sys/class/infiniband/{hca}/ports/{port}"))
    }

    /// Two mlx5 rails (one with a junk file and an unknown hw counter) and an rxe rail.
    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (hca, p) in [("mlx5_0", 1), ("mlx5_1", 1)] {
            let pd = port(d.path(), hca, p);
            for c in PORT_COUNTERS {
                w(pd.join("counters").join(c), "0\n");
            }
            for c in ["out_of_sequence", "roce_adp_retrans", "np_cnp_sent"] {
                w(pd.join("hw_counters").join(c), "0\n");
            }
            w(pd.join("hw_counters/lifespan"), "10\n");
        }
        let rxe = port(d.path(), "rxe0", 1);
        for c in ["sent_pkts", "rcvd_pkts", "out_of_seq_request"] {
            w(rxe.join("hw_counters").join(c), "5\n");
        }
        d
    }

    fn rails() -> Vec<Rail> {
        ["mlx5_0", "mlx5_1", "rxe0"]
            .iter()
            .map(|h| Rail {
                hca: h.to_string(),
                port: 1,
            })
            .collect()
    }

    fn value(s: &Sample, rail: &str, name: &str) -> Result<u64, CounterError> {
        s.rails
            .iter()
            .find(|r| &*r.rail == rail)
            .unwrap()
            .counters
            .iter()
            .find(|c| &*c.name == name)
            .unwrap()
            .value
            .clone()
    }

    #[test]
    fn parses_only_decimal_counters() {
        assert_eq!(parse_counter(b"0\n"), Some(0));
        assert_eq!(parse_counter(b" 18446744073709551615\n"), Some(u64::MAX));
        for junk in [
            &b""[..],
            b"\n",
            b"-3\n",
            b"0x10\n",
            b"many\n",
            b"18446744073709551616",
        ] {
            assert_eq!(parse_counter(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn reads_the_tree_once_opened_and_again_each_tick() {
        let d = tree();
        let mut rails = rails();
        rails.push(Rail {
            hca: "mlx5_9".into(),
            port: 1,
        });
        let (mut r, problems) = RailCounterReader::open(d.path(), &rails);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("mlx5_9/ports/1"), "{problems:?}");
        // 11 + 3 per mlx5 rail (lifespan left out), 3 for rxe.
        assert_eq!(r.counter_count(), 2 * 14 + 3);
        let a = r.sample();
        assert_eq!(value(&a, "rxe0:1", "out_of_seq_request"), Ok(5));
        // The same open files show the new contents (a rewrite in place, as sysfs does).
        let pd = port(d.path(), "mlx5_0", 1);
        w(pd.join("counters/port_xmit_data"), "250000000\n");
        w(pd.join("counters/symbol_error"), "3\n");
        w(pd.join("hw_counters/roce_adp_retrans"), "many\n");
        w(pd.join("hw_counters/brand_new_counter"), "1\n");
        let mut b = a.clone();
        r.sample_into(&mut b);
        assert_eq!(value(&b, "mlx5_0:1", "port_xmit_data"), Ok(250_000_000));
        match value(&b, "mlx5_0:1", "roce_adp_retrans") {
            Err(CounterError::Junk { path, text }) => {
                assert!(path.ends_with("mlx5_0/ports/1/hw_counters/roce_adp_retrans"));
                assert_eq!(text, "many");
            }
            other => panic!("{other:?}"),
        }
        // A counter added after open is not watched; a reopened reader sees it.
        assert!(b.rails[0]
            .counters
            .iter()
            .all(|c| &*c.name != "brand_new_counter"));
        let (mut r2, _) = RailCounterReader::open(d.path(), &rails);
        assert_eq!(value(&r2.sample(), "mlx5_0:1", "brand_new_counter"), Ok(1));
    }

    #[test]
    fn a_failed_read_is_an_error_and_the_file_is_opened_again() {
        let d = tree();
        let pd = port(d.path(), "rxe0", 1);
        let (mut r, _) = RailCounterReader::open(
            d.path(),
            &[Rail {
                hca: "rxe0".into(),
                port: 1,
            }],
        );
        // An open handle reads its inode even once unlinked; a handle dropped after a failed
        // read is opened again by path, here a directory (an I/O error), then a file again.
        std::fs::remove_file(pd.join("hw_counters/sent_pkts")).unwrap();
        std::fs::create_dir(pd.join("hw_counters/sent_pkts")).unwrap();
        r.rails[0].files[2].file = None; // as after a failed read
        let s = r.sample();
        assert!(
            matches!(
                value(&s, "rxe0:1", "sent_pkts"),
                Err(CounterError::Io { .. })
            ),
            "{s:?}"
        );
        std::fs::remove_dir(pd.join("hw_counters/sent_pkts")).unwrap();
        w(pd.join("hw_counters/sent_pkts"), "9\n");
        assert_eq!(value(&r.sample(), "rxe0:1", "sent_pkts"), Ok(9));
    }

    fn sample(rail: &str, counters: &[(&str, CounterKind, Result<u64, CounterError>)]) -> Sample {
        Sample {
            rails: vec![RailSample {
                rail: rail.into(),
                counters: counters
                    .iter()
                    .map(|(n, k, v)| Counter {
                        name: (*n).into(),
                        kind: *k,
                        value: v.clone(),
                    })
                    .collect(),
            }],
        }
    }

    #[test]
    fn rates_from_two_samples() {
        use CounterKind::{Hw, Port};
        let junk = CounterError::Junk {
            path: "x".into(),
            text: "many".into(),
        };
        let a = sample(
            "mlx5_0:1",
            &[
                ("port_xmit_data", Port, Ok(1_000)),
                ("port_rcv_data", Port, Ok(0)),
                ("port_xmit_packets", Port, Ok(10)),
                ("port_rcv_packets", Port, Ok(10)),
                ("port_xmit_wait", Port, Ok(100)),
                ("symbol_error", Port, Ok(2)),
                ("link_downed", Port, Ok(1)),
                ("out_of_sequence", Hw, Ok(4_000_000_000)),
                ("np_cnp_sent", Hw, Ok(0)),
                ("roce_adp_retrans", Hw, Ok(1)),
            ],
        );
        let b = sample(
            "mlx5_0:1",
            &[
                ("port_xmit_data", Port, Ok(1_000 + 500_000_000)),
                ("port_rcv_data", Port, Ok(250_000_000)),
                ("port_xmit_packets", Port, Ok(10 + 2_000)),
                ("port_rcv_packets", Port, Ok(4)), // reset
                ("port_xmit_wait", Port, Ok(100 + 600)),
                ("symbol_error", Port, Ok(5)),
                ("link_downed", Port, Ok(1)),
                ("out_of_sequence", Hw, Ok(3)), // 32-bit wrap: a reset too
                ("np_cnp_sent", Hw, Ok(20)),
                ("roce_adp_retrans", Hw, Err(junk.clone())),
                ("brand_new", Hw, Ok(9)), // not in the first sample: nothing yet
            ],
        );
        let r = rates(&a, &b, Duration::from_secs(2));
        assert_eq!(r.len(), 1);
        let r = &r[0];
        assert_eq!(&*r.rail, "mlx5_0:1");
        // 500e6 words × 4 bytes / 2 s.
        assert_eq!(r.tx_bytes_per_second, Some(1e9));
        assert_eq!(r.rx_bytes_per_second, Some(5e8));
        assert_eq!(r.tx_packets_per_second, Some(1_000.0));
        assert_eq!(r.rx_packets_per_second, None);
        assert_eq!(r.xmit_wait_per_second, Some(300.0));
        assert_eq!(
            r.error_deltas,
            vec![("symbol_error".into(), 3), ("link_downed".into(), 0)]
        );
        assert_eq!(r.hw_deltas, vec![("np_cnp_sent".into(), 20)]);
        assert_eq!(r.hw_rates, vec![("np_cnp_sent".into(), 10.0)]);
        assert_eq!(
            r.resets,
            vec![
                Reset {
                    counter: "port_rcv_packets".into(),
                    before: 10,
                    after: 4
                },
                Reset {
                    counter: "out_of_sequence".into(),
                    before: 4_000_000_000,
                    after: 3
                },
            ]
        );
        assert_eq!(r.errors, vec![junk]);
        // The next tick from the reset values is a plain rate again.
        let c = sample("mlx5_0:1", &[("port_rcv_packets", Port, Ok(14))]);
        let r = rates(&b, &c, Duration::from_secs(1));
        assert_eq!(r[0].rx_packets_per_second, Some(10.0));
        assert!(r[0].resets.is_empty());
        // No interval: deltas, no rates; a rail new in `cur`: nothing to compare.
        let r = rates(&a, &b, Duration::ZERO);
        assert_eq!(r[0].tx_bytes_per_second, None);
        assert_eq!(r[0].hw_deltas, vec![("np_cnp_sent".into(), 20)]);
        assert!(r[0].hw_rates.is_empty());
        let other = sample("mlx5_7:1", &[("port_xmit_data", Port, Ok(5))]);
        let r = rates(&a, &other, Duration::from_secs(1));
        assert_eq!(r[0].tx_bytes_per_second, None);
    }

    #[test]
    fn rates_over_the_fixture_tree() {
        let d = tree();
        let (mut r, _) = RailCounterReader::open(d.path(), &rails());
        let a = r.sample();
        let pd = port(d.path(), "mlx5_1", 1);
        w(pd.join("counters/port_rcv_data"), "2500\n");
        w(pd.join("counters/port_xmit_wait"), "0\n");
        w(pd.join("hw_counters/out_of_sequence"), "8\n");
        let rxe = port(d.path(), "rxe0", 1);
        w(rxe.join("hw_counters/sent_pkts"), "2\n");
        let b = r.sample();
        let rr = rates(&a, &b, Duration::from_millis(500));
        assert_eq!(rr.len(), 3);
        assert_eq!(rr[1].rx_bytes_per_second, Some(20_000.0));
        assert_eq!(rr[1].xmit_wait_per_second, Some(0.0));
        assert!(rr[1].hw_rates.contains(&("out_of_sequence".into(), 16.0)));
        assert_eq!(&*rr[2].resets[0].counter, "sent_pkts");
        assert_eq!(rr[2].tx_bytes_per_second, None, "rxe has no counters/");
    }
}
