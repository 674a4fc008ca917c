//! Property-based fuzzing of the prober's decoders of outside input (issue #14): nccl-tests
//! output, NCCL debug logs (and the analysis over both), `nvidia-smi topo -m`, sysfs
//! attribute files (through the readers of one port and of the PCI tree, and whole
//! discovery), ACS config space, and the peer frames of both protocols (RDMA side channel,
//! campaign control channel) with the hex fields inside them. Mutations of the fixtures and
//! of real frames, and raw input; no panic, every rejection a clear error, no non-finite
//! number in what decodes, and frames decode the same however the bytes arrive and re-encode
//! to themselves.
//!
//! `RAILGUARD_FUZZ_CASES=1000000 cargo test --release -p railguard-prober --test fuzz` is
//! the benchmark-style run of BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use fuzz_support::{
    check_error, check_message, config, config_heavy, mutated, mutated_text, raw_bytes, raw_text,
};
use proptest::prelude::*;
use proptest::sample::Index;
use railguard_api::FabricProfile;
use railguard_campaign::wire::{self as control, ControlMessage};
use railguard_prober::analyze::{analyze, render_report};
use railguard_prober::discover::{
    acs_from_config, discover, read_pci_devices, read_port, DiscoverError,
};
use railguard_prober::nccl::ranks::decode_id;
use railguard_prober::nccl::{parse_debug_log, parse_perf_output, NcclObservation};
use railguard_prober::rdma::peer::channel::{decode_nonce, FrameCodec, FrameError, FrameFormat};
use railguard_prober::rdma::peer::wire::{self as side, read_message, Message};
use railguard_prober::topo;
use railguard_sim::{write_sysfs, NodeModel};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

fn fixtures(dir: &str) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(dir);
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| fs::read_to_string(p).unwrap())
        .collect()
}

fn seeds(dir: &str) -> Vec<Vec<u8>> {
    fixtures(dir).into_iter().map(String::into_bytes).collect()
}

fn text(seeds: Vec<Vec<u8>>, dictionary: &'static [&'static str]) -> impl Strategy<Value = String> {
    mutated(seeds, dictionary, 6).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn h100() -> &'static FabricProfile {
    static PROFILE: OnceLock<FabricProfile> = OnceLock::new();
    PROFILE.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../api/fixtures/profiles/dgx-h100-ndr.yaml");
        railguard_api::profiles_from_yaml(&fs::read_to_string(path).unwrap())
            .unwrap()
            .remove(0)
    })
}

