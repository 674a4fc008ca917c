//! A simulated node's native NCCL loopback (`certification.ncclRunner: Native`): the prober's
//! own `nccl-ranks` child loads the CUDA and NCCL test doubles (railguard-gpu's
//! `gpu/doubles`) by path, through the same loader a node's `libcuda.so.1` and
//! `libnccl.so.2` go through. This module builds them for a simulated node and tells them,
//! through their environment, what the node model says about its NCCL: the loopback's bus
//! bandwidth on each path (the stand-in's figures), its network, GPUDirect RDMA, wrong
//! results and version, the node's GPUs, and the sysfs tree whose port states NCCL reads.

use std::path::Path;

use railguard_api::Transport;
use railguard_gpu::doubles::{BuildError, Doubles, CUDA_DOUBLE_SOURCE, NCCL_DOUBLE_SOURCE};

use crate::standin::{NO_GDR_SHARE, SHM_BUSBW_GBPS, SOCKET_BUSBW_GBPS};
use crate::NodeModel;

/// Where a simulated tree keeps its built doubles, relative to the tree's root.
pub const GPU_LIBS_DIR: &str = "railguard-sim/gpu-libs";

/// The largest message a simulated node sweeps: the CUDA double's "GPU memory" is host
/// memory, and every rank reads its result back to check it, so a simulated node stops
/// well below the profiles' 8 GiB. Its large messages still last as long as the model's
/// bus bandwidth says.
pub const MAX_MESSAGE_BYTES: u64 = 256 << 20;

