//! Junk, missing and unreadable sysfs files: discovery reports them (an error for a
//! missing tree, an "unknown"/unreadable finding otherwise) and never panics.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use railguard_prober::discover::{discover, DiscoverError, FindingKind, PortState};
use railguard_sim::{write_sysfs, NodeModel};

fn h100_tree() -> (tempfile::TempDir, railguard_sim::SimulatedTree) {
    let model =
        NodeModel::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/dgx-h100.yaml"))
            .expect("model");
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = write_sysfs(&model, dir.path()).expect("write");
    (dir, tree)
}

fn pci(root: &Path, addr: &str) -> PathBuf {
    fs::canonicalize(root.join("sys/bus/pci/devices").join(addr)).expect("device dir")
}

fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let ft = e.file_type().expect("file type");
        if ft.is_dir() {
            all_files(&e.path(), out);
        } else if ft.is_file() {
            out.push(e.path());
        }
    }
}

#[test]
fn missing_roots_are_errors() {
    let e = discover(Path::new("/nonexistent/railguard"), false).expect_err("no root");
    assert!(matches!(e, DiscoverError::NoRoot { .. }));
    let empty = tempfile::tempdir().expect("tempdir");
    let e = discover(empty.path(), false).expect_err("no sys tree");
    assert!(matches!(e, DiscoverError::NoPciTree { .. }));
    assert!(e.to_string().contains("sys/bus/pci/devices"), "{e}");
}

#[test]
fn junk_values_become_findings_or_unknowns() {
    let (dir, tree) = h100_tree();
    let root = dir.path();
    let gpu0 = pci(root, &tree.addresses["gpu0"]);
    fs::write(gpu0.join("numa_node"), "banana\n").expect("write");
    fs::write(gpu0.join("current_link_width"), "\u{0}\u{1}wide").expect("write");
    let ib = root.join("sys/class/infiniband");
    fs::write(ib.join("mlx5_0/ports/1/rate"), "fast\n").expect("write");
    fs::write(ib.join("mlx5_3/ports/1/state"), "7: SOMETHING\n").expect("write");
    fs::remove_file(ib.join("mlx5_4/ports/1/link_layer")).expect("rm");
    fs::write(ib.join("mlx5_5/ports/1/counters/symbol_error"), "-3\n").expect("write");
    // A dangling device link.
    std::os::unix::fs::symlink(
        "../../../devices/gone",
        root.join("sys/bus/pci/devices/0000:ee:00.0"),
    )
    .expect("symlink");

    let d = discover(root, false).expect("discovery survives junk");
    assert_eq!(d.gpus.len(), 8);
    let unreadable: Vec<&str> = d
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::SysfsUnreadable)
        .map(|f| f.subject.as_str())
        .collect();
    assert!(
        unreadable.contains(&tree.addresses["gpu0"].as_str()),
        "{unreadable:?}"
    );
    assert!(unreadable.contains(&"mlx5_0:1"), "{unreadable:?}");
    assert!(unreadable.contains(&"0000:ee:00.0"), "{unreadable:?}");
    // Junk NUMA is unknown, never local.
    assert_eq!(d.affinity.gpus[0].numa, None);
    assert!(d
        .findings
        .iter()
        .any(|f| f.kind == FindingKind::NumaUnknown && f.subject == "GPU0"));
    let port = |h: &str| d.hcas.iter().find(|x| x.name == h).expect("hca").ports[0].clone();
    assert_eq!(port("mlx5_0").rate_gbps, None);
    assert_eq!(port("mlx5_3").state, PortState::Unknown);
    assert_eq!(port("mlx5_4").link_layer, None);
    assert!(!port("mlx5_5").counters.contains_key("symbol_error"));
    // The unknown-state port is not taken for down, but it is not healthy either.
    assert!(d
        .findings
        .iter()
        .any(|f| f.kind == FindingKind::PortDown && f.subject == "mlx5_3:1"));
}

