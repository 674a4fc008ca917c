//! The native RDMA engine, for real: two qemu VMs (Debian kernel, Soft-RoCE `rdma_rxe`) joined
//! by a QEMU UDP socket network, each with an `rxe0` device on its virtual NIC.
//!
//! VM A: device list, loopback sweep on its device, RDMA WRITE with a wrong rkey, then serves
//! three peer sessions. VM B: loopback on its device, then a device-to-device test into A over
//! the authenticated side channel, a session with a wrong token, and a session whose peer
//! vanishes after the QP exchange; last, alone on the machine once A is done, a loopback at
//! `ib_write_bw`'s defaults (64 KiB, 5000 writes) for BENCHMARKS.md. Every loopback also runs
//! `ib_write_lat`'s ping-pong (2 bytes, 1000 round trips, half the round trip reported). Each step prints `RG-RESULT <label> <json>` on the VM's
//! serial console, which goes to a log file kept under the target dir for debugging.
//!
//! The image (kernel, busybox, rdma-core, modules) is built from Debian packages by
//! `prober/vm/build-image.sh` and cached; see prober/vm/README.md for the packages.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BOOT_TO_RESULT_LIMIT: Duration = Duration::from_secs(900);
/// Loopback sweeps up to 8 MiB; the VM-to-VM path (UDP between two emulated machines) is about
/// ten times slower, so the peer sweep stops at 1 MiB to keep the test within minutes.
const SIZES: &str = "8,4096,65536,1048576,8388608";
const PEER_SIZES: &str = "8,4096,65536,1048576";
/// `ib_write_bw`'s defaults: its message size and `DEF_ITERS_WB` (linux-rdma/perftest
/// `src/perftest_parameters.h`); tx depth and cq moderation are the engine's own.
const BW_DEFAULT_SIZE: &str = "65536";
const BW_DEFAULT_ITERATIONS: u32 = 5000;
/// `ib_write_lat`'s defaults, which every loopback's ping-pong uses: 1000 round trips of 2
/// bytes, statistics over 999 intervals less the 2 slowest (`print_report_lat`).
const PINGPONG_ITERATIONS: u64 = 1000;
const PINGPONG_SAMPLES: u64 = 997;
/// Where the CUDA test double lives inside the VMs.
const CUDA_IN_VM: &str = "/rg/lib/libcuda.so.1";

fn work_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rdma-vm");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create work dir");
    dir
}

fn free_udp_port() -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    s.local_addr().expect("local addr").port()
}

fn script(common: &str, body: &str) -> String {
    format!("set -x\n{common}\n{body}\n")
}

