//! Parser for NCCL debug logs (`NCCL_DEBUG=INFO`, subsystems INIT and NET).
//!
//! What certification needs from a log: which inter-node network NCCL chose (`NET/IB` or
//! `NET/Socket`), whether GPUDirect RDMA was used (`/GDRDMA` on the network channels), the
//! HCAs NCCL opened and used, intra-node transports (P2P, SHM), ranks and nodes, the NCCL
//! version, and every warning or known error (`ibv_reg_mr` / `ibv_reg_dmabuf_mr` failures,
//! `No device found`). Lines of several ranks may be interleaved and mixed with any other
//! output; lines carrying `NCCL INFO` / `NCCL WARN` are read in full, and in every other line
//! only NCCL's own error texts are looked for ([`QUOTED_ERRORS`]: health-check reports and
//! training logs quote them without the `NCCL WARN` prefix). A cloud network plugin's
//! transport (`NET/AWS Libfabric`, `NET/GPUDirectTCPX`, ...) is reported by its name
//! ([`DebugLogReport::net_plugin`]). NCCL's WQE latency lines go to [`super::wqe`]. One
//! pass, no regexes, no allocation for lines that carry nothing of interest.

use std::collections::{BTreeMap, BTreeSet};

use railguard_api::Transport;
use serde::Serialize;

use super::wqe::WqeReport;

/// At most this many distinct error messages are kept (a broken fabric repeats itself).
pub const MAX_ERRORS: usize = 32;

/// NCCL's own error texts, found anywhere in a line that is not an NCCL debug line: the
/// message is taken from the text to the end of the line. `NET/IB : ` counts only with an
/// error or a missing device after it (see [`quoted_error`]).
pub const QUOTED_ERRORS: &[&str] = &[
    "Call to ibv_",
    "NET/IB : ",
    "unhandled system error",
    "unhandled cuda error",
    "remote process exited or there was a network error",
    "internal error - please report this issue to the NCCL developers",
];

/// What one or more NCCL debug logs say.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DebugLogReport {
    /// `2.27.5+cuda12.9`.
    pub nccl_version: Option<String>,
    /// The inter-node network NCCL chose: `Ib` or `Socket`.
    pub net: Option<Transport>,
    /// The network of a plugin that is neither IB nor sockets (`AWS Libfabric`,
    /// `GPUDirectTCPX`, `FasTrak`), as NCCL names it on its channels or in `Using network`.
    pub net_plugin: Option<String>,
    /// GPUDirect RDMA in use on the network path (`None` when the log does not show it).
    pub gdr: Option<bool>,
    /// HCA ports (`mlx5_0:1`) NCCL used: those its network channels ran on, or every device
    /// of `NET/IB : Using` when no channel line names one.
    pub hcas: Vec<String>,
    /// Link layer NCCL reported per HCA port (`IB`, `RoCE`).
    pub hca_link_layers: BTreeMap<String, String>,
    /// Intra-node transports seen on channels, e.g. `P2P/IPC`, `SHM`.
    pub intra_node: BTreeSet<String>,
    /// Channel connections through a network (`via NET/...`), any plugin.
    pub net_channels: usize,
    /// `DMA-BUF is available on GPU device N` seen.
    pub dmabuf: bool,
    pub ranks: Option<u32>,
    pub nodes: Option<u32>,
    /// Host names from the line prefixes.
    pub hosts: BTreeSet<String>,
    /// Distinct warnings and errors, first seen first.
    pub errors: Vec<String>,
    /// Number of NCCL lines read.
    pub nccl_lines: usize,
    /// NCCL's work-request latency lines (`NET/IB: WQE slow`, `WQE stall`, the per-QP
    /// summary), by local HCA port.
    #[serde(skip_serializing_if = "WqeReport::is_empty")]
    pub wqe: WqeReport,
}

