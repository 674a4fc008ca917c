//! Test support: builds the C test doubles of `libcuda.so.1` and `libnccl.so.2`
//! (`gpu/doubles/*.c`, compiled into this crate as text) with the system C compiler, so every
//! crate's tests load them through the same dlopen code as the real libraries. Nothing here
//! is on a production path; the prober never calls it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Source of the CUDA driver double.
pub const CUDA_DOUBLE_SOURCE: &str = include_str!("../doubles/libcuda_double.c");
/// Source of the NCCL double (a real TCP all-reduce between rank processes).
pub const NCCL_DOUBLE_SOURCE: &str = include_str!("../doubles/libnccl_double.c");

/// The two built doubles.
#[derive(Debug, Clone)]
pub struct Doubles {
    /// `dir/libcuda.so.1`.
    pub cuda: PathBuf,
    /// `dir/libnccl.so.2`.
    pub nccl: PathBuf,
}

/// Why a double could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("cannot write {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run the C compiler (cc) for {what}")]
    Compiler {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cc failed to build {what}: {stderr}")]
    Failed { what: String, stderr: String },
}

/// Builds both doubles into `dir` (which must exist).
pub fn build(dir: &Path) -> Result<Doubles, BuildError> {
    Ok(Doubles {
        cuda: build_one(dir, "libcuda_double.c", CUDA_DOUBLE_SOURCE, "libcuda.so.1")?,
        nccl: build_one(dir, "libnccl_double.c", NCCL_DOUBLE_SOURCE, "libnccl.so.2")?,
    })
}

fn build_one(dir: &Path, file: &str, source: &str, name: &str) -> Result<PathBuf, BuildError> {
    let src = dir.join(file);
    std::fs::write(&src, source).map_err(|source| BuildError::Write {
        path: src.display().to_string(),
        source,
    })?;
    let out = dir.join(name);
    let result = Command::new("cc")
        .args([
            "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-pthread", "-o",
        ])
        .arg(&out)
        .arg(&src)
        .output()
        .map_err(|source| BuildError::Compiler {
            what: file.to_string(),
            source,
        })?;
    if !result.status.success() {
        return Err(BuildError::Failed {
            what: file.to_string(),
            stderr: String::from_utf8_lossy(&result.stderr).into_owned(),
        });
    }
    Ok(out)
}

/// The directory holding the real `libnccl.so.2` of the pinned `nvidia-nccl-cu12` wheel,
/// for tests held to the real library: `RAILGUARD_NCCL_LIB_DIR` when set (CI sets it), else
/// what `tests/scripts/nccl-wheel.sh` prints (it downloads and caches the wheel once).
pub fn real_nccl_lib_dir() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("RAILGUARD_NCCL_LIB_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/scripts/nccl-wheel.sh");
            let out = Command::new("bash")
                .arg(&script)
                .output()
                .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "{} failed ({}):\n{}",
                    script.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            let stdout = String::from_utf8_lossy(&out.stdout);
            PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
        }
    };
    if dir.join("libnccl.so.2").is_file() {
        Ok(dir)
    } else {
        Err(format!("no libnccl.so.2 in {}", dir.display()))
    }
}
