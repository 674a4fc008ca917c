//! The output of the simulated `all_reduce_perf` (the `all_reduce_perf_sim` binary): exact
//! nccl-tests text and NCCL INFO lines for a node model's NCCL behaviour. Pure: the binary
//! adds the process around it (arguments, environment, files, counter growth).

use std::fmt::Write as _;

use railguard_api::Transport;

/// The loopback's busbw over sockets: the socket transport tops out far below any RDMA
/// rail, GB/s.
pub const SOCKET_BUSBW_GBPS: f64 = 11.5;
/// Share of the loopback's plateau left when GPUDirect RDMA is off (every hop bounces
/// through host memory).
pub const NO_GDR_SHARE: f64 = 0.55;
/// busbw between GPUs of one host over SHM (through host memory), GB/s.
pub const SHM_BUSBW_GBPS: f64 = 20.0;

/// How NCCL connects two GPUs of the same process, in the order it tries transports
/// (NCCL `src/transport.cc`: `ncclTransports` = P2P, SHM, NET). `NCCL_P2P_DISABLE=1` stops
/// P2P (`src/graph/paths.cc`, `ncclGetUserP2pLevel`), `NCCL_SHM_DISABLE=1` stops SHM
/// (`src/transport/shm.cc`); with both off the GPUs' path is marked `PATH_NET`
/// (`src/graph/paths.cc`, `ncclTopoComputePaths`) and NET connects them, through the NICs,
/// unless `NCCL_NET_DISABLE_INTRA` is set (`ncclTopoCheckNet`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerPath {
    /// One rank: nothing to connect (NCCL prints `Channel 00/32 : 0`).
    Alone,
    /// `P2P/direct pointer`: the same process (`src/transport/p2p.cc`, `P2P_SAME_PID`).
    P2p,
    /// `SHM/direct/direct`.
    Shm,
    /// `NET/IB/<dev>[/GDRDMA]` or `NET/Socket/<dev>`: every byte through a NIC.
    Net,
}

/// Which path NCCL takes between the GPUs of one `all_reduce_perf` process.
pub fn peer_path(ranks: u32, p2p_disabled: bool, shm_disabled: bool) -> PeerPath {
    if ranks < 2 {
        PeerPath::Alone
    } else if !p2p_disabled {
        PeerPath::P2p
    } else if !shm_disabled {
        PeerPath::Shm
    } else {
        PeerPath::Net
    }
}

/// What the simulated run looks like: one `all_reduce_perf` process without MPI, as the
/// prober runs it, so every rank is on this host (`nNodes 1`).
#[derive(Clone, Debug, PartialEq)]
pub struct StandinRun {
    pub host: String,
    /// `-t`: threads of the process.
    pub threads: u32,
    /// `-g`: GPUs per thread.
    pub gpus_per_thread: u32,
    /// How the GPUs are connected.
    pub path: PeerPath,
    /// Large-message busbw plateau of that path, GB/s (ignored for one rank: busbw is 0).
    pub busbw_gbps: f64,
    /// The network NCCL initialised (`Using network IB|Socket`), whether or not the run
    /// uses it.
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

/// A one-rank all-reduce copies the send buffer to the receive buffer on the GPU (out of
/// place) and does nothing in place: HBM copy speed, GB/s.
const LOCAL_COPY_GBPS: f64 = 1500.0;
/// Launch latency of one all-reduce, microseconds.
const LAUNCH_US: f64 = 10.0;

impl StandinRun {
    /// nccl-tests `src/common.cu`: nranks = nProcs × nThreads × nGpus, with one process.
    pub fn ranks(&self) -> u32 {
        self.threads.max(1) * self.gpus_per_thread.max(1)
    }

    /// Bus bandwidth at a message size: rises towards the plateau as messages grow; 0 for
    /// one rank (nccl-tests `src/all_reduce.cu`: busbw = algbw × 2(n−1)/n).
    fn busbw_at(&self, size: u64) -> f64 {
        if self.ranks() < 2 {
            return 0.0;
        }
        let s = size as f64;
        self.busbw_gbps * s / (s + 16.0 * 1024.0 * 1024.0)
    }

    /// (time us, algbw GB/s, busbw GB/s) of one row, out of place or in place.
    fn row(&self, size: u64, in_place: bool) -> (f64, f64, f64) {
        let n = f64::from(self.ranks());
        if self.ranks() < 2 {
            let time = if in_place {
                0.15
            } else {
                LAUNCH_US + size as f64 / (LOCAL_COPY_GBPS * 1e3)
            };
            return (time, size as f64 / (time * 1e3), 0.0);
        }
        let busbw = self.busbw_at(size);
        let algbw = busbw / (2.0 * (n - 1.0) / n);
        // GB/s = 1e3 bytes/us
        (size as f64 / (algbw * 1e3), algbw, busbw)
    }