#[derive(Default)]
struct Scan {
    report: DebugLogReport,
    ib_devices: BTreeMap<u32, String>,
    ib_channel_devices: BTreeSet<u32>,
    ch_ib: usize,
    ch_socket: usize,
    ch_plugin: usize,
    plugin_network: Option<String>,
    ch_gdr: usize,
    ch_net_no_gdr: usize,
    using_network: Option<Transport>,
    net_socket_using: bool,
    ring_gdr: Option<bool>,
    gdr_enabled_lines: usize,
    gdr_disabled_lines: usize,
    n_ranks: Option<u32>,
    n_nodes: Option<u32>,
    error_lines: usize,
    /// Host of the previous NCCL line: consecutive lines nearly always share it.
    last_host: String,
}

/// Parses NCCL debug output. Never fails: text without NCCL lines gives an empty report
/// (`nccl_lines == 0`).
pub fn parse_debug_log(text: &str) -> DebugLogReport {
    let mut scan = Scan::default();
    scan.feed(text);
    scan.finish()
}

/// Parses several logs (e.g. one per rank or per node) into one report.
pub fn parse_debug_logs<'a>(texts: impl IntoIterator<Item = &'a str>) -> DebugLogReport {
    let mut scan = Scan::default();
    for t in texts {
        scan.feed(t);
    }
    scan.finish()
}

/// What an `NCCL WARN` line without a message is recorded as.
pub const EMPTY_WARN: &str = "NCCL WARN without a message";

impl Scan {
    fn feed(&mut self, text: &str) {
        for line in text.lines() {
            let nccl_line = line.find("NCCL ").and_then(|at| {
                let after = &line[at + 5..];
                if let Some(m) = after.strip_prefix("INFO ") {
                    Some((at, false, m))
                } else {
                    after.strip_prefix("WARN ").map(|m| (at, true, m))
                }
            });
            let Some((at, warn, msg)) = nccl_line else {
                // `#` lines are nccl-tests' own; its `# error:` line is the perf parser's.
                if line.trim_start().starts_with('#') {
                    continue;
                }
                if let Some(quoted) = quoted_error(line) {
                    self.error(quoted);
                }
                continue;
            };
            self.report.nccl_lines += 1;
            if let Some(host) = line_host(&line[..at]) {
                if host != self.last_host {
                    host.clone_into(&mut self.last_host);
                    if !self.report.hosts.contains(host) {
                        self.report.hosts.insert(host.to_string());
                    }
                }
            }
            // NCCL's WQE latency lines are evidence about rails, not errors of the run,
            // whichever level they are logged at.
            if self.report.wqe.read_line(msg) {
                continue;
            }
            if warn {
                // A bare `NCCL WARN` is still a warning; an empty entry would say nothing.
                let msg = msg.trim();
                self.error(if msg.is_empty() { EMPTY_WARN } else { msg });
                continue;
            }
            self.info(msg.trim_end());
        }
    }

    fn error(&mut self, msg: &str) {
        self.error_lines += 1;
        if self.report.errors.len() < MAX_ERRORS && !self.report.errors.iter().any(|e| e == msg) {
            self.report.errors.push(msg.to_string());
        }
    }

    fn info(&mut self, msg: &str) {
        if let Some(rest) = msg.strip_prefix("Channel ") {
            self.channel(rest);
        } else if let Some(rest) = msg.strip_prefix("NET/IB") {
            self.net_ib(rest.trim_start_matches([' ', ':']).trim_start());
        } else if let Some(rest) = msg.strip_prefix("NET/Socket") {
            let rest = rest.trim_start_matches([' ', ':']).trim_start();
            if rest.starts_with("Using ") {
                self.net_socket_using = true;
            } else if rest.starts_with("GPU Direct RDMA Disabled") {
                self.gdr_disabled_lines += 1;
            }
        } else if let Some(v) = msg.strip_prefix("NCCL version ") {
            if self.report.nccl_version.is_none() {
                self.report.nccl_version = v.split_whitespace().next().map(str::to_string);
            }
        } else if let Some(v) = msg.strip_prefix("Using network ") {
            match v.trim() {
                "IB" => self.using_network = Some(Transport::Ib),
                "Socket" => self.using_network = Some(Transport::Socket),
                "" => {}
                other => self.plugin_network = Some(other.to_string()),
            }
        } else if let Some(v) = msg.strip_prefix("Connected all rings") {
            if let Some(g) = v.rsplit_once("GDR ") {
                match g.1.trim() {
                    "1" => self.ring_gdr = Some(true),
                    "0" => self.ring_gdr = Some(false),
                    _ => {}
                }
            }
        } else if msg.starts_with("DMA-BUF is available") {
            self.report.dmabuf = true;
        } else if msg.starts_with("comm 0x") || msg.starts_with("ncclCommInitRank") {
            self.comm_line(msg);
        } else if msg.contains("ibv_reg") || msg.contains("No device found") {
            // `ibv_reg` covers ibv_reg_mr and ibv_reg_dmabuf_mr failures.
            // NCCL reports some of these at INFO level before falling back.
            self.error(msg.trim());
        }
    }