fn finite(what: &str, v: f64) -> Result<(), TestCaseError> {
    prop_assert!(v.is_finite() && v >= 0.0, "{what} is {v}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// nccl-tests output and NCCL debug logs.

const PERF_TOKENS: &[&str] = &[
    "#",
    "# ",
    "\n",
    "  ",
    "float",
    "sum",
    "-1",
    "N/A",
    "1e+06",
    "# Avg bus bandwidth    : ",
    "# Out of bounds values : 0 OK",
    "# Collective test concluded: all_reduce_perf\n",
    "# Collective test starting: all_reduce_perf\n",
    "# error: ",
    "#  Rank  0 Group  0 Pid 1 on ",
    "# nThread 1 nGpus 8 ",
    "# NCCL version 2.21.5+cuda12.4",
    "# nccl-tests version 2.19.6 ",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong",
    "#  Using devices",
    "out-of-place",
    "in-place",
    "(us)",
    "(GB/s)",
];

const LOG_TOKENS: &[&str] = &[
    "NCCL INFO ",
    "NCCL WARN ",
    "NCCL ERROR ",
    "NCCL version ",
    "NET/IB",
    "NET/Socket",
    "NET/IB : Using [0]mlx5_0:1/IB",
    "Using network IB",
    "Using network Socket",
    "GDRDMA",
    "via NET/IB/0/GDRDMA",
    "via P2P/IPC",
    "via SHM/direct/direct",
    "nRanks 16 nNodes 2",
    "comm 0x55 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1 - Init COMPLETE",
    "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
    "NCCL_IB_HCA set to ",
    "NCCL_SOCKET_IFNAME set by environment to ",
    "Bootstrap : Using eth0:10.0.0.1<0>",
    "\"",
    "'",
    "[",
    "]",
    ":",
    "/",
    "\n",
    "host-1:1234:5678 [0] ",
    "misc/socket.cc:",
    "unhandled ",
];

fn perf_property(text: &str) -> Result<(), TestCaseError> {
    match parse_perf_output(text) {
        Ok(None) => {}
        Ok(Some(report)) => {
            prop_assert!(!report.rows.is_empty());
            finite("avg busbw", report.avg_busbw_gbps)?;
            for row in &report.rows {
                for p in [&row.out_of_place, &row.in_place] {
                    finite("time", p.time_us)?;
                    finite("algbw", p.algbw_gbps)?;
                    finite("busbw", p.busbw_gbps)?;
                }
            }
            for v in [
                report.plateau_busbw_gbps(),
                report.plateau_algbw_gbps(),
                report.max_busbw_gbps(),
            ]
            .into_iter()
            .flatten()
            {
                finite("plateau", v)?;
            }
            let _ = report.wrong();
        }
        Err(e) => check_error(&e)?,
    }
    Ok(())
}

/// The log alone, then the text as `railguard-prober analyze` reads it (table and log),
/// judged against the H100 profile and rendered.
fn log_property(text: &str) -> Result<(), TestCaseError> {
    let report = parse_debug_log(text);
    for e in &report.errors {
        prop_assert!(!e.trim().is_empty(), "empty NCCL error line");
    }
    match NcclObservation::from_texts([text]) {
        Ok(obs) => {
            let result = obs.to_result();
            for v in [
                result.busbw_plateau_gbps,
                result.algbw_gbps,
                result.avg_busbw_gbps,
            ]
            .into_iter()
            .flatten()
            {
                finite("certificate bandwidth", v)?;
            }
            let analysis = analyze(&obs, Some(&h100().spec));
            let rendered = render_report(&analysis);
            prop_assert!(!rendered.trim().is_empty());
            let _ = analyze(&obs, None);
        }
        Err(e) => check_error(&e)?,
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// nvidia-smi topo -m.

const TOPO_TOKENS: &[&str] = &[
    "X",
    "SOC",
    "SYS",
    "NODE",
    "PHB",
    "PXB",
    "PIX",
    "NV18",
    "NV12",
    "NV1",
    "GPU0",
    "GPU7",
    "GPU4294967295",
    "NIC0",
    "NIC11",
    "mlx5_0",
    "\t",
    " ",
    "\n",
    "CPU Affinity",
    "NUMA Affinity",
    "GPU NUMA ID",
    "0-55,112-167",
    "N/A",
    "Legend:",
    "NIC Legend:",
    "  NIC0: mlx5_0",
    "#",
];

fn topo_property(text: &str) -> Result<(), TestCaseError> {
    match topo::parse(text) {
        Ok(t) => {
            let matrix = t.matrix();
            for row in &matrix {
                prop_assert_eq!(row.len(), matrix.first().map_or(0, Vec::len));
            }
            let _ = t.nic_roles();
            let (_map, findings) = t.affinity();
            for f in &findings {
                check_message(&f.message)?;
            }
        }
        Err(e) => check_error(&e)?,
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// sysfs attribute files.

/// A simulated node's tree, and the attribute files of the parts fuzzed: one port's (with
/// its counters, GID table and netdev) and the PCI device files of a GPU, an HCA and a
/// bridge.
struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
    hca: String,
    port_files: Vec<PathBuf>,
    pci_files: Vec<PathBuf>,
}

fn files_under(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_file() {
            out.push(e.path());
        } else if ft.is_dir() && depth > 0 {
            files_under(&e.path(), depth - 1, out);
        }
    }
}

fn tree(model: &str) -> Tree {
    let model = NodeModel::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("models/{model}.yaml")),
    )
    .unwrap();
    // On tmpfs when there is one: every case writes files.
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let root = dir.path().to_path_buf();
    let sim = write_sysfs(&model, &root).unwrap();
    let hca = "mlx5_0".to_string();
    let hdir = root.join("sys/class/infiniband").join(&hca);
    let mut port_files = Vec::new();
    files_under(&hdir.join("ports/1"), 3, &mut port_files);
    if let Ok(net) = fs::canonicalize(hdir.join("device/net")) {
        files_under(&net, 1, &mut port_files);
    }
    let mut pci_files = Vec::new();
    let mut addresses: Vec<&String> = sim.addresses.values().collect();
    addresses.sort();
    for addr in addresses.into_iter().take(12) {
        let dev = fs::canonicalize(root.join("sys/bus/pci/devices").join(addr)).unwrap();
        files_under(&dev, 0, &mut pci_files);
    }
    // Bridges (their ACS config space).
    for e in fs::read_dir(root.join("sys/bus/pci/devices"))
        .unwrap()
        .flatten()
    {
        let dev = fs::canonicalize(e.path()).unwrap();
        if dev.join("config").is_file() {
            pci_files.push(dev.join("config"));
        }
    }
    pci_files.sort();
    pci_files.dedup();
    port_files.sort();
    assert!(
        port_files.iter().any(|p| p.ends_with("rate")),
        "{port_files:?}"
    );
    assert!(
        pci_files.iter().any(|p| p.ends_with("numa_node")),
        "{pci_files:?}"
    );
    Tree {
        _dir: dir,
        root,
        hca,
        port_files,
        pci_files,
    }
}

/// Replaces one file's content for the duration of a check, then restores it.
fn with_content<T>(path: &Path, content: &[u8], check: impl FnOnce() -> T) -> T {
    let original = fs::read(path).unwrap();
    fs::write(path, content).unwrap();
    let out = check();
    fs::write(path, original).unwrap();
    out
}

/// Attribute text: the file's own value mutated, or raw.
fn attribute() -> impl Strategy<Value = Vec<u8>> {
    let values: Vec<Vec<u8>> = [
        "400 Gb/sec (4X NDR)\n",
        "4: ACTIVE\n",
        "5: LinkUp\n",
        "InfiniBand\n",
        "Ethernet\n",
        "0x1a\n",
        "0\n",
        "1\n",
        "-1\n",
        "18446744073709551615\n",
        "N/A (no PMA)\n",
        "32.0 GT/s PCIe\n",
        "16\n",
        "0x10de\n",
        "0x030200\n",
        "9000\n",
        "RoCE v2\n",
        "IB/RoCE v1\n",
        "fe80:0000:0000:0000:0000:0000:0000:0001\n",
        "eth2\n",
        "0000:0000:0000:0000:0000:0000:0000:0000\n",
        "Unknown speed\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    prop_oneof![
        4 => mutated(values, &[], 3),
        1 => raw_bytes(64),
        1 => raw_bytes(5000),
    ]
}

/// Whether a passive port read takes `file` as text (so junk in it must be an error).
fn port_reads_as_text(file: &Path) -> bool {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let parent = file
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    (["state", "rate", "link_layer", "phys_state"].contains(&name) && parent == "1")
        || ["counters", "hw_counters"].contains(&parent)
        || file.ends_with("gids/0")
        || name == "dev_port"
}

fn port_property(tree: &Tree, file: &Path, content: &[u8]) -> Result<(), TestCaseError> {
    let port = with_content(file, content, || read_port(&tree.root, &tree.hca, 1));
    match &port {
        Ok(port) => {
            if let Some(rate) = port.rate_gbps {
                finite("rate", rate)?;
            }
        }
        // Junk is an error naming the one file this case wrote (netdev files by their
        // `device/net` link), and what it holds.
        Err(DiscoverError::Junk { message }) => {
            check_message(message)?;
            let named = message.split(" is not ").next().unwrap_or_default();
            let same = fs::canonicalize(named).ok() == fs::canonicalize(file).ok();
            prop_assert!(same, "{message} (wrote {})", file.display());
        }
        Err(e) => return Err(TestCaseError::fail(format!("the port is there: {e}"))),
    }
    if std::str::from_utf8(content).is_err() && port_reads_as_text(file) {
        prop_assert!(
            port.is_err(),
            "{} not UTF-8, read as a value",
            file.display()
        );
    }
    Ok(())
}

fn pci_property(tree: &Tree, file: &Path, content: &[u8]) -> Result<(), TestCaseError> {
    let read = with_content(file, content, || read_pci_devices(&tree.root));
    let (devices, findings) =
        read.map_err(|e| TestCaseError::fail(format!("the PCI tree is there: {e}")))?;
    for d in devices.values() {
        for v in [d.link.current_speed_gts, d.link.max_speed_gts]
            .into_iter()
            .flatten()
        {
            finite("link speed", v)?;
        }
    }
    // The tree is clean but for this file: every finding names it, with what it holds.
    for f in &findings {
        check_message(&f.message)?;
        prop_assert!(
            f.evidence
                .iter()
                .any(|e| e.starts_with(&file.display().to_string())),
            "{f:?}"
        );
    }
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if std::str::from_utf8(content).is_err() && ["vendor", "device", "class"].contains(&name) {
        prop_assert!(
            !findings.is_empty(),
            "{} not UTF-8, read as a value",
            file.display()
        );
    }
    Ok(())
}

/// Config space: a bridge's real one mutated (the capability chain), or raw.
fn config_space() -> impl Strategy<Value = Vec<u8>> {
    let mut acs = vec![0u8; 4096];
    // Extended capability at 0x100: AER (id 1) -> 0x140: ACS (id 0xd) with redirect bits.
    acs[0x100..0x104].copy_from_slice(&(0x0001u32 | (0x140 << 20)).to_le_bytes());
    acs[0x140..0x144].copy_from_slice(&0x000du32.to_le_bytes());
    acs[0x146] = 0b1100;
    let mut looped = acs.clone();
    looped[0x140..0x144].copy_from_slice(&(0x0002u32 | (0x100 << 20)).to_le_bytes());
    prop_oneof![
        3 => mutated(vec![acs, looped, vec![0u8; 256]], &[], 8),
        1 => raw_bytes(4200),
    ]
}

// ---------------------------------------------------------------------------------------
// Peer frames.

const SIDE_MESSAGES: &[&str] = &[
    r#"{"type":"hello","node":"gpu-1","profile":"h100-ndr","nonce":"00112233445566778899aabbccddeeff"}"#,
    r#"{"type":"challenge","node":"gpu-2","profile":"h100-ndr","nonce":"ffeeddccbbaa99887766554433221100","proof":"abcdef"}"#,
    r#"{"type":"auth","proof":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}"#,
    r#"{"type":"testRequest","hca":"mlx5_0","port":1,"memory":{"kind":"gpu","gpu":3},"sizes":[8,65536,1048576],"iterations":100,"initiator":{"hca":"mlx5_0","port":1,"qpn":4242,"psn":7,"lid":12,"gid":"fe800000000000000000000000000001","gid_index":3,"rkey":99,"addr":140737488355328,"len":1048576,"mtu":5}}"#,
    r#"{"type":"accept","responder":{"hca":"mlx5_3","port":1,"qpn":1,"psn":2,"lid":3,"gid":"00000000000000000000000000000000","gid_index":0,"rkey":4,"addr":5,"len":6,"mtu":4,"sim":{"rail":"x"}}}"#,
    r#"{"type":"refuse","reason":"rail busy"}"#,
    r#"{"type":"done","ok":true}"#,
    r#"{"type":"bye"}"#,
    r#"{"type":"error","reason":"no such HCA"}"#,
];

const CONTROL_MESSAGES: &[&str] = &[
    r#"{"type":"hello","nonce":"00112233445566778899aabbccddeeff"}"#,
    r#"{"type":"request","proof":"ab","request":{"op":"status"}}"#,
    r#"{"type":"request","proof":"ab","request":{"op":"runTest","profile":"h100-ndr","peerNode":"gpu-2","peerAddr":"10.0.0.2:7470","rails":[{"hca":"mlx5_0","port":1}],"memory":{"kind":"host"},"sizes":[65536],"iterations":10,"timeoutMs":30000}}"#,
    r#"{"type":"request","proof":"ab","request":{"op":"runNccl","profile":"h100-ndr","peerNode":"gpu-2","peerAddr":"10.0.0.2:7470","rails":[{"hca":"mlx5_0","port":1}],"gpus":[0,1],"sizes":[1048576],"warmup":1,"iterations":5,"timeoutMs":60000}}"#,
    r#"{"type":"response","response":{"type":"status","node":"gpu-1","profile":"h100-ndr","devices":["mlx5_0"],"gpuPods":[]}}"#,
    r#"{"type":"response","response":{"type":"testResult","node":"gpu-1","peerNode":"gpu-2","rails":[{"rail":{"hca":"mlx5_0","port":1},"outcome":"measured","bwGbps":391.5,"latencyUs":2.25},{"rail":{"hca":"mlx5_3","port":1},"outcome":"failed","reason":"dead wire"}]}}"#,
    r#"{"type":"response","response":{"type":"refused","reason":"GPU pods running"}}"#,
    r#"{"type":"error","reason":"bad proof"}"#,
];

const FRAME_TOKENS: &[&str] = &[
    "RGRP",
    "RGCT",
    "\u{0}\u{1}",
    "\u{0}\u{2}",
    "\u{0}\u{0}\u{0}\u{0}",
    "\u{7f}\u{7f}\u{7f}\u{7f}",
    "{",
    "}",
    "\"type\":",
    "\"type\":\"bye\"",
    "null",
    "\"",
    ":",
    ",",
    "[",
    "]",
];

fn frame<M: Serialize>(format: FrameFormat, msg: &M) -> Vec<u8> {
    let mut out = BytesMut::new();
    FrameCodec::<M>::new(format).encode(msg, &mut out).unwrap();
    out.to_vec()
}

/// Real frames of a protocol: each message alone, and two back to back.
fn frame_seeds<M: Serialize + DeserializeOwned>(
    format: FrameFormat,
    messages: &[&str],
) -> Vec<Vec<u8>> {
    let frames: Vec<Vec<u8>> = messages
        .iter()
        .map(|m| frame(format, &serde_json::from_str::<M>(m).unwrap()))
        .collect();
    let mut out = frames.clone();
    out.push([frames[0].clone(), frames[frames.len() - 1].clone()].concat());
    out
}

/// What decoding a byte stream gives: the messages in order, then how it ended.
fn decode_stream<M: DeserializeOwned>(
    format: FrameFormat,
    bytes: &[u8],
    chunks: &[usize],
) -> (Vec<M>, Result<(), String>) {
    let mut codec = FrameCodec::<M>::new(format);
    let mut buf = BytesMut::new();
    let mut messages = Vec::new();
    let mut rest = bytes;
    let mut chunk = chunks.iter().cycle();
    loop {
        let take = chunk
            .next()
            .map_or(rest.len(), |&n| n.max(1))
            .min(rest.len());
        buf.extend_from_slice(&rest[..take]);
        rest = &rest[take..];
        loop {
            let step = if rest.is_empty() {
                codec.decode_eof(&mut buf)
            } else {
                codec.decode(&mut buf)
            };
            match step {
                Ok(Some(m)) => messages.push(m),
                Ok(None) if rest.is_empty() => return (messages, Ok(())),
                Ok(None) => break,
                Err(e) => return (messages, Err(e.to_string())),
            }
        }
    }
}

/// Frames decode the same whole or split at any points, errors are clear, and each decoded
/// message re-encodes to a frame that decodes to it.
fn frames_property<M>(
    format: FrameFormat,
    bytes: &[u8],
    chunks: &[usize],
) -> Result<(), TestCaseError>
where
    M: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let whole = decode_stream::<M>(format, bytes, &[bytes.len()]);
    let split = decode_stream::<M>(format, bytes, chunks);
    prop_assert_eq!(&whole, &split, "decoding depends on how the bytes arrive");
    if let Err(e) = &whole.1 {
        check_message(e)?;
    }
    for m in &whole.0 {
        let again = decode_stream::<M>(format, &frame(format, m), &[1, 7, 64]);
        prop_assert_eq!(&again.1, &Ok(()));
        prop_assert_eq!(again.0.len(), 1);
        prop_assert_eq!(&again.0[0], m, "re-encoded message decodes differently");
    }
    Ok(())
}

/// The blocking reader of the side channel: reads one frame, errors are clear.
fn blocking_property(bytes: &[u8]) -> Result<(), TestCaseError> {
    let mut r = std::io::Cursor::new(bytes);
    match read_message(&mut r, "gpu-2", "hello") {
        Ok(m) => {
            let _: Message = m;
            prop_assert!(r.position() as usize <= bytes.len());
        }
        Err(e) => check_error(&e)?,
    }
    let mut r = std::io::Cursor::new(bytes);
    if let Err(e) = FrameCodec::<ControlMessage>::new(control::FORMAT).read_blocking(&mut r) {
        check_error(&e)?;
        if let FrameError::TooLarge { max } = e {
            prop_assert_eq!(max, control::MAX_FRAME_BYTES as usize);
        }
    }
    Ok(())
}

/// Hex fields of the messages: nonces and NCCL unique ids.
fn hex_property(text: &str) -> Result<(), TestCaseError> {
    match decode_nonce(text) {
        Ok(n) => prop_assert!(n.len() >= 16),
        Err(e) => check_message(e)?,
    }
    match decode_id(text) {
        Ok(id) => prop_assert_eq!(
            railguard_prober::nccl::ranks::encode_id(&id),
            text.trim().to_ascii_lowercase()
        ),
        Err(e) => check_message(&e)?,
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(2_000))]

    #[test]
    fn nccl_tests_output_mutations(text in text(seeds("nccl-tests"), PERF_TOKENS)) {
        perf_property(&text)?;
        log_property(&text)?;
    }

    #[test]
    fn nccl_tests_output_raw(text in raw_text(PERF_TOKENS)) {
        perf_property(&text)?;
    }

    #[test]
    fn nccl_debug_log_mutations(text in text(seeds("nccl-debug"), LOG_TOKENS)) {
        log_property(&text)?;
    }

    #[test]
    fn nccl_debug_log_raw(text in raw_text(LOG_TOKENS)) {
        log_property(&text)?;
    }

    #[test]
    fn topo_mutations(text in text(seeds("topo"), TOPO_TOKENS)) {
        topo_property(&text)?;
    }

    #[test]
    fn topo_raw(text in raw_text(TOPO_TOKENS)) {
        topo_property(&text)?;
    }

    #[test]
    fn acs_config_space(config in config_space()) {
        let _ = acs_from_config(&config);
    }

    #[test]
    fn side_channel_frames(
        bytes in prop_oneof![
            4 => mutated(frame_seeds::<Message>(side::FORMAT, SIDE_MESSAGES), FRAME_TOKENS, 4),
            1 => raw_bytes(256),
        ],
        chunks in prop::collection::vec(1usize..64, 1..8),
    ) {
        frames_property::<Message>(side::FORMAT, &bytes, &chunks)?;
        blocking_property(&bytes)?;
    }

    #[test]
    fn control_channel_frames(
        bytes in prop_oneof![
            4 => mutated(
                frame_seeds::<ControlMessage>(control::FORMAT, CONTROL_MESSAGES),
                FRAME_TOKENS,
                4,
            ),
            1 => raw_bytes(256),
        ],
        chunks in prop::collection::vec(1usize..64, 1..8),
    ) {
        frames_property::<ControlMessage>(control::FORMAT, &bytes, &chunks)?;
        blocking_property(&bytes)?;
    }

    #[test]
    fn hex_fields(text in prop_oneof![
        mutated_text(
            &["00112233445566778899aabbccddeeff", &"ab".repeat(128)],
            &["0", "f", "F", "g", " ", "\n", "0x"],
            3,
        ),
        raw_text(&[]),
    ]) {
        hex_property(&text)?;
    }
}

