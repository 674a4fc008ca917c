//! The output of the simulated `all_reduce_perf` (the `all_reduce_perf_sim` binary): exact
//! nccl-tests text and NCCL INFO lines for a node model's NCCL behaviour. Pure: the binary
//! adds the process around it (arguments, environment, files, counter growth).

use std::fmt::Write as _;

use railguard_api::Transport;

/// What the simulated run looks like.
#[derive(Clone, Debug, PartialEq)]
pub struct StandinRun {
    /// This node's host name and the simulated peer's.
    pub host: String,
    pub peer: String,
    /// Processes (one GPU each) per node.
    pub gpus_per_node: u32,
    /// Large-message busbw plateau, GB/s.
    pub busbw_gbps: f64,
    pub transport: Transport,
    pub gdr: bool,
    /// `#wrong` reported on every out-of-place row.
    pub wrong: u64,
    /// `2.21.5`
    pub nccl_version: String,
    pub cuda_version: String,
    /// `(hca:port, link layer)` NCCL opens, in order.
    pub hcas: Vec<(String, String)>,
    /// Socket interface (`eth0`).
    pub ifname: String,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: u64,
    pub warmup_iters: u32,
    pub iters: u32,
    pub pid: u32,
}

/// Sizes swept from `min` to `max` by `factor` (nccl-tests' `-b -e -f`).
pub fn sizes(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut s = min.max(1);
    while s <= max {
        out.push(s);
        match s.checked_mul(factor.max(2)) {
            Some(n) => s = n,
            None => break,
        }
    }
    out
}

/// Parses nccl-tests size arguments: `8`, `8K`, `8M`, `8G`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1u64 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

impl StandinRun {
    fn ranks(&self) -> u32 {
        self.gpus_per_node * 2
    }

    /// Bus bandwidth at a message size: rises towards the plateau as messages grow.
    fn busbw_at(&self, size: u64) -> f64 {
        let s = size as f64;
        self.busbw_gbps * s / (s + 16.0 * 1024.0 * 1024.0)
    }

    /// nccl-tests stdout (new format: `root` and `#wrong` columns).
    pub fn stdout(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} agg iters: 1 validation: 1 graph: 0",
            self.min_bytes, self.max_bytes, self.factor, self.warmup_iters, self.iters
        );
        o.push_str("#\n# Using devices\n");
        for r in 0..self.ranks() {
            let (host, dev) = if r < self.gpus_per_node {
                (&self.host, r)
            } else {
                (&self.peer, r - self.gpus_per_node)
            };
            let _ = writeln!(
                o,
                "#  Rank {r:>2} Group  0 Pid {:>6} on {host} device {dev:>2} [0000:{:02x}:00] NVIDIA H100 80GB HBM3",
                self.pid + r,
                0x18 + dev * 0x10
            );
        }
        let _ = writeln!(
            o,
            "NCCL version {}+cuda{}",
            self.nccl_version, self.cuda_version
        );
        o.push_str("#\n");
        o.push_str("#                                                              out-of-place                       in-place          \n");
        o.push_str("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
        o.push_str("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n");
        let n = f64::from(self.ranks());
        let bus_factor = 2.0 * (n - 1.0) / n;
        let mut sum = 0.0;
        let list = sizes(self.min_bytes, self.max_bytes, self.factor);
        for &size in &list {
            let busbw = self.busbw_at(size);
            let algbw = busbw / bus_factor;
            // GB/s = 1e3 bytes/us
            let time = size as f64 / (algbw * 1e3);
            let _ = writeln!(
                o,
                "{size:>12}  {count:>12}     float     sum      -1  {t:>7}  {a:>6.2}  {b:>6.2}  {w:>5}  {t:>7}  {a:>6.2}  {b:>6.2}  {z:>5}",
                count = size / 4,
                t = fmt_time(time),
                a = algbw,
                b = busbw,
                w = self.wrong,
                z = 0
            );
            sum += 2.0 * busbw;
        }
        let total_wrong = self.wrong * list.len() as u64;
        let _ = writeln!(
            o,
            "# Out of bounds values : {total_wrong} {}",
            if total_wrong == 0 { "OK" } else { "FAILED" }
        );
        let avg = if list.is_empty() {
            0.0
        } else {
            sum / (2.0 * list.len() as f64)
        };
        let _ = writeln!(o, "# Avg bus bandwidth    : {avg:.4} \n#");
        o
    }

    /// NCCL INFO lines of this node's local ranks (INIT and NET subsystems).
    pub fn debug_log(&self) -> String {
        let mut o = String::new();
        let ranks = self.ranks();
        for local in 0..self.gpus_per_node {
            let rank = local;
            let p = format!(
                "{}:{}:{} [{local}] NCCL INFO",
                self.host,
                self.pid + local,
                self.pid + local
            );
            let _ = writeln!(o, "{p} cudaDriverVersion 12040");
            let _ = writeln!(o, "{p} Bootstrap : Using {}:10.0.0.1<0>", self.ifname);
            let _ = writeln!(
                o,
                "{p} NCCL version {}+cuda{}",
                self.nccl_version, self.cuda_version
            );
            let _ = writeln!(
                o,
                "{p} NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin."
            );
            match self.transport {
                Transport::Socket => {
                    let _ = writeln!(o, "{p} NET/IB : No device found.");
                    let _ = writeln!(o, "{p} NET/Socket : Using [0]{}:10.0.0.1<0>", self.ifname);
                    let _ = writeln!(o, "{p} Using network Socket");
                }
                _ => {
                    let list: Vec<String> = self
                        .hcas
                        .iter()
                        .enumerate()
                        .map(|(i, (h, ll))| format!("[{i}]{h}/{ll}"))
                        .collect();
                    let _ = writeln!(
                        o,
                        "{p} NET/IB : Using {} [RO]; OOB {}:10.0.0.1<0>",
                        list.join(" "),
                        self.ifname
                    );
                    let _ = writeln!(o, "{p} Using network IB");
                    for (i, (h, _)) in self.hcas.iter().enumerate() {
                        let hca = h.split(':').next().unwrap_or(h);
                        let _ = writeln!(
                            o,
                            "{p} NET/IB : GPU Direct RDMA {} for HCA {i} '{hca}'",
                            if self.gdr { "Enabled" } else { "Disabled" }
                        );
                    }
                }
            }
            let _ = writeln!(
                o,
                "{p} ncclCommInitRank comm 0x55a2{local:04x} rank {rank} nranks {ranks} cudaDev {local} nvmlDev {local} busId {:x}000 commId 0x5eed - Init START",
                0x18 + local * 0x10
            );
            let _ = writeln!(
                o,
                "{p} comm 0x55a2{local:04x} rank {rank} nRanks {ranks} nNodes 2 localRanks {} localRank {local} MNNVL 0",
                self.gpus_per_node
            );
            let peer_rank = rank + self.gpus_per_node;
            let next = (local + 1) % self.gpus_per_node;
            let _ = writeln!(
                o,
                "{p} Channel 00/0 : {rank}[{local}] -> {next}[{next}] via P2P/IPC"
            );
            let net = match self.transport {
                Transport::Socket => "NET/Socket/0".to_string(),
                _ => {
                    let dev = if self.hcas.is_empty() {
                        0
                    } else {
                        local as usize % self.hcas.len()
                    };
                    format!("NET/IB/{dev}{}", if self.gdr { "/GDRDMA" } else { "" })
                }
            };
            let _ = writeln!(
                o,
                "{p} Channel 01/0 : {rank}[{local}] -> {peer_rank}[{local}] [send] via {net}"
            );
            let _ = writeln!(
                o,
                "{p} Channel 01/0 : {peer_rank}[{local}] -> {rank}[{local}] [receive] via {net}"
            );
            let _ = writeln!(
                o,
                "{p} Connected all rings, use ring PXN 0 GDR {}",
                u8::from(self.gdr && self.transport != Transport::Socket)
            );
            let _ = writeln!(
                o,
                "{p} ncclCommInitRank comm 0x55a2{local:04x} rank {rank} nranks {ranks} cudaDev {local} nvmlDev {local} busId {:x}000 commId 0x5eed - Init COMPLETE",
                0x18 + local * 0x10
            );
        }
        o
    }
}

fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:.0}")
    } else {
        format!("{us:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railguard_prober::nccl::NcclObservation;

    fn run() -> StandinRun {
        StandinRun {
            host: "gpu-a".into(),
            peer: "gpu-a-peer".into(),
            gpus_per_node: 8,
            busbw_gbps: 372.0,
            transport: Transport::Ib,
            gdr: true,
            wrong: 0,
            nccl_version: "2.21.5".into(),
            cuda_version: "12.4".into(),
            hcas: vec![
                ("mlx5_0:1".into(), "IB".into()),
                ("mlx5_3:1".into(), "IB".into()),
            ],
            ifname: "eth0".into(),
            min_bytes: 8 << 20,
            max_bytes: 8 << 30,
            factor: 2,
            warmup_iters: 5,
            iters: 20,
            pid: 4000,
        }
    }

    #[test]
    fn the_real_parsers_read_the_standin_output() {
        let r = run();
        let (out, log) = (r.stdout(), r.debug_log());
        let obs = NcclObservation::from_texts([out.as_str(), log.as_str()]).unwrap();
        let perf = obs.perf.as_ref().unwrap();
        assert_eq!(perf.rows.len(), 11, "8M..8G");
        assert_eq!(perf.ranks, Some(16));
        assert_eq!(obs.nodes(), Some(2));
        let plateau = obs.busbw_plateau_gbps().unwrap();
        assert!(plateau > 365.0 && plateau < 372.0, "{plateau}");
        assert_eq!(obs.log.net, Some(Transport::Ib));
        assert_eq!(obs.log.gdr, Some(true));
        assert_eq!(obs.log.hcas, vec!["mlx5_0:1", "mlx5_3:1"]);
        assert_eq!(obs.wrong(), Some(0));
        assert_eq!(obs.nccl_version().as_deref(), Some("2.21.5"));
    }

    #[test]
    fn faults_show_in_the_output() {
        let mut r = run();
        r.transport = Transport::Socket;
        r.wrong = 2;
        let obs =
            NcclObservation::from_texts([r.stdout().as_str(), r.debug_log().as_str()]).unwrap();
        assert_eq!(obs.log.net, Some(Transport::Socket));
        assert_eq!(obs.log.gdr, Some(false));
        assert_eq!(obs.wrong(), Some(22));
        assert_eq!(obs.log.errors, vec!["NET/IB : No device found."]);
    }

    #[test]
    fn size_arguments() {
        assert_eq!(parse_size("8M"), Some(8 << 20));
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(parse_size("64"), Some(64));
        assert_eq!(parse_size("x"), None);
        assert_eq!(sizes(8, 64, 2), vec![8, 16, 32, 64]);
    }
}
