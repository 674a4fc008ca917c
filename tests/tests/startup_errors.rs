//! Start-up failures of the real binaries: each bad input (a port in use, an unreadable or
//! invalid certificate, kubeconfig or profile file, a missing sysfs root) ends the process
//! with exit status 2 and one last stderr line that names the flag and the address or file
//! (and says what to do), with no panic, no backtrace and no ANSI escape.
//!
//! `RAILGUARD_BIN_DIR` points at prebuilt binaries; otherwise each is built on first use.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use railguard_tests::{workspace_binary, workspace_root, ServingCertificate};

/// How long a binary may take to fail (they fail before serving anything).
const DEADLINE: Duration = Duration::from_secs(30);

fn bin(package: &str, name: &str) -> PathBuf {
    workspace_binary(package, name).unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

/// Runs `bin` with a clean environment (no kubeconfig, not in a cluster, logs on, backtraces
/// on so a panic would show), killed after [`DEADLINE`].
fn run(bin: &Path, args: &[&str], home: &Path) -> Output {
    let mut child = Command::new(bin)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("RAILGUARD_LOG", "info")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > DEADLINE => {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
                panic!(
                    "{} {args:?} still running after {DEADLINE:?}; stderr:\n{}",
                    bin.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("{e}"),
        }
    }
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()))
}

/// Exit status 2, the last stderr line is `<program>: ...` naming every one of `names`, and
/// no panic, backtrace or ANSI escape anywhere. Returns the last line.
fn assert_clean_failure(program: &str, out: &Output, names: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{program}: exit {:?}\nstderr:\n{stderr}",
        out.status
    );
    for bad in ["panicked", "stack backtrace", "RUST_BACKTRACE", "\u{1b}["] {
        assert!(
            !stderr.contains(bad),
            "{program}: stderr holds {bad:?}:\n{stderr}"
        );
    }
    let last = stderr.lines().last().unwrap_or_default().to_string();
    assert!(
        last.starts_with(&format!("{program}: ")),
        "{program}: last line {last:?}\nstderr:\n{stderr}"
    );
    for name in names {
        assert!(
            last.contains(name),
            "{program}: {last:?} does not name {name}"
        );
    }
    // The thing and the fix: `<problem>: <cause> — <fix>`, on one line.
    assert!(last.contains(" — "), "{program}: no fix in {last:?}");
    last
}

/// A port held for the test's duration.
fn taken() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}")).to_string();
    (l, addr)
}

fn fixture(path: &str) -> String {
    workspace_root().join(path).display().to_string()
}

fn profiles() -> String {
    fixture("api/fixtures/profiles/dgx-h100-ndr.yaml")
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
        }
    }
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
    fn write(&self, name: &str, text: &str) -> String {
        std::fs::write(self.dir.path().join(name), text).unwrap_or_else(|e| panic!("{e}"));
        self.path(name)
    }
    fn home(&self) -> &Path {
        self.dir.path()
    }
    /// A serving pair: (cert, key).
    fn pair(&self, tag: &str) -> (String, String) {
        let c = ServingCertificate::loopback(tag).unwrap_or_else(|e| panic!("{e}"));
        (
            self.write(&format!("{tag}.crt"), &c.cert_pem),
            self.write(&format!("{tag}.key"), &c.key_pem),
        )
    }
    /// A profile file the schema rejects.
    fn bad_profiles(&self) -> String {
        self.write(
            "bad-profiles.yaml",
            "apiVersion: railguard.io/v1alpha1\nkind: FabricProfile\nmetadata: {name: x}\nspec:\n  rails: [{hca: mlx5_0, port: 1, linkLayer: IB, rateGbps: -4, gpus: [0]}]\n",
        )
    }
    fn garbage(&self) -> String {
        self.write("garbage.yaml", "{{{ this is not YAML\n")
    }
}

// ------------------------------------------------------------------------------- webhook

fn webhook() -> PathBuf {
    bin("railguard-webhook-cli", "railguard-webhook")
}

/// Any free loopback port: for the listener a test does not make fail.
const ANY_PORT: &str = "127.0.0.1:0";

