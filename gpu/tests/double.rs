//! The CUDA driver binding against the test double (gpu/doubles/libcuda_double.c), built here
//! with the system C compiler and loaded by the same dlopen code as the real libcuda.so.1.

use std::path::{Path, PathBuf};
use std::process::Command;

use railguard_gpu::{CudaDriver, CudaError};

/// Builds the double into `dir/libcuda.so.1`.
fn build_double(dir: &Path) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("doubles/libcuda_double.c");
    let out = dir.join("libcuda.so.1");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("a C compiler (cc) builds the CUDA test double: {e}"));
    assert!(status.success(), "building {}", src.display());
    out
}

// One test: the double reads its environment at cuInit and keeps process-wide state, so the
// scenarios run in order rather than on parallel test threads.
#[test]
fn the_driver_binding_runs_for_real_above_the_double() {
    let dir = tempfile::tempdir().unwrap();
    let lib = build_double(dir.path());

    // No library at all: the CPU-only node's answer, as a value.
    let missing = CudaDriver::load(Some(&dir.path().join("libcuda-absent.so.1"))).unwrap_err();
    assert!(matches!(missing, CudaError::Load { .. }), "{missing}");
    assert!(
        missing.to_string().contains("libcuda-absent.so.1"),
        "{missing}"
    );

    // A library that is not the driver: the missing entry point is named.
    let not_cuda = CudaDriver::load(Some(Path::new("libm.so.6"))).unwrap_err();
    assert!(
        matches!(
            not_cuda,
            CudaError::Symbol {
                symbol: "cuInit",
                ..
            }
        ),
        "{not_cuda}"
    );

    // cuInit failing (a driver without devices) is a named CUDA error.
    std::env::set_var("RAILGUARD_CUDA_DOUBLE_INIT", "100");
    let no_device = CudaDriver::load(Some(&lib)).unwrap_err();
    assert_eq!(no_device.code(), Some(100));
    assert!(
        no_device.to_string().contains("CUDA_ERROR_NO_DEVICE"),
        "{no_device}"
    );
    std::env::remove_var("RAILGUARD_CUDA_DOUBLE_INIT");

    std::env::set_var("RAILGUARD_CUDA_DOUBLE_PCI", "0000:1B:00.0,0000:9a:00.0");
    std::env::set_var("RAILGUARD_CUDA_DOUBLE_DMABUF", "0");
    let cuda = CudaDriver::load(Some(&lib)).unwrap();
    assert_eq!(cuda.version(), 12040);
    let devices = cuda.devices().unwrap();
    assert_eq!(
        devices
            .iter()
            .map(|d| d.pci_bus_id.as_str())
            .collect::<Vec<_>>(),
        ["0000:1b:00.0", "0000:9a:00.0"],
        "CUDA's 8-digit upper-case ids come back in the sysfs form"
    );
    assert!(devices
        .iter()
        .all(|d| !d.dma_buf_supported && d.gpu_direct_rdma_supported));

    // The GPU is chosen by PCI address, not by CUDA ordinal.
    let far = cuda.device_by_pci_bus_id("0000:9a:00.0").unwrap();
    assert_eq!(far.ordinal, 1);
    let absent = cuda.device_by_pci_bus_id("0000:42:00.0").unwrap_err();
    assert!(matches!(absent, CudaError::NoDevice { .. }), "{absent}");

    // Allocation, fill and copies round-trip through "device" memory.
    let buf = cuda.alloc(&far, 1 << 20).unwrap();
    assert_eq!(buf.len(), 1 << 20);
    assert_ne!(buf.device_ptr(), 0);
    buf.fill(0x5a).unwrap();
    let mut back = vec![0u8; 4096];
    buf.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    buf.copy_from_host(b"railguard").unwrap();
    buf.copy_to_host(&mut back[..9]).unwrap();
    assert_eq!(&back[..9], b"railguard");
    let too_big = buf.copy_to_host(&mut vec![0u8; (1 << 20) + 1]).unwrap_err();
    assert!(
        matches!(too_big, CudaError::InvalidArgument { .. }),
        "{too_big}"
    );
    assert!(matches!(
        cuda.alloc(&far, 0).unwrap_err(),
        CudaError::InvalidArgument { .. }
    ));

    // Without DMA-BUF support the export is refused with the driver's own code.
    let refused = buf.export_dmabuf().unwrap_err();
    assert_eq!(refused.code(), Some(801), "{refused}");
    assert!(
        refused.to_string().contains("CUDA_ERROR_NOT_SUPPORTED"),
        "{refused}"
    );
    drop(buf);

    // With DMA-BUF support the double exports through /dev/udmabuf, where the kernel has it.
    std::env::set_var("RAILGUARD_CUDA_DOUBLE_DMABUF", "1");
    let dir2 = tempfile::tempdir().unwrap();
    let cuda = CudaDriver::load(Some(&build_double(dir2.path()))).unwrap();
    let near = cuda.device_by_pci_bus_id("1b:00.0").unwrap();
    assert!(near.dma_buf_supported);
    let buf = cuda.alloc(&near, 1 << 16).unwrap();
    match buf.export_dmabuf() {
        Ok(fd) => {
            use std::os::fd::AsRawFd;
            assert!(fd.as_raw_fd() >= 0);
        }
        Err(e) => {
            assert!(
                !Path::new("/dev/udmabuf").exists(),
                "udmabuf is present but the export failed: {e}"
            );
            assert_eq!(e.code(), Some(801));
        }
    }
    drop(buf);

    // "memfd": support is reported and the export hands out a descriptor that is no DMA-BUF.
    // Without nvidia-peermem ("0"), the device pointer is not accessible memory, yet the
    // driver's own copies still round-trip.
    std::env::set_var("RAILGUARD_CUDA_DOUBLE_DMABUF", "memfd");
    std::env::set_var("RAILGUARD_CUDA_DOUBLE_PEERMEM", "0");
    let dir3 = tempfile::tempdir().unwrap();
    let cuda = CudaDriver::load(Some(&build_double(dir3.path()))).unwrap();
    let near = cuda.device_by_pci_bus_id("0000:1b:00.0").unwrap();
    let buf = cuda.alloc(&near, 1 << 16).unwrap();
    buf.fill(0x33).unwrap();
    let mut back = vec![0u8; 16];
    buf.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x33));
    let fd = buf.export_dmabuf().unwrap();
    let link = std::fs::read_link(format!("/proc/self/fd/{}", {
        use std::os::fd::AsRawFd;
        fd.as_raw_fd()
    }))
    .unwrap();
    assert!(
        link.to_string_lossy()
            .contains("memfd:railguard-cuda-double"),
        "{}",
        link.display()
    );
    // The device pointer itself is mapped without access: what ibv_reg_mr is refused on.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let start = format!("{:x}-", buf.device_ptr());
    let line = maps.lines().find(|l| l.starts_with(&start)).unwrap();
    assert!(line.contains(" ---s "), "{line}");
    std::env::remove_var("RAILGUARD_CUDA_DOUBLE_DMABUF");
    std::env::remove_var("RAILGUARD_CUDA_DOUBLE_PEERMEM");
}
