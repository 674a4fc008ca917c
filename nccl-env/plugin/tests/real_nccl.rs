//! The plugin inside the real NCCL: the `nvidia-nccl-cu12==2.32.3` wheel's `libnccl.so.2`
//! (cached by `tests/scripts/nccl-wheel.sh`, or found in `RAILGUARD_NCCL_LIB_DIR`), loaded
//! with railguard-gpu's loader. Without a GPU, NCCL gets as far as `ncclGetUniqueId`, which
//! initialises its env plugin and the bootstrap network, reading `NCCL_SOCKET_IFNAME`
//! through the plugin.
//!
//! NCCL reads its environment once per process, so every case runs in a fresh child: the
//! test re-executes this binary on itself with [`CHILD`] set, and the child half of the same
//! test function loads NCCL, calls `ncclGetUniqueId`, prints the outcome and exits.
#![allow(clippy::unwrap_used)] // test set-up: a failure should stop the test where it happens

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use railguard_gpu::Nccl;

/// Set in a child: the `libnccl.so.2` to load.
const CHILD: &str = "RAILGUARD_NCCL_ENV_TEST_CHILD";

/// In a child, does the NCCL half of the test and exits; in the test itself, returns.
fn child_runs_nccl() {
    let Some(lib) = std::env::var_os(CHILD) else {
        return;
    };
    // Held until exit, as a training process holds NCCL: dlclosing NCCL after
    // ncclGetUniqueId crashes the process once any external env plugin is loaded (NCCL's
    // bootstrap thread outlives the library; a six-line C plugin does the same).
    let nccl = Nccl::load(Some(Path::new(&lib)));
    match &nccl {
        Err(e) => println!("child: cannot load NCCL: {e}"),
        Ok(nccl) => {
            println!(
                "child: NCCL {} (ncclGetVersion {})",
                nccl.version_string(),
                nccl.version()
            );
            match nccl.unique_id() {
                Ok(_) => println!("child: ncclGetUniqueId ok"),
                Err(e) => println!("child: {e}"),
            }
        }
    }
    // exit() runs NCCL's atexit handlers (which finalize and dlclose the plugin) and flushes
    // NCCL's C stdio buffer (its log goes to stdout).
    std::process::exit(0);
}

/// The directory holding the wheel's `libnccl.so.2`.
fn nccl_lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| railguard_gpu::doubles::real_nccl_lib_dir().unwrap())
}

/// The cdylib cargo built with this test, copied to the name NCCL's loader expects.
fn plugin() -> &'static Path {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN.get_or_init(|| {
        // This binary is <target>/<profile>/deps/real_nccl-<hash>; the cdylib sits beside it.
        let exe = std::env::current_exe().unwrap();
        let deps = exe.parent().unwrap();
        let built = deps.join("librailguard_nccl_env_plugin.so");
        assert!(built.is_file(), "the cdylib {} is missing", built.display());
        let dir = deps.parent().unwrap().join("nccl-env-plugin");
        std::fs::create_dir_all(&dir).unwrap();
        let installed = dir.join("libnccl-env-railguard.so");
        let partial = dir.join(format!("libnccl-env-railguard.so.{}", std::process::id()));
        std::fs::copy(&built, &partial).unwrap();
        std::fs::rename(&partial, &installed).unwrap();
        installed
    })
}

/// A container sysfs with one PF, `mlx5_0` at `0000:0c:00.0`, port 1.
fn sysfs(root: &Path) {
    let pci = root.join("sys/devices/pci0000:00/0000:0c:00.0");
    std::fs::create_dir_all(pci.join("net/ibp12s0")).unwrap();
    let dev = root.join("sys/class/infiniband/mlx5_0");
    std::fs::create_dir_all(dev.join("ports/1")).unwrap();
    symlink(
        "../../../devices/pci0000:00/0000:0c:00.0",
        dev.join("device"),
    )
    .unwrap();
}

/// A node file for that sysfs; `nccl` is the JSON of its `nccl` object.
fn node_file(expires_at: &str, nccl: &str) -> String {
    format!(
        r#"{{
          "version": 1,
          "node": "nccl-test-node",
          "certificate": {{"generation": 3, "verdict": "certified", "expiresAt": "{expires_at}"}},
          "rails": [{{"hca": "mlx5_0", "port": 1, "pciAddress": "0000:0c:00.0", "health": "healthy"}}],
          "gpus": [{{"index": 0, "uuid": "GPU-0000", "pciBusId": "0000:19:00.0", "rail": "mlx5_0:1"}}],
          "nccl": {nccl}
        }}"#
    )
}