/// The webhook admitting on `listen`, serving metrics on `metrics`, with `rest` after.
fn run_webhook(f: &Files, listen: &str, metrics: &str, rest: &[&str]) -> Output {
    let args = [&["--listen", listen, "--metrics-listen", metrics][..], rest].concat();
    run(&webhook(), &args, f.home())
}

#[test]
fn webhook_admission_port_in_use() {
    let f = Files::new();
    let (_held, addr) = taken();
    let profiles = profiles();
    let rest = ["--tls-cert", "c", "--tls-key", "k", "--profiles", &profiles];
    let out = run_webhook(&f, &addr, ANY_PORT, &rest);
    let line = assert_clean_failure("railguard-webhook", &out, &[&addr, "--listen", "admission"]);
    assert!(line.contains("address already in use"), "{line}");
}

#[test]
fn webhook_metrics_port_in_use() {
    let f = Files::new();
    let (_held, addr) = taken();
    let profiles = profiles();
    let rest = ["--tls-cert", "c", "--tls-key", "k", "--profiles", &profiles];
    let out = run_webhook(&f, ANY_PORT, &addr, &rest);
    let line = assert_clean_failure(
        "railguard-webhook",
        &out,
        &[&addr, "--metrics-listen", "metrics"],
    );
    assert!(line.contains("address already in use"), "{line}");
}

/// The webhook serving `cert` and `key`, with `rest` after.
fn webhook_tls_with(f: &Files, cert: &str, key: &str, rest: &[&str]) -> Output {
    let args = [&["--tls-cert", cert, "--tls-key", key][..], rest].concat();
    run_webhook(f, ANY_PORT, ANY_PORT, &args)
}

/// The webhook serving `cert` and `key` with the fixture profiles.
fn webhook_tls(f: &Files, cert: &str, key: &str) -> Output {
    webhook_tls_with(f, cert, key, &["--profiles", &profiles()])
}

#[test]
fn webhook_unreadable_certificate() {
    let f = Files::new();
    let (_, key) = f.pair("a");
    let missing = f.path("missing.crt");
    let out = webhook_tls(&f, &missing, &key);
    assert_clean_failure("railguard-webhook", &out, &["--tls-cert", &missing]);
}

#[test]
fn webhook_unreadable_key() {
    let f = Files::new();
    let (cert, _) = f.pair("a");
    let missing = f.path("missing.key");
    let out = webhook_tls(&f, &cert, &missing);
    assert_clean_failure("railguard-webhook", &out, &["--tls-key", &missing]);
}

#[test]
fn webhook_certificate_without_pem() {
    let f = Files::new();
    let (_, key) = f.pair("a");
    let cert = f.write("not-pem.crt", "hello\n");
    let out = webhook_tls(&f, &cert, &key);
    assert_clean_failure("railguard-webhook", &out, &["--tls-cert", &cert]);
}

#[test]
fn webhook_key_of_another_certificate() {
    let f = Files::new();
    let (cert, _) = f.pair("a");
    let (_, key) = f.pair("b");
    let out = webhook_tls(&f, &cert, &key);
    assert_clean_failure(
        "railguard-webhook",
        &out,
        &["--tls-cert", &cert, "--tls-key", &key, "not a usable pair"],
    );
}

#[test]
fn webhook_bad_kubeconfig() {
    let f = Files::new();
    let (cert, key) = f.pair("a");
    let missing = f.path("missing-kubeconfig");
    let garbage = f.garbage();
    for (kubeconfig, what) in [
        (&missing, "cannot read kubeconfig"),
        (&garbage, "invalid kubeconfig"),
    ] {
        let out = webhook_tls_with(&f, &cert, &key, &["--kubeconfig", kubeconfig]);
        assert_clean_failure(
            "railguard-webhook",
            &out,
            &["--kubeconfig", kubeconfig, what],
        );
    }
    // Nothing to infer from: not in a cluster, no $KUBECONFIG, no ~/.kube/config.
    let out = webhook_tls_with(&f, &cert, &key, &[]);
    assert_clean_failure(
        "railguard-webhook",
        &out,
        &["no Kubernetes configuration", "--kubeconfig", "--profiles"],
    );
}