#[test]
fn unreadable_config_space_gives_an_acs_unknown_finding() {
    let (dir, tree) = h100_tree();
    let root = dir.path();
    // As an unprivileged reader sees it: only the 64-byte header of config space.
    let sw = pci(root, &tree.addresses["sw-0"]);
    for e in fs::read_dir(&sw).expect("dir").flatten() {
        if e.file_name().to_string_lossy().starts_with("0000:") {
            let cfg = e.path().join("config");
            let bytes = fs::read(&cfg).expect("config");
            fs::write(&cfg, &bytes[..64]).expect("truncate");
        }
    }
    // And one config that cannot be read at all.
    let sw1 = pci(root, &tree.addresses["sw-1"]);
    let first_dp = fs::read_dir(&sw1)
        .expect("dir")
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("0000:"))
        .expect("downstream port")
        .path();
    fs::remove_file(first_dp.join("config")).expect("rm");
    fs::create_dir(first_dp.join("config")).expect("a directory cannot be read as a file");

    let d = discover(root, false).expect("discovery");
    let f = d
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::AcsUnknown)
        .expect("acs unknown finding");
    assert!(f.message.contains("unknown"), "{}", f.message);
    assert!(
        f.evidence.iter().any(|e| e.contains("only 64 bytes")),
        "{:?}",
        f.evidence
    );
    assert!(
        f.evidence.iter().any(|e| e.contains("config not readable")),
        "{:?}",
        f.evidence
    );
    assert!(!d
        .findings
        .iter()
        .any(|f| f.kind == FindingKind::AcsRedirect));
}

#[test]
fn every_file_junk_or_empty_never_panics() {
    for mode in ["junk", "empty", "remove-every-third"] {
        let (dir, _) = h100_tree();
        let mut files = Vec::new();
        all_files(&dir.path().join("sys/devices"), &mut files);
        all_files(&dir.path().join("proc"), &mut files);
        for (i, f) in files.iter().enumerate() {
            match mode {
                "junk" => fs::write(f, b"\xff\xfe\x00 not a value \n\n").expect("write"),
                "empty" => fs::write(f, b"").expect("write"),
                _ if i % 3 == 0 => fs::remove_file(f).expect("rm"),
                _ => {}
            }
        }
        let d = discover(dir.path(), false).unwrap_or_else(|e| panic!("{mode}: {e}"));
        if mode != "remove-every-third" {
            // Nothing identifies as a GPU any more: said plainly.
            assert!(d.gpus.is_empty(), "{mode}");
            assert!(
                d.findings.iter().any(|f| f.kind == FindingKind::NoGpus),
                "{mode}"
            );
        }
    }
}

#[test]
fn a_node_without_rdma_devices_is_critical() {
    let (dir, _) = h100_tree();
    fs::remove_dir_all(dir.path().join("sys/class/infiniband")).expect("rm");
    let d = discover(dir.path(), false).expect("discovery");
    assert!(d.rails.is_empty());
    assert!(d.affinity.gpus.iter().all(|g| g.preferred.is_none()));
    let kinds: Vec<_> = d.findings.iter().map(|f| (f.kind, f.severity)).collect();
    assert!(kinds.contains(&(
        FindingKind::NoRdmaDevices,
        railguard_prober::discover::Severity::Critical
    )));
    assert!(kinds.contains(&(
        FindingKind::NoComputeNic,
        railguard_prober::discover::Severity::Critical
    )));
}

/// The `sysfs-unreadable` finding whose evidence names `path`, as `path = content`.
fn junk_evidence(d: &railguard_prober::discover::Discovery, path: &Path) -> Option<String> {
    let path = path.display().to_string();
    d.findings
        .iter()
        .filter(|f| f.kind == FindingKind::SysfsUnreadable)
        .flat_map(|f| f.evidence.iter())
        .find(|e| e.starts_with(&format!("{path} = ")))
        .cloned()
}