const FUTURE: &str = "2099-01-01T00:00:00Z";

struct Run {
    stdout: String,
    stderr: String,
}

/// Runs test `name`'s child with the plugin (unless `with_plugin` is false), the node file
/// `node` (`None`: a path where there is none) and `vars`.
fn run(name: &str, with_plugin: bool, node: Option<&str>, vars: &[(&str, &str)]) -> Run {
    let tmp = tempfile::tempdir().unwrap();
    sysfs(&tmp.path().join("root"));
    let config = tmp.path().join("nccl.json");
    if let Some(text) = node {
        std::fs::write(&config, text).unwrap();
    }
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    // The child sees only what the case sets (NCCL reads many variables).
    cmd.env_clear()
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, nccl_lib_dir().join("libnccl.so.2"))
        .env("NCCL_DEBUG", "INFO")
        .env("RAILGUARD_NCCL_CONFIG", &config)
        .env("RAILGUARD_NCCL_SYSFS_ROOT", tmp.path().join("root"));
    // "none": NCCL's internal env plugin (src/plugin/env.cc).
    cmd.env(
        "NCCL_ENV_PLUGIN",
        if with_plugin {
            plugin().as_os_str()
        } else {
            "none".as_ref()
        },
    );
    for (k, v) in vars {
        if v.is_empty() {
            cmd.env_remove(k);
        } else {
            cmd.env(k, v);
        }
    }
    let out = cmd.output().unwrap();
    let run = Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        out.status.success() && run.stdout.contains("child: NCCL 2.32.3"),
        "child {name} did not run NCCL 2.32.3 ({}):\n{}\n{}",
        out.status,
        run.stdout,
        run.stderr
    );
    run
}

impl Run {
    fn has(&self, text: &str) -> bool {
        self.stdout.contains(text)
    }

    #[track_caller]
    fn assert_has(&self, text: &str) {
        assert!(
            self.has(text),
            "NCCL's output lacks {text:?}:\n{}\n--- stderr\n{}",
            self.stdout,
            self.stderr
        );
    }
}

/// The prober's own loader (railguard-gpu's `Nccl::load`, through which the native loopback's
/// ranks and the campaign's pair tests load NCCL) reads the wheel's `ncclGetVersion`:
/// NCCL_VERSION(2,32,3) = 23203 (src/nccl.h.in), printed 2.32.3, the certificate's
/// `software.nccl`.
#[test]
fn the_probers_loader_reads_the_wheels_version() {
    child_runs_nccl();
    let r = run(
        "the_probers_loader_reads_the_wheels_version",
        false,
        None,
        &[],
    );
    r.assert_has("child: NCCL 2.32.3 (ncclGetVersion 23203)");
}

#[test]
fn without_the_plugin_a_bogus_socket_ifname_breaks_the_bootstrap() {
    child_runs_nccl();
    // The control for the next test: the bogus value really reaches NCCL and really matters.
    let r = run(
        "without_the_plugin_a_bogus_socket_ifname_breaks_the_bootstrap",
        false,
        None,
        &[("NCCL_SOCKET_IFNAME", "=bogus0")],
    );
    r.assert_has("NCCL_SOCKET_IFNAME set by environment to =bogus0");
    r.assert_has("child: ncclGetUniqueId failed");
    assert!(!r.has("Successfully loaded external env plugin"));
}