/// One tree per test, built on first use and shared by its cases.
fn shared(cell: &'static OnceLock<Mutex<Tree>>, model: &str) -> MutexGuard<'static, Tree> {
    cell.get_or_init(|| Mutex::new(tree(model)))
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

static IB_TREE: OnceLock<Mutex<Tree>> = OnceLock::new();
static ROCE_TREE: OnceLock<Mutex<Tree>> = OnceLock::new();
static PCI_TREE: OnceLock<Mutex<Tree>> = OnceLock::new();

proptest! {
    // Each case writes a file and reads a port or the PCI tree: fewer cases in CI.
    #![proptest_config(config(1_000))]

    #[test]
    fn sysfs_ib_port_attributes(which in any::<Index>(), content in attribute()) {
        let tree = shared(&IB_TREE, "dgx-h100");
        let file = which.get(&tree.port_files).clone();
        port_property(&tree, &file, &content)?;
    }

    #[test]
    fn sysfs_roce_port_attributes(which in any::<Index>(), content in attribute()) {
        let tree = shared(&ROCE_TREE, "roce-cloud");
        let file = which.get(&tree.port_files).clone();
        port_property(&tree, &file, &content)?;
    }

}

proptest! {
    // Reads the whole PCI tree (every device) per case: a tenth of RAILGUARD_FUZZ_CASES.
    #![proptest_config(config_heavy(400, 10))]

    #[test]
    fn sysfs_pci_attributes(which in any::<Index>(), content in attribute()) {
        let tree = shared(&PCI_TREE, "dgx-h100");
        let file = which.get(&tree.pci_files).clone();
        pci_property(&tree, &file, &content)?;
    }
}

static DISCOVERY_TREE: OnceLock<Mutex<Tree>> = OnceLock::new();

proptest! {
    // Whole discovery (every file read, affinity, readiness and fabric findings) over a
    // tree with several junk files: heavier, so a tenth of the cases.
    #![proptest_config(config_heavy(100, 10))]

    #[test]
    fn discovery_with_junk_files(
        edits in prop::collection::vec((any::<Index>(), any::<bool>(), attribute()), 1..6),
    ) {
        let t = shared(&DISCOVERY_TREE, "roce-cloud");
        let mut originals = Vec::new();
        for (which, pci, content) in &edits {
            let file = which.get(if *pci { &t.pci_files } else { &t.port_files });
            originals.push((file.clone(), fs::read(file).unwrap()));
            fs::write(file, content).unwrap();
        }
        let discovery = discover(&t.root, false);
        // Newest first, so a file edited twice gets its own content back.
        for (file, content) in originals.iter().rev() {
            fs::write(file, content).unwrap();
        }
        let d = discovery.map_err(|e| TestCaseError::fail(format!("the tree is there: {e}")))?;
        for f in &d.findings {
            check_message(&f.message)?;
        }
    }
}

#[test]
fn seeds_parse() {
    for t in fixtures("nccl-tests") {
        perf_property(&t).unwrap();
        // One fixture is a run cut short (an error); the others are tables.
        assert!(!matches!(parse_perf_output(&t), Ok(None)));
    }
    for t in fixtures("nccl-debug") {
        log_property(&t).unwrap();
    }
    for t in fixtures("topo") {
        topo::parse(&t).unwrap();
    }
    for (format, n) in [
        (side::FORMAT, SIDE_MESSAGES.len()),
        (control::FORMAT, CONTROL_MESSAGES.len()),
    ] {
        let seeds = if format == side::FORMAT {
            frame_seeds::<Message>(format, SIDE_MESSAGES)
        } else {
            frame_seeds::<ControlMessage>(format, CONTROL_MESSAGES)
        };
        assert_eq!(seeds.len(), n + 1);
    }
    for seed in frame_seeds::<Message>(side::FORMAT, SIDE_MESSAGES) {
        let (messages, end) = decode_stream::<Message>(side::FORMAT, &seed, &[3]);
        assert!(end.is_ok() && !messages.is_empty(), "{end:?}");
    }
}

/// Found by `nccl_debug_log_raw`: an `NCCL WARN` line with nothing after it was recorded as
/// an empty error (a warning that reads as nothing in the analysis and the certificate).
#[test]
fn bare_nccl_warn_is_a_named_warning() {
    let report = parse_debug_log("NCCL WARN \r\nhost:1:2 [0] NCCL WARN    \n");
    assert_eq!(
        report.errors,
        vec![railguard_prober::nccl::debug_log::EMPTY_WARN.to_string()]
    );
}

fn fixture(dir: &str, name: &str) -> String {
    fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures")
            .join(dir)
            .join(name),
    )
    .unwrap()
}

/// Found by `nccl_tests_output_mutations`: `# Avg bus bandwidth : -1` was taken as a
/// bandwidth of -1 GB/s; a negative average is as unusable as garbage.
#[test]
fn negative_average_is_rejected() {
    let text = fixture("nccl-tests", "oci-h100-roce-2x8-allreduce.txt");
    let line = text
        .lines()
        .find(|l| l.starts_with("# Avg bus bandwidth"))
        .unwrap();
    let value = line.rsplit(':').next().unwrap().trim();
    let bad = text.replace(line, &line.replace(value, "-1"));
    let err = parse_perf_output(&bad).unwrap_err();
    assert!(
        err.to_string()
            .contains("bad `Avg bus bandwidth` value \"-1\""),
        "{err}"
    );
}

/// The computed average (a run that concludes without one) of values near f64::MAX is
/// finite: summing first overflowed to infinity.
#[test]
fn computed_average_of_huge_rows_is_finite() {
    let text = fixture(
        "nccl-tests",
        "dgx-spark-gb10-2x1-allreduce-2.20.0-concluded.txt",
    );
    let huge = text.replace("    0.96    0.96 ", " 1.7e308 1.7e308 ");
    assert_ne!(huge, text);
    let report = parse_perf_output(&huge).unwrap().unwrap();
    assert!(
        report.avg_busbw_gbps.is_finite(),
        "{}",
        report.avg_busbw_gbps
    );
}