#[test]
fn webhook_invalid_profiles() {
    let f = Files::new();
    let (cert, key) = f.pair("a");
    let bad = f.bad_profiles();
    let out = webhook_tls_with(&f, &cert, &key, &["--profiles", &bad]);
    assert_clean_failure(
        "railguard-webhook",
        &out,
        &["--profiles", &bad, "invalid FabricProfile file"],
    );
}

// ------------------------------------------------------------------------------ extender

fn extender() -> PathBuf {
    bin("railguard-extender-cli", "railguard-extender")
}

/// The extender listening on `listen`, serving metrics on `metrics`, with `rest` after.
fn run_extender(f: &Files, listen: &str, metrics: &str, rest: &[&str]) -> Output {
    let args = [&["--listen", listen, "--metrics-listen", metrics][..], rest].concat();
    run(&extender(), &args, f.home())
}

/// The extender standalone on free ports with `profiles`, with `rest` after.
fn run_standalone_extender(f: &Files, profiles: &str, rest: &[&str]) -> Output {
    let args = [&["--standalone", "--profiles", profiles][..], rest].concat();
    run_extender(f, ANY_PORT, ANY_PORT, &args)
}

#[test]
fn extender_ports_in_use() {
    let f = Files::new();
    let (_held, addr) = taken();
    let profiles = profiles();
    for (flag, purpose) in [
        ("--listen", "scheduler requests"),
        ("--metrics-listen", "metrics"),
    ] {
        let (listen, metrics) = if flag == "--listen" {
            (addr.as_str(), ANY_PORT)
        } else {
            (ANY_PORT, addr.as_str())
        };
        let standalone = ["--standalone", "--profiles", &profiles];
        let out = run_extender(&f, listen, metrics, &standalone);
        assert_clean_failure("railguard-extender", &out, &[&addr, flag, purpose]);
    }
}

#[test]
fn extender_unreadable_certificate_and_key() {
    let f = Files::new();
    let (cert, key) = f.pair("a");
    let missing = f.path("missing.pem");
    let profiles = profiles();
    for (c, k, flag) in [
        (&missing, &key, "--tls-cert"),
        (&cert, &missing, "--tls-key"),
    ] {
        let out = run_standalone_extender(&f, &profiles, &["--tls-cert", c, "--tls-key", k]);
        assert_clean_failure("railguard-extender", &out, &[flag, &missing]);
    }
    let garbage = f.write("garbage.pem", "hello\n");
    let out = run_standalone_extender(&f, &profiles, &["--tls-cert", &garbage, "--tls-key", &key]);
    // The certificate file is the one at fault: the message names it and its flag.
    assert_clean_failure("railguard-extender", &out, &["--tls-cert", &garbage]);
}

#[test]
fn extender_bad_kubeconfig() {
    let f = Files::new();
    let garbage = f.garbage();
    let out = run_extender(&f, ANY_PORT, ANY_PORT, &["--kubeconfig", &garbage]);
    assert_clean_failure("railguard-extender", &out, &["--kubeconfig", &garbage]);
}

#[test]
fn extender_invalid_profiles() {
    let f = Files::new();
    let bad = f.bad_profiles();
    let out = run_standalone_extender(&f, &bad, &[]);
    assert_clean_failure("railguard-extender", &out, &["--profiles", &bad]);
}

// -------------------------------------------------------------------------------- prober

fn prober() -> PathBuf {
    bin("railguard-prober-cli", "railguard-prober")
}

const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef";

/// `railguard-prober SUB` on node-a of the `h100-ndr` profile, with `rest` after.
fn on_node_a<'a>(sub: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    [&[sub, "--node", "node-a"][..], rest].concat()
}

/// `railguard-prober peer-endpoint` for node-a simulated as `model`, with `rest` after.
fn peer_endpoint<'a>(model: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let endpoint = ["--profile", "h100-ndr", "--token", TOKEN, "--sim", model];
    on_node_a("peer-endpoint", &[&endpoint[..], rest].concat())
}

#[test]
fn prober_daemon_metrics_port_in_use() {
    let f = Files::new();
    let (_held, addr) = taken();
    let profiles = profiles();
    let args = on_node_a(
        "daemon",
        &["--metrics-listen", &addr, "--profile-file", &profiles],
    );
    let out = run(&prober(), &args, f.home());
    assert_clean_failure("railguard-prober", &out, &[&addr, "--metrics-listen"]);
}