    fn net_ib(&mut self, rest: &str) {
        if let Some(list) = rest.strip_prefix("Using ") {
            // `[0]mlx5_0:1/RoCE [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.4<0>`
            let list = list.split(';').next().unwrap_or("");
            for item in list.split_whitespace() {
                let Some(item) = item.strip_prefix('[') else {
                    continue;
                };
                let Some((idx, dev)) = item.split_once(']') else {
                    continue;
                };
                let Ok(idx) = idx.parse::<u32>() else {
                    continue;
                };
                let (port, ll) = match dev.split_once('/') {
                    Some((p, ll)) => (p, Some(ll)),
                    None => (dev, None),
                };
                if port.is_empty() {
                    continue;
                }
                self.ib_devices.insert(idx, port.to_string());
                if let Some(ll) = ll {
                    self.report
                        .hca_link_layers
                        .insert(port.to_string(), ll.to_string());
                }
            }
        } else if rest.starts_with("GPU Direct RDMA Enabled") {
            self.gdr_enabled_lines += 1;
        } else if rest.starts_with("GPU Direct RDMA Disabled") {
            self.gdr_disabled_lines += 1;
        } else if rest.starts_with("No device found")
            || rest.contains("ibv_reg_mr")
            || rest.contains("ibv_reg_dmabuf_mr")
        {
            self.error(&format!("NET/IB : {}", rest.trim()));
        }
    }

    fn channel(&mut self, rest: &str) {
        let Some((_, via)) = rest.split_once(" via ") else {
            return;
        };
        let via = via.trim();
        if let Some(net) = via.strip_prefix("NET/") {
            let mut parts = net.split('/');
            let kind = parts.next().unwrap_or("");
            let dev = parts.next().and_then(|d| d.parse::<u32>().ok());
            let gdr = parts.any(|p| p == "GDRDMA");
            match kind {
                "IB" => {
                    self.ch_ib += 1;
                    if let Some(d) = dev {
                        self.ib_channel_devices.insert(d);
                    }
                }
                "Socket" => self.ch_socket += 1,
                "" => {}
                other => {
                    self.ch_plugin += 1;
                    if self.plugin_network.is_none() {
                        self.plugin_network = Some(other.to_string());
                    }
                }
            }
            if gdr {
                self.ch_gdr += 1;
            } else {
                self.ch_net_no_gdr += 1;
            }
        } else {
            // `P2P/IPC`, `P2P/CUMEM/read`, `SHM/direct/direct`, `P2P/direct pointer`
            let mut it = via.split('/');
            let kind = it.next().unwrap_or("");
            let sub = it.next().unwrap_or("");
            let name = match kind {
                "SHM" => "SHM".to_string(),
                "P2P" if !sub.is_empty() => {
                    format!("P2P/{}", sub.split_whitespace().next().unwrap_or(sub))
                }
                _ => kind.to_string(),
            };
            if !name.is_empty() && !self.report.intra_node.contains(&name) {
                self.report.intra_node.insert(name);
            }
        }
    }

    fn comm_line(&mut self, msg: &str) {
        let mut it = msg.split_whitespace();
        while let Some(t) = it.next() {
            match t {
                "nRanks" | "nranks" => {
                    if let Some(v) = it.next().and_then(|v| v.parse().ok()) {
                        self.n_ranks = Some(v);
                    }
                }
                "nNodes" => {
                    if let Some(v) = it.next().and_then(|v| v.parse().ok()) {
                        self.n_nodes = Some(v);
                    }
                }
                _ => {}
            }
        }
    }

