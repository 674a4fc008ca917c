//! NCCL evidence: the nccl-tests output parser ([`perf`]), the NCCL debug log parser
//! ([`debug_log`]), the runner that starts `all_reduce_perf` as a child process, and this
//! node's ranks of a two-node all-reduce through NCCL's C API ([`ranks`]).

pub mod debug_log;
pub mod native;
pub mod perf;
pub mod ranks;
pub mod runner;
pub mod wqe;

use railguard_api::{NcclResult, Transport};
use serde::Serialize;

pub use debug_log::{parse_debug_log, parse_debug_logs, DebugLogReport};
pub use perf::{parse_perf_output, PerfFormat, PerfParseError, PerfReport, PerfRow};
pub use runner::{run_nccl_test, NcclError, NcclRun, NcclRunSpec};

/// What one NCCL run (or a set of user-supplied files) shows: the nccl-tests table, when
/// present, and everything the NCCL lines say.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NcclObservation {
    pub perf: Option<PerfReport>,
    pub log: DebugLogReport,
}

impl NcclObservation {
    /// Reads texts that may each hold nccl-tests output, NCCL debug lines or both.
    pub fn from_texts<'a>(
        texts: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, PerfParseError> {
        let texts: Vec<&str> = texts.into_iter().collect();
        let mut perf = None;
        for t in &texts {
            if let Some(p) = parse_perf_output(t)? {
                perf = Some(p);
            }
        }
        Ok(NcclObservation {
            perf,
            log: parse_debug_logs(texts.iter().copied()),
        })
    }

    pub fn busbw_plateau_gbps(&self) -> Option<f64> {
        self.perf.as_ref().and_then(PerfReport::plateau_busbw_gbps)
    }

    pub fn wrong(&self) -> Option<u64> {
        self.perf.as_ref().and_then(PerfReport::wrong)
    }

    /// Ranks: from `# Using devices` or from the NCCL communicator lines.
    pub fn ranks(&self) -> Option<u32> {
        self.perf.as_ref().and_then(|p| p.ranks).or(self.log.ranks)
    }

    /// Nodes: from the communicator (`nNodes`), the rank list hosts, or the log hosts.
    pub fn nodes(&self) -> Option<u32> {
        self.log
            .nodes
            .or_else(|| self.perf.as_ref().and_then(|p| p.nodes))
    }

    /// `2.21.5` without the `+cudaX` suffix.
    pub fn nccl_version(&self) -> Option<String> {
        self.log
            .nccl_version
            .clone()
            .or_else(|| self.perf.as_ref().and_then(|p| p.nccl_version.clone()))
            .map(|v| v.split('+').next().unwrap_or(&v).to_string())
    }

    /// The transport a certificate records: the inter-node network, or for a single-node run
    /// the intra-node path NCCL used.
    pub fn transport(&self) -> Option<Transport> {
        self.log.net.or_else(|| {
            if self.log.intra_node.iter().any(|t| t.starts_with("P2P")) {
                Some(Transport::P2p)
            } else if self.log.intra_node.contains("SHM") {
                Some(Transport::Shm)
            } else {
                None
            }
        })
    }

    /// The certificate record of this run.
    pub fn to_result(&self) -> NcclResult {
        NcclResult {
            busbw_plateau_gbps: self.busbw_plateau_gbps().map(round2),
            ranks: self.ranks(),
            nvlink_busbw_gbps: None,
            algbw_gbps: self
                .perf
                .as_ref()
                .and_then(PerfReport::plateau_algbw_gbps)
                .map(round2),
            avg_busbw_gbps: self.perf.as_ref().map(|p| round2(p.avg_busbw_gbps)),
            transport: self.transport(),
            gdr: self.log.gdr,
            wrong: self.wrong().unwrap_or(0),
            hcas: self.log.hcas.clone(),
            nccl_version: self.nccl_version(),
        }
    }
}

/// `v` rounded to two decimals. Values beyond about 1.8e306 would overflow the scaling to
/// infinity (a junk nccl-tests row did); they have no fraction left to round.
pub fn round2(v: f64) -> f64 {
    let scaled = v * 100.0;
    if scaled.is_finite() {
        scaled.round() / 100.0
    } else {
        v
    }
}

/// The last `max` bytes of `s` (trimmed, cut at a character boundary, `...` in front when
/// cut): the end of a tool's output, where its error is.
pub(crate) fn tail(s: &str, max: usize) -> String {
    let t = s.trim();
    if t.len() <= max {
        return t.to_string();
    }
    let mut start = t.len() - max;
    while !t.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &t[start..])
}

#[cfg(test)]
mod tests {
    use super::round2;

    #[test]
    fn round2_rounds_and_keeps_huge_values_finite() {
        assert_eq!(round2(1.234), 1.23);
        assert_eq!(round2(0.005), 0.01);
        // The fuzzer's busbw of f64::MAX GB/s became infinity through the scaling.
        assert_eq!(round2(f64::MAX), f64::MAX);
        assert!(round2(1.0e307).is_finite());
    }
}