#[test]
fn prober_peer_endpoint_port_in_use() {
    let f = Files::new();
    let (_held, addr) = taken();
    let model = fixture("prober/models/dgx-h100.yaml");
    let out = run(
        &prober(),
        &peer_endpoint(&model, &["--listen", &addr]),
        f.home(),
    );
    assert_clean_failure(
        "railguard-prober",
        &out,
        &[&addr, "--listen", "peer endpoint"],
    );
}

#[test]
fn prober_bad_kubeconfig() {
    let f = Files::new();
    let garbage = f.garbage();
    let missing = f.path("missing-kubeconfig");
    let model = fixture("prober/models/dgx-h100.yaml");
    let profiles = profiles();
    let sim = ["--sim", model.as_str(), "--profile-file", &profiles];
    let cases: [Vec<&str>; 4] = [
        on_node_a("certify", &[&sim[..], &["--kubeconfig", &garbage]].concat()),
        on_node_a(
            "daemon",
            &[
                &["--metrics-listen", ANY_PORT][..],
                &sim,
                &["--kubeconfig", &missing],
            ]
            .concat(),
        ),
        vec![
            "campaign",
            "--profile",
            "h100-ndr",
            "--token",
            TOKEN,
            "--kubeconfig",
            &garbage,
        ],
        peer_endpoint(&model, &["--listen", ANY_PORT, "--kubeconfig", &missing]),
    ];
    for args in cases {
        let path = args[args.len() - 1];
        let out = run(&prober(), &args, f.home());
        assert_clean_failure("railguard-prober", &out, &["--kubeconfig", path]);
    }
}

#[test]
fn prober_invalid_profile_file() {
    let f = Files::new();
    let bad = f.bad_profiles();
    let missing = f.path("missing.yaml");
    let model = fixture("prober/models/dgx-h100.yaml");
    let perf = fixture("prober/fixtures/nccl-tests/gcp-a3mega-h100-2x8-allreduce.txt");
    let cases: [Vec<&str>; 4] = [
        on_node_a("certify", &["--sim", &model, "--profile-file", &bad]),
        on_node_a("certify", &["--sim", &model, "--profile-file", &missing]),
        vec!["analyze", "--nccl-tests", &perf, "--profile-file", &bad],
        vec![
            "campaign",
            "--profile",
            "x",
            "--nccl-log",
            &perf,
            "--profile-file",
            &bad,
        ],
    ];
    for args in cases {
        let path = args[args.len() - 1];
        let out = run(&prober(), &args, f.home());
        assert_clean_failure("railguard-prober", &out, &["--profile-file", path]);
    }
}

#[test]
fn prober_missing_sysfs_root() {
    let f = Files::new();
    let missing = f.path("no-such-root");
    let empty = f.dir.path().display().to_string();
    let profiles = profiles();
    for args in [
        vec!["discover", "--sysfs-root", missing.as_str()],
        vec!["discover", "--sysfs-root", empty.as_str()],
        vec![
            "emit-profile",
            "--sysfs-root",
            missing.as_str(),
            "--profile",
            "x",
        ],
        vec![
            "certify",
            "--node",
            "node-a",
            "--sysfs-root",
            missing.as_str(),
            "--profile-file",
            &profiles,
        ],
    ] {
        let root = args[args.iter().position(|a| *a == "--sysfs-root").unwrap_or(0) + 1];
        let out = run(&prober(), &args, f.home());
        assert_clean_failure(
            "railguard-prober",
            &out,
            &["--sysfs-root", root, "sim-sysfs"],
        );
    }
}

#[test]
fn usage_errors_exit_2_in_every_binary() {
    let f = Files::new();
    for (program, path) in [
        ("railguard-webhook", webhook()),
        ("railguard-extender", extender()),
        ("railguard-prober", prober()),
    ] {
        let out = run(&path, &["--no-such-flag"], f.home());
        assert_eq!(out.status.code(), Some(2), "{program}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--no-such-flag"), "{program}: {stderr}");
        assert!(
            !stderr.contains('\u{1b}'),
            "{program}: colour off a terminal: {stderr:?}"
        );
    }
}