    fn finish(mut self) -> DebugLogReport {
        let r = &mut self.report;
        r.net_channels = self.ch_ib + self.ch_socket + self.ch_plugin;
        r.net = if self.ch_socket > 0 {
            Some(Transport::Socket)
        } else if self.ch_ib > 0 {
            Some(Transport::Ib)
        } else if self.using_network.is_some() {
            self.using_network
        } else if self.ch_plugin > 0 || self.plugin_network.is_some() {
            // A plugin's network is neither IB nor sockets, whatever devices IB listed.
            None
        } else if !self.ib_devices.is_empty() {
            Some(Transport::Ib)
        } else if self.net_socket_using {
            Some(Transport::Socket)
        } else {
            None
        };
        r.gdr = if self.ch_socket > 0 {
            // Sockets cannot do GPUDirect RDMA.
            Some(false)
        } else if self.ch_ib > 0 || self.ch_plugin > 0 {
            Some(self.ch_gdr > 0 && self.ch_net_no_gdr == 0)
        } else if self.ring_gdr.is_some() {
            self.ring_gdr
        } else if self.gdr_disabled_lines > 0 {
            Some(false)
        } else if self.gdr_enabled_lines > 0 {
            Some(true)
        } else {
            None
        };
        let used: Vec<String> = self
            .ib_channel_devices
            .iter()
            .filter_map(|i| self.ib_devices.get(i).cloned())
            .collect();
        r.hcas = if used.is_empty() {
            self.ib_devices.values().cloned().collect()
        } else {
            used
        };
        r.ranks = self.n_ranks;
        r.nodes = self.n_nodes;
        if r.net.is_none() {
            r.net_plugin = self.plugin_network;
        }
        self.report
    }
}

/// NCCL's error text quoted in a line that is not an NCCL debug line, from the known text to
/// the end of the line (surrounding quotes dropped).
pub fn quoted_error(line: &str) -> Option<&str> {
    let (at, sig) = QUOTED_ERRORS
        .iter()
        .filter_map(|sig| line.find(sig).map(|at| (at, *sig)))
        .min_by_key(|(at, _)| *at)?;
    let msg = line[at..]
        .trim()
        .trim_end_matches(['"', '\'', ','])
        .trim_end();
    if sig == "NET/IB : " && !(msg.contains("error") || msg.contains("No device found")) {
        return None;
    }
    Some(msg)
}

/// The host of a `host:pid:tid [dev] ` prefix.
fn line_host(prefix: &str) -> Option<&str> {
    let p = prefix.trim_start();
    let (host, rest) = p.split_once(':')?;
    // pid must follow, so a stray "foo: NCCL" line is not a host
    if host.is_empty() || !rest.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    Some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_failures_and_missing_devices_are_errors() {
        let log = "\
n1:1:2 [0] NCCL INFO NET/IB : No device found.
n1:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
n1:1:2 [0] NCCL INFO Using network Socket
n1:1:3 [0] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory
n1:1:3 [0] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory
n1:1:3 [1] NCCL INFO Call to ibv_reg_dmabuf_mr failed
";
        let r = parse_debug_log(log);
        assert_eq!(r.net, Some(Transport::Socket));
        assert_eq!(
            r.errors,
            vec![
                "NET/IB : No device found.".to_string(),
                "Call to ibv_reg_mr failed with error Cannot allocate memory".to_string(),
                "Call to ibv_reg_dmabuf_mr failed".to_string(),
            ]
        );
        assert_eq!(r.hosts.iter().collect::<Vec<_>>(), vec!["n1"]);
    }

    #[test]
    fn mixed_gdr_channels_are_not_gdr() {
        let log = "\
h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:1<0>
h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/1/GDRDMA
h:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1
h:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct
";
        let r = parse_debug_log(log);
        assert_eq!(r.net, Some(Transport::Ib));
        assert_eq!(r.gdr, Some(false));
        // only device 1 carried channels
        assert_eq!(r.hcas, vec!["mlx5_1:1".to_string()]);
        assert!(r.intra_node.contains("SHM"));
    }

    #[test]
    fn text_without_nccl_lines_is_empty() {
        let r = parse_debug_log("hello\nworld\n");
        assert_eq!(r, DebugLogReport::default());
    }
}