/// The doubles could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum NativeSimError {
    #[error(
        "cannot build the CUDA and NCCL test doubles in {dir} (they need a C compiler, cc; or pass --cuda-library and --nccl-library)"
    )]
    Build {
        dir: String,
        #[source]
        source: BuildError,
    },
    #[error("cannot install the test doubles in {dir}")]
    Install {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot list the simulated node's GPUs")]
    Discover(#[source] railguard_prober::discover::DiscoverError),
}

/// The file beside the CUDA double that lists its GPUs, one PCI bus id a line (read when
/// `RAILGUARD_CUDA_DOUBLE_PCI` is unset, so a test may still narrow them).
pub const CUDA_DOUBLE_PCI_FILE: &str = "railguard-cuda-double.pci";

/// The doubles of the simulated node at `root`, built once into [`GPU_LIBS_DIR`] and built
/// again only when their sources changed, the CUDA double's devices being the node's GPUs.
pub fn doubles(root: &Path) -> Result<Doubles, NativeSimError> {
    let dir = root.join(GPU_LIBS_DIR);
    let built = Doubles {
        cuda: dir.join("libcuda.so.1"),
        nccl: dir.join("libnccl.so.2"),
    };
    let install = |source| NativeSimError::Install {
        dir: dir.display().to_string(),
        source,
    };
    let gpus: Vec<String> = railguard_prober::discover::discover(root, false)
        .map_err(NativeSimError::Discover)?
        .gpus
        .into_iter()
        .map(|g| g.pci_bus_id)
        .collect();
    let pci = format!("{}\n", gpus.join("\n"));
    let same =
        |name: &str, text: &str| std::fs::read_to_string(dir.join(name)).is_ok_and(|s| s == text);
    if built.cuda.is_file()
        && built.nccl.is_file()
        && same("libcuda_double.c", CUDA_DOUBLE_SOURCE)
        && same("libnccl_double.c", NCCL_DOUBLE_SOURCE)
    {
        if !same(CUDA_DOUBLE_PCI_FILE, &pci) {
            write_aside(&dir, CUDA_DOUBLE_PCI_FILE, &pci).map_err(install)?;
        }
        return Ok(built);
    }
    // Built aside and renamed into place: a daemon and a peer endpoint of one node may both
    // get here, and neither may load a half-written library.
    let work = dir.with_file_name(format!("gpu-libs.{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(install)?;
    std::fs::create_dir_all(&dir).map_err(install)?;
    let fresh = railguard_gpu::doubles::build(&work).map_err(|source| NativeSimError::Build {
        dir: work.display().to_string(),
        source,
    })?;
    // The sources go last: they say the libraries beside them are theirs.
    for (from, to) in [
        (fresh.cuda, built.cuda.clone()),
        (fresh.nccl, built.nccl.clone()),
        (work.join("libcuda_double.c"), dir.join("libcuda_double.c")),
        (work.join("libnccl_double.c"), dir.join("libnccl_double.c")),
    ] {
        std::fs::rename(&from, &to).map_err(install)?;
    }
    let _ = std::fs::remove_dir_all(&work);
    write_aside(&dir, CUDA_DOUBLE_PCI_FILE, &pci).map_err(install)?;
    Ok(built)
}

/// Writes `dir/name` whole: written beside it and renamed into place.
fn write_aside(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(name))
}

/// The doubles' environment for the node model `model` whose tree is at `root`: the CUDA
/// double holds messages as one value (so a simulated fabric moves them as that value), and
/// the NCCL double behaves as the model's NCCL.
pub fn doubles_env(model: &NodeModel, root: &Path) -> Vec<(String, String)> {
    let b = &model.nccl;
    let platform_gdr = model.platform.nvidia_peermem || model.platform.open_kernel_module;
    // The stand-in's figures for each path the hops may take (src/bin/all_reduce_perf_sim.rs).
    let busbw = format!(
        "ib={},ib-nogdr={},socket={},shm={},p2p={}",
        b.busbw_gbps,
        b.busbw_gbps * NO_GDR_SHARE,
        b.busbw_gbps.min(SOCKET_BUSBW_GBPS),
        SHM_BUSBW_GBPS,
        b.nvlink_busbw_gbps
    );
    let mut env = vec![
        ("RAILGUARD_CUDA_DOUBLE_LAZY".to_string(), "1".to_string()),
        ("RAILGUARD_NCCL_DOUBLE_BUSBW_GBPS".into(), busbw),
        (
            "RAILGUARD_NCCL_DOUBLE_SYSFS".into(),
            root.display().to_string(),
        ),
        (
            "RAILGUARD_NCCL_DOUBLE_VERSION".into(),
            b.nccl_version.clone(),
        ),
    ];
    if b.transport == Transport::Socket {
        env.push(("RAILGUARD_NCCL_DOUBLE_NET".into(), "Socket".into()));
    }
    if !(b.gdr && platform_gdr) {
        env.push(("RAILGUARD_NCCL_DOUBLE_GDR".into(), "0".into()));
    }
    if b.wrong > 0 {
        env.push(("RAILGUARD_NCCL_DOUBLE_CORRUPT".into(), "1".into()));
    }
    env
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn env_of(model: &NodeModel) -> std::collections::BTreeMap<String, String> {
        doubles_env(model, Path::new("/sim")).into_iter().collect()
    }

    #[test]
    fn the_doubles_behave_as_the_model_says() {
        let healthy = env_of(&NodeModel::builtin("dgx-h100.yaml").unwrap());
        assert_eq!(
            healthy["RAILGUARD_NCCL_DOUBLE_BUSBW_GBPS"],
            "ib=46.5,ib-nogdr=25.575000000000003,socket=11.5,shm=20,p2p=470"
        );
        assert_eq!(healthy["RAILGUARD_NCCL_DOUBLE_SYSFS"], "/sim");
        assert_eq!(healthy["RAILGUARD_NCCL_DOUBLE_VERSION"], "2.21.5");
        assert_eq!(healthy["RAILGUARD_CUDA_DOUBLE_LAZY"], "1");
        for absent in [
            "RAILGUARD_NCCL_DOUBLE_NET",
            "RAILGUARD_NCCL_DOUBLE_GDR",
            "RAILGUARD_NCCL_DOUBLE_CORRUPT",
        ] {
            assert!(!healthy.contains_key(absent), "{absent}: {healthy:?}");
        }
        // No peer memory: NCCL runs without GPUDirect RDMA.
        let no_peermem = env_of(&NodeModel::builtin("h100-iommu-no-peermem.yaml").unwrap());
        assert_eq!(no_peermem["RAILGUARD_NCCL_DOUBLE_GDR"], "0");
    }

    #[test]
    fn the_doubles_are_built_once_with_the_nodes_gpus_beside_them() {
        let dir = tempfile::tempdir().unwrap();
        let model = NodeModel::builtin("dgx-h100.yaml").unwrap();
        crate::write_sysfs(&model, dir.path()).unwrap();
        let built = doubles(dir.path()).unwrap();
        let pci = std::fs::read_to_string(dir.path().join(GPU_LIBS_DIR).join(CUDA_DOUBLE_PCI_FILE))
            .unwrap();
        assert_eq!(pci.lines().count(), 8, "{pci}");
        let made = std::fs::metadata(&built.nccl).unwrap().modified().unwrap();
        let again = doubles(dir.path()).unwrap();
        assert_eq!(again.nccl, built.nccl);
        assert_eq!(
            std::fs::metadata(&again.nccl).unwrap().modified().unwrap(),
            made,
            "not built again"
        );
    }
}
