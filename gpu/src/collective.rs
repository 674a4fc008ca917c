//! What an all-reduce measurement means: nccl-tests' bandwidth definitions, as pure functions.
//!
//! algbw is bytes / time (GB/s, 10^9 bytes per second); busbw = algbw × 2(n−1)/n for
//! all-reduce, the factor that makes it comparable with the hardware's link bandwidth
//! whatever the rank count (nccl-tests `doc/PERFORMANCE.md`).

/// One message size of a rank's sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPoint {
    pub bytes: usize,
    /// Mean time of one all-reduce, microseconds.
    pub time_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    /// Result elements that were not the expected sum (0 on a correct run).
    pub wrong: u64,
}

impl SweepPoint {
    /// From the size, the mean seconds per operation, the rank count and the wrong count.
    pub fn new(bytes: usize, seconds: f64, nranks: u32, wrong: u64) -> SweepPoint {
        let algbw = if seconds > 0.0 {
            bytes as f64 / seconds / 1e9
        } else {
            0.0
        };
        SweepPoint {
            bytes,
            time_us: seconds * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: bus_bandwidth(algbw, nranks),
            wrong,
        }
    }
}

/// busbw of an all-reduce over `nranks` ranks.
pub fn bus_bandwidth(algbw_gbps: f64, nranks: u32) -> f64 {
    if nranks == 0 {
        return 0.0;
    }
    let n = f64::from(nranks);
    algbw_gbps * 2.0 * (n - 1.0) / n
}

/// The value rank `rank` contributes: `rank + 1`, so the sum is never zero.
pub fn rank_value(rank: u32) -> f32 {
    rank as f32 + 1.0
}

/// The correct sum over `nranks` ranks of [`rank_value`]: n(n+1)/2 (exact in f32 for any
/// real rank count).
pub fn expected_sum(nranks: u32) -> f32 {
    let n = nranks as f32;
    n * (n + 1.0) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_follows_nccl_tests() {
        assert_eq!(bus_bandwidth(100.0, 1), 0.0, "one rank moves nothing");
        assert_eq!(bus_bandwidth(100.0, 2), 100.0);
        assert_eq!(bus_bandwidth(100.0, 8), 175.0);
        assert_eq!(bus_bandwidth(100.0, 0), 0.0);
    }

    #[test]
    fn points_compute_algbw_from_size_and_time() {
        let p = SweepPoint::new(1 << 30, 0.01, 2, 0);
        assert!((p.algbw_gbps - 107.374_182_4).abs() < 1e-6);
        assert_eq!(p.busbw_gbps, p.algbw_gbps);
        assert_eq!(p.time_us, 10_000.0);
        assert_eq!(expected_sum(2), 3.0);
        assert_eq!(expected_sum(16), 136.0);
    }
}