fn build_image(
    dir: &Path,
    files: &[(&Path, &str)],
    vms: &[(&str, &Path)],
) -> (PathBuf, BTreeMap<String, PathBuf>) {
    let mut cmd = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../vm/build-image.sh"));
    cmd.arg("--binary")
        .arg(env!("CARGO_BIN_EXE_railguard-rdma-vmtest"))
        .arg("--out")
        .arg(dir.join("image"));
    for (src, dest) in files {
        cmd.arg("--file").arg(format!("{}={dest}", src.display()));
    }
    for (name, path) in vms {
        cmd.arg("--vm").arg(format!("{name}={}", path.display()));
    }
    let out = cmd.output().expect("run prober/vm/build-image.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    std::fs::write(dir.join("build-image.log"), stderr.as_bytes()).expect("write build log");
    assert!(out.status.success(), "build-image.sh failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut kernel = None;
    let mut initrds = BTreeMap::new();
    for line in stdout.lines() {
        if let Some(k) = line.strip_prefix("KERNEL=") {
            kernel = Some(PathBuf::from(k));
        } else if let Some(rest) = line.strip_prefix("INITRD_") {
            let (name, path) = rest.split_once('=').expect("INITRD_name=path");
            initrds.insert(name.to_string(), PathBuf::from(path));
        }
    }
    (kernel.expect("build-image.sh printed no KERNEL"), initrds)
}

fn boot(kernel: &Path, initrd: &Path, log: &Path, mac: &str, local: u16, remote: u16) -> Child {
    Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-cpu", "max", "-m", "256", "-smp", "1"])
        .args(["-display", "none", "-monitor", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .arg("-netdev")
        .arg(format!(
            "socket,id=n0,udp=127.0.0.1:{remote},localaddr=127.0.0.1:{local}"
        ))
        .args([
            "-device",
            &format!("virtio-net-pci,netdev=n0,mac={mac},romfile="),
        ])
        .arg("-serial")
        .arg(format!("file:{}", log.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start qemu-system-x86_64 (install it with prober/vm/install-deps.sh)")
}

/// Waits for both VMs to power off; kills them at the deadline.
fn wait_all(vms: &mut [(&str, Child, PathBuf)]) {
    let deadline = Instant::now() + BOOT_TO_RESULT_LIMIT;
    loop {
        let mut running = false;
        for (name, child, log) in vms.iter_mut() {
            match child.try_wait().expect("poll qemu") {
                Some(status) => assert!(
                    status.success(),
                    "qemu for VM {name} exited with {status}; log {}",
                    log.display()
                ),
                None => running = true,
            }
        }
        if !running {
            return;
        }
        if Instant::now() > deadline {
            for (_, child, _) in vms.iter_mut() {
                let _ = child.kill();
                let _ = child.wait();
            }
            let tails: Vec<String> = vms
                .iter()
                .map(|(n, _, log)| format!("--- VM {n} ({}):\n{}", log.display(), tail(log)))
                .collect();
            panic!(
                "VMs did not finish in {BOOT_TO_RESULT_LIMIT:?}\n{}",
                tails.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// `RG-RESULT <label> <json>` lines of a serial log.
fn results(log: &Path) -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(log).expect("read VM log");
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(pos) = line.find("RG-RESULT ") else {
            continue;
        };
        let rest = line[pos + "RG-RESULT ".len()..].trim_end_matches('\r');
        let (label, json) = rest.split_once(' ').expect("RG-RESULT label json");
        let value: Value = serde_json::from_str(json).unwrap_or_else(|e| {
            panic!(
                "bad result JSON for {label} in {}: {e}: {json}",
                log.display()
            )
        });
        out.insert(label.to_string(), value);
    }
    out
}

fn f64_at(v: &Value, path: &str) -> f64 {
    v.pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} missing or not a number in {v}"))
}

/// A loopback's ping-pong: `ib_write_lat`'s defaults, a positive half round trip that is the
/// result's latency, and every write seen landing by the side waiting for it (`wait`: the last
/// byte of its receive buffer for host memory, the write's immediate for GPU memory).
fn assert_pingpong(label: &str, r: &Value, wait: &str) {
    let l = &r["latency"];
    assert!(l.is_object(), "{label}: no ping-pong latency in {r}");
    assert_eq!(l["bytes"], 2, "{label}: {l}");
    assert_eq!(l["iterations"], PINGPONG_ITERATIONS, "{label}: {l}");
    assert_eq!(l["samples"], PINGPONG_SAMPLES, "{label}: {l}");
    let typical = f64_at(l, "/typical_us");
    assert!(typical > 0.0 && typical.is_finite(), "{label}: {l}");
    assert!(
        f64_at(l, "/min_us") <= typical && typical <= f64_at(l, "/max_us"),
        "{label}: {l}"
    );
    assert_eq!(f64_at(r, "/small_msg_latency_us"), typical, "{label}: {r}");
    assert_eq!(l["wait"], wait, "{label}: {l}");
    // Each round trip: A's write seen by B, B's seen by A. With `last-byte` the engine also
    // compared the final message at each target with its source.
    assert_eq!(l["delivered"], 2 * PINGPONG_ITERATIONS, "{label}: {l}");
}

/// A successful sweep: every requested size measured, with positive bandwidth and latency.
fn assert_sweep(label: &str, r: &Value, want_sizes: &str) {
    assert!(r.get("error").is_none(), "{label} failed: {r}");
    let points = r["points"]
        .as_array()
        .unwrap_or_else(|| panic!("{label}: no points in {r}"));
    let sizes: Vec<u64> = points
        .iter()
        .map(|p| p["bytes"].as_u64().unwrap_or(0))
        .collect();
    let want: Vec<u64> = want_sizes
        .split(',')
        .map(|s| s.parse().unwrap_or(0))
        .collect();
    assert_eq!(sizes, want, "{label}: sizes");
    for p in points {
        assert!(f64_at(p, "/bw_gbps") > 0.0, "{label}: {p}");
        assert!(f64_at(p, "/lat_us") > 0.0, "{label}: {p}");
    }
    assert!(f64_at(r, "/peak_bw_gbps") > 0.0);
    assert!(f64_at(r, "/small_msg_latency_us") > 0.0);
    // Latency grows with message size (8 B vs 8 MiB differ by orders of magnitude).
    assert!(f64_at(&points[points.len() - 1], "/lat_us") > f64_at(&points[0], "/lat_us"));
}

#[test]
fn verbs_engine_on_soft_roce_vms() {
    let dir = work_dir();
    let token: String = format!("vm-token-{:016x}", rand::random::<u64>());
    // GPU memory comes from the CUDA test double (host memory behind device pointers): the
    // registration calls, the DMA-BUF refusal of Soft-RoCE and the writes are real verbs.
    let doubles = railguard_gpu::doubles::build(&dir).expect("build the CUDA test double");
    let common = format!(
        "export RAILGUARD_PEER_TOKEN={token} RAILGUARD_PROFILE=vm RAILGUARD_SIZES={SIZES} RAILGUARD_ITERATIONS=10\n\
         export RAILGUARD_CUDA_LIBRARY={CUDA_IN_VM} RAILGUARD_GPU_BUS_IDS=0000:04:00.0,0000:84:00.0 RAILGUARD_CUDA_DOUBLE_PCI=0000:04:00.0,0000:84:00.0\n\
         export RAILGUARD_CUDA_DOUBLE_DMABUF=memfd\n\
         $IP link set eth0 up"
    );
    let vmtest = "/bin/railguard-rdma-vmtest";
    let a = script(
        &common,
        &format!(
            "$IP addr add 169.254.10.1/24 dev eth0\n\
             $RDMA link add rxe0 type rxe netdev eth0\n\
             $RDMA link show\n\
             {vmtest} devices\n\
             {vmtest} loopback --hca rxe0\n\
             {vmtest} wrong-rkey --hca rxe0\n\
             {vmtest} loopback --hca mlx5_9 --label missing-hca\n\
             {vmtest} loopback --hca rxe0 --port 2 --label missing-port\n\
             {vmtest} loopback --hca rxe0 --gpu 0 --label gpu-auto --sizes {PEER_SIZES}\n\
             {vmtest} loopback --hca rxe0 --gpu 1 --label gpu-far --sizes {PEER_SIZES}\n\
             {vmtest} loopback --hca rxe0 --gpu 0 --gpu-registration dma-buf --label gpu-dma-buf-only\n\
             RAILGUARD_CUDA_DOUBLE_PEERMEM=0 {vmtest} loopback --hca rxe0 --gpu 0 --label gpu-no-peermem\n\
             RAILGUARD_CUDA_LIBRARY=/rg/lib/absent/libcuda.so.1 {vmtest} loopback --hca rxe0 --gpu 0 --label gpu-no-libcuda\n\
             {vmtest} loopback --hca rxe0 --gpu 5 --label gpu-unknown\n\
             {vmtest} serve --node vm-a --listen 169.254.10.1:18515 --sessions normal,normal,normal,vanish"
        ),
    );
    let b = script(
        &common,
        &format!(
            "$IP addr add 169.254.10.2/24 dev eth0\n\
             $RDMA link add rxe0 type rxe netdev eth0\n\
             {vmtest} loopback --hca rxe0\n\
             {vmtest} loopback --hca rxe0 --traffic-class 106 --service-level 3 --label lossless-class\n\
             {vmtest} connect --node vm-b --peer-addr 169.254.10.1:18515 --label peer --expect-node vm-a --sizes {PEER_SIZES} --traffic-class 106\n\
             {vmtest} connect --node vm-b --peer-addr 169.254.10.1:18515 --label peer-gpu --gpu 0 --sizes {PEER_SIZES}\n\
             RAILGUARD_PEER_TOKEN=not-the-shared-token {vmtest} connect --node vm-b --peer-addr 169.254.10.1:18515 --label bad-token\n\
             {vmtest} connect --node vm-b --peer-addr 169.254.10.1:18515 --label peer-gone --sizes 4096 --iterations 200 --completion-timeout-ms 3000\n\
             {vmtest} loopback --hca rxe0 --sizes {BW_DEFAULT_SIZE} --iterations {BW_DEFAULT_ITERATIONS} --label ib-write-bw-defaults"
        ),
    );
    let (a_sh, b_sh) = (dir.join("a.sh"), dir.join("b.sh"));
    std::fs::write(&a_sh, a).expect("write a.sh");
    std::fs::write(&b_sh, b).expect("write b.sh");
    let (kernel, initrds) = build_image(
        &dir,
        &[(doubles.cuda.as_path(), CUDA_IN_VM)],
        &[("a", &a_sh), ("b", &b_sh)],
    );

    let (pa, pb) = (free_udp_port(), free_udp_port());
    let (log_a, log_b) = (dir.join("vm-a.log"), dir.join("vm-b.log"));
    eprintln!("VM serial logs: {} {}", log_a.display(), log_b.display());
    let started = Instant::now();
    let mut vms = vec![
        (
            "a",
            boot(&kernel, &initrds["a"], &log_a, "52:54:00:0a:00:01", pa, pb),
            log_a.clone(),
        ),
        (
            "b",
            boot(&kernel, &initrds["b"], &log_b, "52:54:00:0a:00:02", pb, pa),
            log_b.clone(),
        ),
    ];
    wait_all(&mut vms);
    eprintln!("boot to result: {:.1} s", started.elapsed().as_secs_f64());

    let ra = results(&log_a);
    let rb = results(&log_b);
    let context = format!("\nVM a: {ra:?}\nVM b: {rb:?}");

    // The numbers for BENCHMARKS.md (software RDMA under TCG: correctness, not speed).
    for (label, r) in [
        ("loopback VM a", ra.get("loopback")),
        ("loopback VM b", rb.get("loopback")),
        ("loopback VM a, GPU memory", ra.get("gpu-auto")),
        ("VM b -> VM a", rb.get("peer").map(|p| &p["result"])),
        (
            "VM b -> VM a, GPU memory",
            rb.get("peer-gpu").map(|p| &p["result"]),
        ),
    ] {
        if let Some(points) = r.and_then(|r| r["points"].as_array()) {
            eprintln!(
                "{label}:\n  {:>9} {:>12} {:>12}",
                "bytes", "bw Gb/s", "lat us"
            );
            for p in points {
                eprintln!(
                    "  {:>9} {:>12.4} {:>12.1}",
                    p["bytes"].as_u64().unwrap_or(0),
                    p["bw_gbps"].as_f64().unwrap_or(f64::NAN),
                    p["lat_us"].as_f64().unwrap_or(f64::NAN)
                );
            }
        }
    }

    // ib_write_lat's figures of every loopback, and ib_write_bw's at its defaults.
    eprintln!(
        "ping-pong (2 B, {PINGPONG_ITERATIONS} round trips), half round trip:\n  {:<40} {:>10} {:>10} {:>10} {:>10} {:>7} {:>9}",
        "loopback", "typical us", "min us", "avg us", "max us", "inline", "wait"
    );
    for (vm, label, r) in ra
        .iter()
        .map(|(l, r)| ("a", l, r))
        .chain(rb.iter().map(|(l, r)| ("b", l, r)))
    {
        let l = &r["latency"];
        if l.is_object() {
            eprintln!(
                "  {:<40} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>7} {:>9}",
                format!("VM {vm} {label} (gid {})", r["gid_index"]),
                l["typical_us"].as_f64().unwrap_or(f64::NAN),
                l["min_us"].as_f64().unwrap_or(f64::NAN),
                l["avg_us"].as_f64().unwrap_or(f64::NAN),
                l["max_us"].as_f64().unwrap_or(f64::NAN),
                l["inline"],
                l["wait"].as_str().unwrap_or("")
            );
        }
    }
    if let Some(points) = rb
        .get("ib-write-bw-defaults")
        .and_then(|r| r["points"].as_array())
    {
        for p in points {
            eprintln!(
                "ib_write_bw defaults, loopback VM b: {} B x {BW_DEFAULT_ITERATIONS}: {:.4} Gb/s",
                p["bytes"].as_u64().unwrap_or(0),
                p["bw_gbps"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }

    // Device discovery through libibverbs.
    assert_eq!(
        ra.get("devices"),
        Some(&serde_json::json!({"devices": ["rxe0"]})),
        "{context}"
    );

    // Loopback on one device, in each VM.
    for (name, r) in [("a", &ra), ("b", &rb)] {
        let lb = r
            .get("loopback")
            .unwrap_or_else(|| panic!("VM {name}: no loopback result{context}"));
        assert_sweep(&format!("loopback in VM {name}"), lb, SIZES);
        assert_eq!(lb["hca"], "rxe0");
        assert_pingpong(&format!("loopback in VM {name}"), lb, "last-byte");
        // The GID NCCL would choose: the RoCE v2 entry of the VM's IPv4 address
        // (169.254.10.1 and .2, IPv4-mapped), not the link-local one.
        let ip = if name == "a" { "01" } else { "02" };
        assert_eq!(
            lb["gid"],
            format!("00000000000000000000ffffa9fe0a{ip}"),
            "VM {name}: {lb}"
        );
    }

    // ib_write_bw's defaults on real verbs: 64 KiB, 5000 writes, 128 outstanding.
    let bw = rb
        .get("ib-write-bw-defaults")
        .unwrap_or_else(|| panic!("no ib_write_bw-defaults loopback{context}"));
    assert!(bw.get("error").is_none(), "{bw}");
    assert!(f64_at(bw, "/peak_bw_gbps") > 0.0, "{bw}");
    assert_pingpong("ib_write_bw-defaults loopback", bw, "last-byte");

    // A profile's lossless class (rdma.trafficClass 106 = DSCP 26, serviceLevel 3) on the
    // address vector: rxe takes it and the sweep completes.
    let class = rb
        .get("lossless-class")
        .unwrap_or_else(|| panic!("no lossless-class loopback{context}"));
    assert_sweep("loopback in the profile's traffic class", class, SIZES);
    assert_pingpong(
        "loopback in the profile's traffic class",
        class,
        "last-byte",
    );

    // A wrong rkey is NAKed by the target and surfaces as a clean error completion.
    let wr = &ra["wrong-rkey"];
    assert_eq!(wr["kind"], "work-completion", "{context}");
    assert!(
        wr["error"]
            .as_str()
            .unwrap_or("")
            .contains("remote access error"),
        "{wr}"
    );

    // Bad requests against a real device fail cleanly and say why.
    let missing = &ra["missing-hca"];
    assert_eq!(missing["kind"], "device-not-found", "{context}");
    assert!(
        missing["error"]
            .as_str()
            .unwrap_or("")
            .contains("available: rxe0"),
        "{missing}"
    );
    let port = &ra["missing-port"];
    assert_eq!(port["kind"], "port-not-active", "{context}");
    assert!(
        port["error"]
            .as_str()
            .unwrap_or("")
            .contains("state absent"),
        "{port}"
    );
    // GPU memory. Auto: Soft-RoCE cannot import a DMA-BUF, so the peermem path (ibv_reg_mr
    // on the device pointer) carries the test, and the certificate-to-be says both.
    let auto = &ra["gpu-auto"];
    assert_sweep("GPU-memory loopback", auto, PEER_SIZES);
    // Device memory: ib_write_lat --write_with_imm, as perftest requires for it; no inline.
    assert_pingpong("GPU-memory loopback", auto, "immediate");
    assert_eq!(auto["latency"]["inline"], false, "{auto}");
    assert_eq!(
        auto["memory"],
        serde_json::json!({"kind": "gpu", "gpu": 0}),
        "{auto}"
    );
    let reg = &auto["registration"];
    assert_eq!(reg["path"], "peermem", "{auto}");
    assert_eq!(reg["pci_bus_id"], "0000:04:00.0", "{auto}");
    assert_eq!(reg["failed"][0]["path"], "dma-buf", "{auto}");
    let dmabuf_error = reg["failed"][0]["error"].as_str().unwrap_or("");
    assert!(dmabuf_error.contains("ibv_reg_dmabuf_mr failed"), "{auto}");
    // The GPU is chosen by PCI address: GPU 1 is the double's second device.
    assert_eq!(
        ra["gpu-far"]["registration"]["pci_bus_id"], "0000:84:00.0",
        "{context}"
    );
    let unavailable = |label: &str| {
        let r = &ra[label];
        assert_eq!(r["kind"], "gpu-memory-unavailable", "{label}: {r}{context}");
        r["error"].as_str().unwrap_or("").to_string()
    };
    let only = unavailable("gpu-dma-buf-only");
    assert!(only.contains("dma-buf: ibv_reg_dmabuf_mr failed"), "{only}");
    assert!(
        !only.contains("peermem"),
        "DmaBuf tries nothing else: {only}"
    );
    let no_peermem = unavailable("gpu-no-peermem");
    assert!(
        no_peermem.contains("dma-buf: ibv_reg_dmabuf_mr failed")
            && no_peermem.contains("peermem: ibv_reg_mr on the device pointer failed: Bad address")
            && no_peermem.contains("nvidia_peermem is not loaded"),
        "{no_peermem}"
    );
    let no_libcuda = unavailable("gpu-no-libcuda");
    assert!(
        no_libcuda.contains("cannot load the CUDA driver library /rg/lib/absent/libcuda.so.1"),
        "{no_libcuda}"
    );
    let unknown = unavailable("gpu-unknown");
    assert!(unknown.contains("there is no GPU 5"), "{unknown}");

    // Device to device, over the authenticated side channel, in traffic class 106 (the
    // responder takes the initiator's class from the test request, as NCCL's accept side does).
    let peer = rb
        .get("peer")
        .unwrap_or_else(|| panic!("no peer result{context}"));
    assert_eq!(peer["peer_node"], "vm-a", "{context}");
    assert_sweep("peer test", &peer["result"], PEER_SIZES);
    // Two nodes run no ping-pong (yet): the latency is the sweep's post-to-completion.
    assert!(peer["result"].get("latency").is_none(), "{peer}");
    assert_eq!(ra["served-0-normal"]["status"], "completed", "{context}");
    assert_eq!(ra["served-0-normal"]["peer_node"], "vm-b", "{context}");

    // Device to device from GPU memory to GPU memory (GPUDirect RDMA on both nodes).
    let peer_gpu = &rb["peer-gpu"];
    assert_sweep("GPU-memory peer test", &peer_gpu["result"], PEER_SIZES);
    assert_eq!(peer_gpu["remote_memory"]["kind"], "gpu", "{peer_gpu}");
    assert_eq!(
        peer_gpu["result"]["registration"]["path"], "peermem",
        "{peer_gpu}"
    );
    assert_eq!(ra["served-1-normal"]["status"], "completed", "{context}");

    // Wrong token: the initiator rejects the responder's proof; nothing is measured.
    assert_eq!(rb["bad-token"]["kind"], "peer-auth", "{context}");
    assert!(ra["served-2-normal"].get("error").is_some(), "{context}");

    // The peer vanishes after the QP exchange: a clean error, not a hang.
    let gone = &rb["peer-gone"];
    let kind = gone["kind"].as_str().unwrap_or("");
    assert_eq!(kind, "peer-gone", "{gone}{context}");
    assert!(
        gone["error"]
            .as_str()
            .unwrap_or("")
            .contains("during rdma write sweep"),
        "{gone}"
    );
    assert_eq!(ra["served-3-vanish"]["vanished"], true, "{context}");
}