#[test]
fn enforce_replaces_a_bogus_socket_ifname_with_the_node_files_lo() {
    child_runs_nccl();
    let node = node_file(FUTURE, r#"{"socketIfname": "=lo", "enforce": true}"#);
    let r = run(
        "enforce_replaces_a_bogus_socket_ifname_with_the_node_files_lo",
        true,
        Some(&node),
        &[("NCCL_SOCKET_IFNAME", "=bogus0")],
    );
    r.assert_has(&format!(
        "Successfully loaded external env plugin {}",
        plugin().display()
    ));
    r.assert_has("ENV/Plugin: Using railguard (v2)");
    r.assert_has(
        "NCCL INFO NCCL_SOCKET_IFNAME: the container's \"=bogus0\" is replaced by \"=lo\" (enforce)",
    );
    // The sysfs view and the node file agreed on the one rail.
    r.assert_has(&format!(
        "NCCL INFO railguard: nccl-test-node: certificate generation 3 (certified, expires {FUTURE}): \
         answering NCCL_IB_HCA==mlx5_0:1 NCCL_SOCKET_IFNAME==lo"
    ));
    r.assert_has("NCCL_SOCKET_IFNAME set by environment to =lo");
    r.assert_has("Bootstrap: Using lo:127.0.0.1");
    r.assert_has("child: ncclGetUniqueId ok");
}

#[test]
fn the_containers_own_socket_ifname_wins_without_enforce() {
    child_runs_nccl();
    let node = node_file(FUTURE, r#"{"socketIfname": "=bogus0"}"#);
    let r = run(
        "the_containers_own_socket_ifname_wins_without_enforce",
        true,
        Some(&node),
        &[("NCCL_SOCKET_IFNAME", "=lo")],
    );
    r.assert_has("ENV/Plugin: Using railguard (v2)");
    r.assert_has(
        "NCCL INFO NCCL_SOCKET_IFNAME: the container's \"=lo\" is kept over the node file's \"=bogus0\" (enforce is off)",
    );
    r.assert_has("Bootstrap: Using lo:127.0.0.1");
    r.assert_has("child: ncclGetUniqueId ok");
}

#[test]
fn a_missing_node_file_leaves_nccl_working_and_warns() {
    child_runs_nccl();
    let r = run(
        "a_missing_node_file_leaves_nccl_working_and_warns",
        true,
        None,
        &[("NCCL_SOCKET_IFNAME", "=lo")],
    );
    r.assert_has("Successfully loaded external env plugin");
    r.assert_has("NCCL WARN railguard: cannot read node file");
    r.assert_has(
        "No such file or directory (os error 2); NCCL gets the process environment unchanged",
    );
    // Passed through: the process' own value.
    r.assert_has("Bootstrap: Using lo:127.0.0.1");
    r.assert_has("child: ncclGetUniqueId ok");
}

#[test]
fn a_garbage_node_file_leaves_nccl_working_and_warns() {
    child_runs_nccl();
    let r = run(
        "a_garbage_node_file_leaves_nccl_working_and_warns",
        true,
        Some("{\"version\": 1, \"rails\": \"mlx5_0\""),
        &[("NCCL_SOCKET_IFNAME", "=lo")],
    );
    r.assert_has("NCCL WARN railguard: node file ");
    r.assert_has("not a json object with a numeric version");
    r.assert_has("Bootstrap: Using lo:127.0.0.1");
    r.assert_has("child: ncclGetUniqueId ok");
}

#[test]
fn without_nccl_debug_the_warning_goes_to_stderr() {
    child_runs_nccl();
    // NCCL prints nothing at its default level, so a warning through its logger would be lost.
    let r = run(
        "without_nccl_debug_the_warning_goes_to_stderr",
        true,
        None,
        &[("NCCL_DEBUG", ""), ("NCCL_SOCKET_IFNAME", "=lo")],
    );
    assert!(!r.has("NCCL WARN"), "{}", r.stdout);
    assert!(
        r.stderr
            .contains("railguard NCCL env plugin WARN railguard: cannot read node file"),
        "{}",
        r.stderr
    );
    r.assert_has("child: ncclGetUniqueId ok");
}

#[test]
fn on_unhealthy_fail_makes_ncclgetuniqueid_fail() {
    child_runs_nccl();
    let node = node_file(
        "2000-01-01T00:00:00Z",
        r#"{"socketIfname": "=lo", "onUnhealthy": "Fail"}"#,
    );
    let r = run(
        "on_unhealthy_fail_makes_ncclgetuniqueid_fail",
        true,
        Some(&node),
        &[],
    );
    r.assert_has(
        "NCCL WARN railguard: nccl-test-node: certificate generation 3 expired at 2000-01-01T00:00:00Z; \
         failing NCCL's initialisation (onUnhealthy: Fail)",
    );
    // init's ncclSystemError is what ncclGetUniqueId returns: no fallback to NCCL's own plugin.
    r.assert_has("(ncclEnvPluginInit) -> 2");
    r.assert_has("child: ncclGetUniqueId failed: unhandled system error");
    assert!(!r.has("Bootstrap: Using"));
}

#[test]
fn on_unhealthy_warn_passes_the_environment_through() {
    child_runs_nccl();
    let node = node_file(
        "2000-01-01T00:00:00Z",
        r#"{"socketIfname": "=bogus0", "enforce": true}"#,
    );
    let r = run(
        "on_unhealthy_warn_passes_the_environment_through",
        true,
        Some(&node),
        &[("NCCL_SOCKET_IFNAME", "=lo")],
    );
    r.assert_has(
        "NCCL WARN railguard: nccl-test-node: certificate generation 3 expired at 2000-01-01T00:00:00Z; \
         NCCL gets the process environment unchanged (onUnhealthy: Warn)",
    );
    r.assert_has("Bootstrap: Using lo:127.0.0.1");
    r.assert_has("child: ncclGetUniqueId ok");
}
