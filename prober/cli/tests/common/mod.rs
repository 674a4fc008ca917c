//! What the binary tests share: the prober binary, with the `all_reduce_perf` stand-in
//! (`railguard-sim`'s binary) built next to it, where `certify --sim` looks for it.

use std::path::Path;
use std::sync::OnceLock;

/// The `railguard-prober` binary, after making sure `all_reduce_perf_sim` is built (and up to
/// date) next to it: it is another package's binary, which cargo does not build for this
/// package's tests.
pub fn prober_with_standin() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    let bin = env!("CARGO_BIN_EXE_railguard-prober");
    BUILT.get_or_init(|| {
        let target_dir = Path::new(bin)
            .parent()
            .and_then(Path::parent)
            .expect("the binary lies in target/<profile>/");
        let status = std::process::Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "-p",
                "railguard-sim",
                "--bin",
                "all_reduce_perf_sim",
            ])
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build -p railguard-sim failed");
    });
    bin
}