#[test]
fn junk_link_width_speed_counters_and_non_utf8_files_are_findings_with_path_and_content() {
    let (dir, tree) = h100_tree();
    let root = dir.path();
    let gpu0 = pci(root, &tree.addresses["gpu0"]);
    let gpu1 = pci(root, &tree.addresses["gpu1"]);
    let gpu2 = pci(root, &tree.addresses["gpu2"]);
    let ib = root.join("sys/class/infiniband");
    let port = ib.join("mlx5_0/ports/1");
    let netdev = fs::read_dir(ib.join("mlx5_1/device/net"))
        .expect("mlx5_1 has a netdev")
        .next()
        .expect("one netdev")
        .expect("entry")
        .path();
    let junk: Vec<(PathBuf, &[u8], &str)> = vec![
        (netdev.join("dev_port"), b"first\n", "\"first\""),
        (gpu0.join("current_link_width"), b"sixteen\n", "\"sixteen\""),
        (gpu0.join("max_link_speed"), b"fast GT/s\n", "\"fast GT/s\""),
        (
            gpu1.join("current_link_speed"),
            b"16.0 MB/s\n",
            "\"16.0 MB/s\"",
        ),
        (
            gpu2.join("max_link_width"),
            b"\xff\xfe16\n",
            "\"\u{fffd}\u{fffd}16\"",
        ),
        (port.join("counters/port_xmit_discards"), b"-3\n", "\"-3\""),
        (
            port.join("hw_counters/out_of_sequence"),
            b"\xff\n",
            "\"\u{fffd}\"",
        ),
        (port.join("link_layer"), b"Token Ring\n", "\"Token Ring\""),
        (
            port.join("phys_state"),
            b"5: \xffLinkUp\n",
            "\"5: \u{fffd}LinkUp\"",
        ),
        (
            ib.join("mlx5_3/fw_ver"),
            b"28.\xc0\x80.1000\n",
            "\"28.\u{fffd}\u{fffd}.1000\"",
        ),
    ];
    for (path, content, _) in &junk {
        assert!(path.is_file(), "the model writes {}", path.display());
        fs::write(path, content).expect("write");
    }
    // The kernel's own "not known" values and absent files are unknowns, not junk.
    fs::write(gpu1.join("max_link_speed"), "Unknown\n").expect("write");
    fs::write(gpu1.join("max_link_width"), "0\n").expect("write");
    fs::remove_file(gpu2.join("current_link_speed")).expect("rm");
    fs::write(
        ib.join("mlx5_4/ports/1/counters/link_downed"),
        "N/A (no PMA)\n",
    )
    .expect("write");

    let d = discover(root, false).expect("discovery survives junk");
    for (path, _, shown) in &junk {
        let evidence = junk_evidence(&d, path)
            .unwrap_or_else(|| panic!("no finding for {}: {:#?}", path.display(), d.findings));
        assert_eq!(evidence, format!("{} = {shown}", path.display()));
    }
    for path in [
        gpu1.join("max_link_speed"),
        gpu1.join("max_link_width"),
        gpu2.join("current_link_speed"),
        ib.join("mlx5_4/ports/1/counters/link_downed"),
    ] {
        assert_eq!(junk_evidence(&d, &path), None, "{}", path.display());
    }
    let hca = |h: &str| d.hcas.iter().find(|x| x.name == h).expect("hca").clone();
    assert_eq!(hca("mlx5_0").ports[0].link_layer, None);
    assert!(!hca("mlx5_0").ports[0]
        .counters
        .contains_key("port_xmit_discards"));
    assert!(!hca("mlx5_0").ports[0]
        .hw_counters
        .contains_key("out_of_sequence"));
    assert!(!hca("mlx5_4").ports[0].counters.contains_key("link_downed"));
    assert_eq!(hca("mlx5_3").fw_ver, None);

    // A passive read of the port: the junk is an error naming the file and its content.
    let e = railguard_prober::discover::read_port(root, "mlx5_0", 1).expect_err("junk port");
    assert!(matches!(e, DiscoverError::Junk { .. }), "{e:?}");
    assert!(e.to_string().contains(&port.display().to_string()), "{e}");
    // An absent file alone is no error.
    assert!(railguard_prober::discover::read_port(root, "mlx5_4", 1).is_ok());
}
