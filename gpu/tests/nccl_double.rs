//! NCCL's C API through the binding, against the NCCL and CUDA test doubles (gpu/doubles):
//! a real two-rank all-reduce over TCP, timed and checked, with the doubles loaded by the
//! same dlopen code as libnccl.so.2 and libcuda.so.1.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use railguard_gpu::{CudaDriver, Nccl, NcclError};

fn build(dir: &Path, source: &str, name: &str) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("doubles")
        .join(source);
    let out = dir.join(name);
    let status = Command::new("cc")
        .args([
            "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-pthread", "-o",
        ])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("a C compiler (cc) builds {source}: {e}"));
    assert!(status.success(), "building {}", src.display());
    out
}

fn doubles() -> (tempfile::TempDir, Arc<CudaDriver>, Arc<Nccl>) {
    let dir = tempfile::tempdir().unwrap();
    let cuda = build(dir.path(), "libcuda_double.c", "libcuda.so.1");
    let nccl = build(dir.path(), "libnccl_double.c", "libnccl.so.2");
    let cuda = CudaDriver::load(Some(&cuda)).unwrap();
    let nccl = Nccl::load(Some(&nccl)).unwrap();
    (dir, cuda, nccl)
}

/// Two ranks (threads), one GPU each, a sweep of three sizes.
fn pair_sweep(
    cuda: &Arc<CudaDriver>,
    nccl: &Arc<Nccl>,
) -> Result<Vec<Vec<railguard_gpu::collective::SweepPoint>>, NcclError> {
    let id = nccl.unique_id()?;
    let devices = cuda.devices()?;
    let sizes = [4096usize, 1 << 16, 1 << 20];
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u32)
            .map(|rank| {
                let device = devices[rank as usize].clone();
                s.spawn(move || {
                    let stream = cuda.stream(&device)?;
                    let mut comm = nccl.init_rank(&id, 2, rank, &stream)?;
                    comm.all_reduce_sweep(cuda, &device, &stream, &sizes, 2, 5)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The entry point of the child processes the tests below start (the doubles read their
/// environment, so each scenario gets a process of its own): runs the pair and prints one
/// line per rank on stdout, or the error.
#[test]
fn child_pair() {
    if std::env::var_os("RAILGUARD_GPU_TEST_CHILD").is_none() {
        return;
    }
    let (_dir, cuda, nccl) = doubles();
    println!("VERSION {} {}", nccl.version(), nccl.version_string());
    match pair_sweep(&cuda, &nccl) {
        Ok(ranks) => {
            for points in ranks {
                let summary: Vec<String> = points
                    .iter()
                    .map(|p| {
                        assert!(p.time_us > 0.0 && p.algbw_gbps > 0.0, "{p:?}");
                        // two ranks: busbw = algbw * 2(n-1)/n = algbw
                        assert!((p.busbw_gbps - p.algbw_gbps).abs() < 1e-12, "{p:?}");
                        format!("{}:{}", p.bytes, p.wrong)
                    })
                    .collect();
                println!("RANK {}", summary.join(" "));
                let busbw: Vec<String> = points
                    .iter()
                    .map(|p| format!("{}:{:.4}", p.bytes, p.busbw_gbps))
                    .collect();
                println!("BUSBW {}", busbw.join(" "));
            }
        }
        Err(e) => println!("ERROR {e}"),
    }
}

/// Runs [`child_pair`] in a child process with `env`; (stdout, stderr).
fn run_child(env: &[(&str, &str)]) -> (String, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_pair", "--nocapture", "--test-threads=1"])
        .env("RAILGUARD_GPU_TEST_CHILD", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

fn rank_lines(stdout: &str) -> Vec<&str> {
    // The harness may print `test child_pair ... ` in front of the first line.
    stdout
        .lines()
        .filter_map(|l| {
            l.find("RANK ")
                .or_else(|| l.find("ERROR "))
                .map(|at| &l[at..])
        })
        .collect()
}

#[test]
fn a_two_rank_all_reduce_runs_for_real_over_the_doubles() {
    let (out, _) = run_child(&[]);
    assert_eq!(
        rank_lines(&out),
        [
            "RANK 4096:0 65536:0 1048576:0",
            "RANK 4096:0 65536:0 1048576:0"
        ],
        "{out}"
    );
}

#[test]
fn a_corrupted_result_is_counted() {
    let (out, _) = run_child(&[("RAILGUARD_NCCL_DOUBLE_CORRUPT", "1")]);
    assert_eq!(
        rank_lines(&out),
        [
            "RANK 4096:1 65536:1 1048576:1",
            "RANK 4096:1 65536:1 1048576:1"
        ],
        "{out}"
    );
}

#[test]
fn an_init_failure_carries_nccls_message() {
    let (out, err) = run_child(&[
        ("RAILGUARD_NCCL_DOUBLE_FAIL", "init"),
        ("NCCL_DEBUG", "WARN"),
    ]);
    let lines = rank_lines(&out);
    assert_eq!(lines.len(), 1, "{out}");
    assert!(
        lines[0].contains("ncclCommInitRank failed: unhandled system error"),
        "{out}"
    );
    assert!(
        err.contains("NCCL WARN Call to ibv_reg_dmabuf_mr failed"),
        "{err}"
    );
}

#[test]
fn a_missing_library_is_a_value() {
    let missing = Nccl::load(Some(Path::new("/nonexistent/libnccl.so.2"))).unwrap_err();
    assert!(matches!(missing, NcclError::Load { .. }), "{missing}");
}

/// The double's NCCL lines against a real NCCL 2.27.5 log of an HGX H100 RoCE node
/// (`prober/fixtures/nccl-debug/hgx-h100-roce400-2node-init-gdrdma.txt`): the same shapes,
/// with the double's numbers in them.
fn shape(line: &str) -> String {
    let msg = line.split(" NCCL INFO ").nth(1).unwrap_or(line);
    msg.split_whitespace()
        .map(|w| {
            if w.starts_with("0x") {
                return "0x".to_string();
            }
            // Each run of digits becomes one `9`.
            let mut out = String::new();
            for c in w.chars() {
                if c.is_ascii_digit() {
                    if !out.ends_with('9') {
                        out.push('9');
                    }
                } else {
                    out.push(c);
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn real_shapes() -> std::collections::BTreeSet<String> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../prober/fixtures/nccl-debug/hgx-h100-roce400-2node-init-gdrdma.txt");
    let text = std::fs::read_to_string(&fixture).unwrap_or_else(|e| {
        panic!("{}: {e}", fixture.display());
    });
    text.lines()
        .filter(|l| l.contains(" NCCL INFO "))
        .map(shape)
        .collect()
}

#[test]
fn two_ranks_of_one_process_are_one_node_and_use_p2p_unless_it_is_disabled() {
    // One process, two GPUs: one node, NCCL's first transport, no NIC (src/transport.cc).
    let (_, log) = run_child(&[
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_3:1"),
    ]);
    for want in [
        "NCCL INFO NCCL version 2.21.5+cuda12.4",
        "NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_3:1/RoCE [RO]",
        "NCCL INFO Using network IB",
        "rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
        "rank 1 nRanks 2 nNodes 1 localRanks 2 localRank 1 MNNVL 0",
        "Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer",
        "Channel 01/0 : 1[1] -> 0[0] via P2P/direct pointer",
    ] {
        assert!(log.contains(want), "missing {want:?} in:\n{log}");
    }
    assert!(!log.contains("via NET/"), "{log}");
    // P2P off: SHM (src/transport/shm.cc).
    let (_, log) = run_child(&[("NCCL_DEBUG", "INFO"), ("NCCL_P2P_DISABLE", "1")]);
    assert!(log.contains("0[0] -> 1[1] via SHM/direct/direct"), "{log}");
    assert!(
        !log.contains("via NET/") && !log.contains("via P2P"),
        "{log}"
    );
}

#[test]
fn with_p2p_and_shm_off_every_hop_goes_through_the_rank_s_own_nic() {
    // The node loopback railguard certifies with: each GPU sends through its own HCA.
    let (_, log) = run_child(&[
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_3:1"),
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_SHM_DISABLE", "1"),
    ]);
    for want in [
        "nNodes 1 localRanks 2",
        "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA",
        "Channel 00/0 : 0[0] -> 1[1] [receive] via NET/IB/1/GDRDMA",
        "Channel 01/0 : 1[1] -> 0[0] [send] via NET/IB/1/GDRDMA",
        "NET/IB : GPU Direct RDMA Enabled for HCA 0",
        "NET/IB : GPU Direct RDMA Enabled for HCA 1",
    ] {
        assert!(log.contains(want), "missing {want:?} in:\n{log}");
    }
    assert!(
        !log.contains("via P2P") && !log.contains("via SHM"),
        "{log}"
    );
    // Every comm and channel line has a shape real NCCL prints.
    let real = real_shapes();
    for line in log
        .lines()
        .filter(|l| l.contains(" comm 0x") || l.contains(" Channel "))
    {
        let mine = shape(line);
        assert!(
            real.contains(&mine),
            "{line:?} ({mine:?}) is not a line real NCCL prints"
        );
    }
}

#[test]
fn the_shared_builder_makes_both_doubles_for_other_crates_tests() {
    let dir = tempfile::tempdir().unwrap();
    let built = railguard_gpu::doubles::build(dir.path()).unwrap();
    assert!(built.cuda.ends_with("libcuda.so.1") && built.nccl.ends_with("libnccl.so.2"));
    let nccl = Nccl::load(Some(&built.nccl)).unwrap();
    assert_eq!(nccl.version(), 22105);
}

/// The `VERSION` line of a child's stdout.
fn version_line(stdout: &str) -> &str {
    stdout
        .lines()
        .find_map(|l| l.find("VERSION ").map(|at| &l[at..]))
        .unwrap_or_default()
}

/// busbw (GB/s) of `bytes` on each `BUSBW` line of a child's stdout.
fn busbw_of(stdout: &str, bytes: usize) -> Vec<f64> {
    stdout
        .lines()
        .filter_map(|l| l.find("BUSBW ").map(|at| &l[at + 6..]))
        .filter_map(|rest| {
            rest.split_whitespace().find_map(|p| {
                let (b, bw) = p.split_once(':')?;
                (b.parse::<usize>().ok()? == bytes).then(|| bw.parse::<f64>().ok())?
            })
        })
        .collect()
}

#[test]
fn ncclgetversion_answers_as_nccl_h_encodes_the_version() {
    let (out, _) = run_child(&[]);
    assert_eq!(version_line(&out), "VERSION 22105 2.21.5", "{out}");
    let (out, log) = run_child(&[
        ("RAILGUARD_NCCL_DOUBLE_VERSION", "2.32.3"),
        ("NCCL_DEBUG", "INFO"),
    ]);
    assert_eq!(version_line(&out), "VERSION 23203 2.32.3", "{out}");
    assert!(
        log.contains("NCCL INFO NCCL version 2.32.3+cuda12.4"),
        "{log}"
    );
    // Up to 2.8 NCCL_VERSION(X,Y,Z) is X*1000 + Y*100 + Z (src/nccl.h.in).
    let (out, _) = run_child(&[("RAILGUARD_NCCL_DOUBLE_VERSION", "2.8.4")]);
    assert_eq!(version_line(&out), "VERSION 2804 2.8.4", "{out}");
}

#[test]
fn a_simulated_fabric_sets_the_bus_bandwidth_and_moves_uniform_messages_as_values() {
    // 0.05 GB/s: a 1 MiB all-reduce of two ranks takes 21 ms, far above the cost of
    // exchanging the values once per synchronisation; a busy machine may only add to it.
    let fabric = [
        ("RAILGUARD_NCCL_DOUBLE_BUSBW_GBPS", "0.05"),
        ("RAILGUARD_CUDA_DOUBLE_LAZY", "1"),
    ];
    let (out, _) = run_child(&fabric);
    assert_eq!(
        rank_lines(&out),
        [
            "RANK 4096:0 65536:0 1048576:0",
            "RANK 4096:0 65536:0 1048576:0"
        ],
        "{out}"
    );
    let bws = busbw_of(&out, 1 << 20);
    assert_eq!(bws.len(), 2, "{out}");
    for bw in bws {
        assert!(
            (0.03..=0.0501).contains(&bw),
            "busbw {bw} for 0.05 GB/s:\n{out}"
        );
    }
    // A wrong element travels with the value.
    let mut corrupt = fabric.to_vec();
    corrupt.push(("RAILGUARD_NCCL_DOUBLE_CORRUPT", "1"));
    let (out, _) = run_child(&corrupt);
    assert_eq!(
        rank_lines(&out),
        [
            "RANK 4096:1 65536:1 1048576:1",
            "RANK 4096:1 65536:1 1048576:1"
        ],
        "{out}"
    );
    // Per path: two ranks of one process use P2P unless it is disabled.
    let (out, _) = run_child(&[
        ("RAILGUARD_NCCL_DOUBLE_BUSBW_GBPS", "ib=4,p2p=0.05"),
        ("RAILGUARD_CUDA_DOUBLE_LAZY", "1"),
    ]);
    for bw in busbw_of(&out, 1 << 20) {
        assert!((0.03..=0.0501).contains(&bw), "P2P busbw {bw}:\n{out}");
    }
    // cuMemsetD32 without RAILGUARD_CUDA_DOUBLE_LAZY writes the memory and still leaves a
    // uniform message the fabric can move.
    let (out, _) = run_child(&[("RAILGUARD_NCCL_DOUBLE_BUSBW_GBPS", "0.05")]);
    assert_eq!(
        rank_lines(&out),
        [
            "RANK 4096:0 65536:0 1048576:0",
            "RANK 4096:0 65536:0 1048576:0"
        ],
        "{out}"
    );
}

/// A sysfs root whose HCAs have port 1 in the given states.
fn ports(states: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (hca, state) in states {
        let port = dir
            .path()
            .join(format!("sys/class/infiniband/{hca}/ports/1"));
        std::fs::create_dir_all(&port).unwrap();
        std::fs::write(port.join("state"), format!("{state}\n")).unwrap();
    }
    dir
}

#[test]
fn nccl_opens_only_active_ports_and_honours_its_ib_and_gdr_switches() {
    let loopback = [
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_3:1"),
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_SHM_DISABLE", "1"),
    ];
    // NCCL skips a port that is not ACTIVE (src/transport/net_ib/init.cc).
    let sysfs = ports(&[("mlx5_0", "4: ACTIVE"), ("mlx5_3", "1: DOWN")]);
    let mut env = loopback.to_vec();
    let root = sysfs.path().display().to_string();
    env.push(("RAILGUARD_NCCL_DOUBLE_SYSFS", &root));
    let (_, log) = run_child(&env);
    assert!(
        log.contains("NET/IB : Using [0]mlx5_0:1/RoCE [RO]"),
        "{log}"
    );
    assert!(!log.contains("mlx5_3"), "{log}");
    // No active port: no IB device, the socket transport.
    let down = ports(&[("mlx5_0", "1: DOWN"), ("mlx5_3", "1: DOWN")]);
    let root = down.path().display().to_string();
    let mut env = loopback.to_vec();
    env.push(("RAILGUARD_NCCL_DOUBLE_SYSFS", &root));
    let (_, log) = run_child(&env);
    assert!(log.contains("NET/IB : No device found."), "{log}");
    assert!(log.contains("Using network Socket"), "{log}");
    assert!(log.contains("via NET/Socket/0"), "{log}");
    // NCCL_IB_DISABLE=1: sockets; NCCL_NET_GDR_LEVEL=LOC: IB without GPUDirect RDMA.
    let mut env = loopback.to_vec();
    env.push(("NCCL_IB_DISABLE", "1"));
    let (_, log) = run_child(&env);
    assert!(log.contains("Using network Socket"), "{log}");
    let mut env = loopback.to_vec();
    env.push(("NCCL_NET_GDR_LEVEL", "LOC"));
    let (_, log) = run_child(&env);
    assert!(
        log.contains("via NET/IB/0\n") || log.contains("via NET/IB/0 "),
        "{log}"
    );
    assert!(!log.contains("GDRDMA"), "{log}");
    assert!(log.contains("GPU Direct RDMA Disabled for HCA 0"), "{log}");
}