    /// nccl-tests stdout (new format: `root` and `#wrong` columns; nccl-tests
    /// `src/util.cu` prints the header, the device lines and the average).
    pub fn stdout(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "# nThread {} nGpus {} minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} agg iters: 1 validation: 1 graph: 0",
            self.threads.max(1),
            self.gpus_per_thread.max(1),
            self.min_bytes,
            self.max_bytes,
            self.factor,
            self.warmup_iters,
            self.iters
        );
        o.push_str("#\n# Using devices\n");
        for r in 0..self.ranks() {
            let _ = writeln!(
                o,
                "#  Rank {r:>2} Group  0 Pid {:>6} on {:>10} device {r:>2} [0000:{:02x}:00] NVIDIA H100 80GB HBM3",
                self.pid,
                self.host,
                0x18 + r * 0x10
            );
        }
        o.push_str("#\n");
        o.push_str("#                                                              out-of-place                       in-place          \n");
        o.push_str("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
        o.push_str("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n");
        let mut sum = 0.0;
        let list = sizes(self.min_bytes, self.max_bytes, self.factor);
        for &size in &list {
            let (t, a, b) = self.row(size, false);
            let (ti, ai, bi) = self.row(size, true);
            let _ = writeln!(
                o,
                "{size:>12}  {count:>12}     float     sum      -1  {t:>7}  {a:>6.2}  {b:>6.2}  {w:>5}  {ti:>7}  {ai:>6.2}  {bi:>6.2}  {z:>5}",
                count = size / 4,
                t = fmt_time(t),
                ti = fmt_time(ti),
                w = self.wrong,
                z = 0
            );
            sum += b + bi;
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
        let _ = writeln!(o, "# Avg bus bandwidth    : {} \n#", fmt_g(avg));
        o
    }

    /// NCCL INFO lines of the process (INIT and NET subsystems): the network NCCL
    /// initialised once, then per rank its communicator and ring channels.
    pub fn debug_log(&self) -> String {
        let mut o = String::new();
        let ranks = self.ranks();
        let p0 = format!("{}:{}:{} [0] NCCL INFO", self.host, self.pid, self.pid);
        let _ = writeln!(o, "{p0} Bootstrap : Using {}:10.0.0.1<0>", self.ifname);
        let _ = writeln!(o, "{p0} cudaDriverVersion 12040");
        let _ = writeln!(
            o,
            "{p0} NCCL version {}+cuda{}",
            self.nccl_version, self.cuda_version
        );
        let _ = writeln!(
            o,
            "{p0} NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin."
        );
        match self.transport {
            Transport::Socket => {
                let _ = writeln!(o, "{p0} NET/IB : No device found.");
                let _ = writeln!(o, "{p0} NET/Socket : Using [0]{}:10.0.0.1<0>", self.ifname);
                let _ = writeln!(o, "{p0} Using network Socket");
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
                    "{p0} NET/IB : Using {} [RO]; OOB {}:10.0.0.1<0>",
                    list.join(" "),
                    self.ifname
                );
                let _ = writeln!(o, "{p0} Using network IB");
            }
        }
        let net_gdr = self.gdr && self.transport != Transport::Socket;
        // nccl-tests inits all GPUs of a one-thread process with ncclCommInitAll.
        let init = if self.threads.max(1) == 1 {
            "ncclCommInitAll"
        } else {
            "ncclCommInitRank"
        };
        for rank in 0..ranks {
            let tid = self.pid + 1 + rank / self.gpus_per_thread.max(1);
            let p = format!("{}:{}:{tid} [{rank}] NCCL INFO", self.host, self.pid);
            let bus = 0x18 + rank * 0x10;
            if self.path == PeerPath::Net && self.transport == Transport::Ib {
                for (i, (h, _)) in self.hcas.iter().enumerate() {
                    let hca = h.split(':').next().unwrap_or(h);
                    let _ = writeln!(
                        o,
                        "{p} NET/IB : GPU Direct RDMA {} for HCA {i} '{hca}'",
                        if self.gdr { "Enabled" } else { "Disabled" }
                    );
                }
            }
            let _ = writeln!(
                o,
                "{p} {init} comm 0x55a2{rank:04x} rank {rank} nranks {ranks} cudaDev {rank} nvmlDev {rank} busId {bus:x}000 commId 0x5eed - Init START"
            );
            let _ = writeln!(
                o,
                "{p} comm 0x55a2{rank:04x} rank {rank} nRanks {ranks} nNodes 1 localRanks {ranks} localRank {rank} MNNVL 0"
            );
            let next = (rank + 1) % ranks;
            let prev = (rank + ranks - 1) % ranks;
            match self.path {
                PeerPath::Alone => {
                    let _ = writeln!(o, "{p} Channel 00/32 : 0");
                }
                PeerPath::P2p => {
                    let _ = writeln!(
                        o,
                        "{p} Channel 00/0 : {rank}[{rank}] -> {next}[{next}] via P2P/direct pointer"
                    );
                }
                PeerPath::Shm => {
                    let _ = writeln!(
                        o,
                        "{p} Channel 00/0 : {rank}[{rank}] -> {next}[{next}] via SHM/direct/direct"
                    );
                }
                PeerPath::Net => {
                    let net = match self.transport {
                        Transport::Socket => "NET/Socket/0".to_string(),
                        _ => {
                            let dev = if self.hcas.is_empty() {
                                0
                            } else {
                                rank as usize % self.hcas.len()
                            };
                            format!("NET/IB/{dev}{}", if net_gdr { "/GDRDMA" } else { "" })
                        }
                    };
                    let _ = writeln!(
                        o,
                        "{p} Channel 00/0 : {rank}[{rank}] -> {next}[{next}] [send] via {net}"
                    );
                    let _ = writeln!(
                        o,
                        "{p} Channel 00/0 : {prev}[{prev}] -> {rank}[{rank}] [receive] via {net}"
                    );
                }
            }
            let _ = writeln!(
                o,
                "{p} Connected all rings, use ring PXN 0 GDR {}",
                u8::from(net_gdr && self.path == PeerPath::Net)
            );
            let _ = writeln!(
                o,
                "{p} {init} comm 0x55a2{rank:04x} rank {rank} nranks {ranks} cudaDev {rank} nvmlDev {rank} busId {bus:x}000 commId 0x5eed - Init COMPLETE"
            );
        }
        o
    }
}

/// C's `%g` (six significant digits, trailing zeros dropped), as nccl-tests prints the
/// average bus bandwidth (`src/util.cu`).
fn fmt_g(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_finite() {
            "0".into()
        } else {
            v.to_string()
        };
    }
    let digits = 5 - v.abs().log10().floor() as i32;
    let s = format!("{:.*}", digits.max(0) as usize, v);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// nccl-tests' time column: `%7.0f` from 10 ms, `%7.1f` from 100 us, else `%7.2f`.
fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:.0}")
    } else if us >= 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railguard_prober::nccl::NcclObservation;

    /// The loopback run the prober makes on a DGX H100: `-g 8`, P2P and SHM off.
    fn run() -> StandinRun {
        StandinRun {
            host: "gpu-a".into(),
            threads: 1,
            gpus_per_thread: 8,
            path: PeerPath::Net,
            busbw_gbps: 46.5,
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

    fn observe(r: &StandinRun) -> NcclObservation {
        NcclObservation::from_texts([r.stdout().as_str(), r.debug_log().as_str()]).unwrap()
    }

    fn fixture(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../prober/fixtures/nccl-tests")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn the_loopback_run_is_one_node_of_eight_ranks_over_the_nics() {
        let obs = observe(&run());
        let perf = obs.perf.as_ref().unwrap();
        assert_eq!(perf.rows.len(), 11, "8M..8G");
        assert_eq!(perf.ranks, Some(8), "one process of -g 8");
        assert_eq!(obs.nodes(), Some(1));
        assert_eq!(obs.log.hosts.len(), 1);
        let plateau = obs.busbw_plateau_gbps().unwrap();
        assert!(plateau > 45.0 && plateau < 46.5, "{plateau}");
        assert_eq!(obs.log.net, Some(Transport::Ib));
        assert!(obs.log.intra_node.is_empty(), "{:?}", obs.log.intra_node);
        assert_eq!(obs.log.gdr, Some(true));
        assert_eq!(obs.log.hcas, vec!["mlx5_0:1", "mlx5_3:1"]);
        assert_eq!(obs.wrong(), Some(0));
        assert_eq!(obs.nccl_version().as_deref(), Some("2.21.5"));
    }

    #[test]
    fn nccl_picks_p2p_then_shm_then_the_network() {
        assert_eq!(peer_path(1, false, false), PeerPath::Alone);
        assert_eq!(peer_path(1, true, true), PeerPath::Alone);
        assert_eq!(peer_path(8, false, false), PeerPath::P2p);
        assert_eq!(peer_path(8, false, true), PeerPath::P2p);
        assert_eq!(peer_path(8, true, false), PeerPath::Shm);
        assert_eq!(peer_path(8, true, true), PeerPath::Net);
        let mut r = run();
        r.path = PeerPath::P2p;
        r.busbw_gbps = 470.0;
        let obs = observe(&r);
        assert!(
            obs.log.intra_node.contains("P2P/direct"),
            "{:?}",
            obs.log.intra_node
        );
        assert!(
            !obs.log.hcas.is_empty(),
            "NCCL still opens the HCAs at init"
        );
        r.path = PeerPath::Shm;
        assert!(observe(&r).log.intra_node.contains("SHM"));
    }

    /// Held to a real `-g 1` run (fixture gtx1660-1x1-allreduce-g1-one-rank.txt): one rank,
    /// one node, busbw 0.00 on every row, average `0`, channels without a transport.
    #[test]
    fn one_gpu_is_one_rank_with_busbw_zero_like_the_real_tool() {
        let real = fixture("gtx1660-1x1-allreduce-g1-one-rank.txt");
        let real_obs = NcclObservation::from_texts([real.as_str()]).unwrap();
        let mut r = run();
        r.gpus_per_thread = 1;
        r.path = peer_path(1, true, true);
        r.min_bytes = 8;
        r.max_bytes = 8 << 20;
        let out = r.stdout();
        let obs = observe(&r);
        for o in [&real_obs, &obs] {
            let perf = o.perf.as_ref().unwrap();
            assert_eq!(perf.ranks, Some(1));
            assert_eq!(o.nodes(), Some(1));
            assert_eq!(perf.rows.len(), 21, "8 B .. 8 MiB");
            assert!(perf
                .rows
                .iter()
                .all(|row| row.out_of_place.busbw_gbps == 0.0));
            assert_eq!(o.busbw_plateau_gbps(), Some(0.0));
            assert!(o.log.intra_node.is_empty());
        }
        assert!(real.contains("# Avg bus bandwidth    : 0\n"));
        assert!(out.contains("# Avg bus bandwidth    : 0 \n"), "{out}");
        assert!(out.starts_with("# nThread 1 nGpus 1 minBytes 8 maxBytes 8388608"));
    }

    /// Held to a real single-node `-g 8` run (superbench-a100-1x8-allreduce-interleaved-info.txt):
    /// the same header, eight ranks of one Pid on one host.
    #[test]
    fn eight_gpus_in_one_process_print_like_the_real_tool() {
        let real = fixture("superbench-a100-1x8-allreduce-interleaved-info.txt");
        let real_perf = NcclObservation::from_texts([real.as_str()])
            .unwrap()
            .perf
            .unwrap();
        let mut r = run();
        r.path = PeerPath::P2p;
        r.min_bytes = 1;
        r.max_bytes = 8 << 30;
        let out = r.stdout();
        let perf = observe(&r).perf.unwrap();
        assert_eq!(perf.ranks, Some(8));
        assert_eq!(real_perf.ranks, perf.ranks);
        let header = |t: &str| {
            t.lines()
                .find(|l| l.starts_with("# nThread"))
                .unwrap()
                .split(" step")
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(header(&out), header(&real));
        let pids = |t: &str| {
            t.lines()
                .filter(|l| l.starts_with("#  ") && l.contains(" Pid "))
                .map(|l| {
                    l.split(" Pid ")
                        .nth(1)
                        .unwrap()
                        .split_whitespace()
                        .next()
                        .unwrap()
                        .to_string()
                })
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        };
        assert_eq!(pids(&out), 1);
        assert_eq!(pids(&real), 1);
    }

    #[test]
    fn faults_show_in_the_output() {
        let mut r = run();
        r.transport = Transport::Socket;
        r.wrong = 2;
        let obs = observe(&r);
        assert_eq!(obs.log.net, Some(Transport::Socket));
        assert_eq!(obs.log.gdr, Some(false));
        assert_eq!(obs.wrong(), Some(22));
        assert_eq!(obs.log.errors, vec!["NET/IB : No device found."]);
    }

    #[test]
    fn size_arguments_and_number_formats() {
        assert_eq!(parse_size("8M"), Some(8 << 20));
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(parse_size("64"), Some(64));
        assert_eq!(parse_size("x"), None);
        assert_eq!(sizes(8, 64, 2), vec![8, 16, 32, 64]);
        assert_eq!(fmt_g(68.40481), "68.4048");
        assert_eq!(fmt_g(0.0), "0");
        assert_eq!(fmt_g(200.5), "200.5");
        assert_eq!(fmt_time(9.321), "9.32");
        assert_eq!(fmt_time(1162.21), "1162.2");
        assert_eq!(fmt_time(16215.2), "16215");
    }
}
