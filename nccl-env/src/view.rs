//! What this container can see: its RDMA devices, read from its own sysfs.
//!
//! Inside a pod, `/sys/class/infiniband` lists only the devices given to it (an SR-IOV VF
//! under its own name, or shared PFs); each device's `device` link names its PCI function,
//! whose `physfn` link (VFs only) names the physical function the node file's rail is.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::node_file::normalize_pci_address;

/// The RDMA devices of this container, in natural name order (`mlx5_2` before `mlx5_10`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerView {
    pub devices: Vec<RdmaDevice>,
}

/// One entry of the container's `/sys/class/infiniband`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaDevice {
    /// The name this container sees (what `NCCL_IB_HCA` must say).
    pub name: String,
    /// PCI address of the device's own function.
    pub pci_address: Option<String>,
    /// For an SR-IOV VF: PCI address of its physical function.
    pub physfn: Option<String>,
    /// Network interfaces of the PCI function visible here.
    pub netdevs: Vec<String>,
    /// Port numbers under `ports/`.
    pub ports: Vec<u32>,
}

/// Why the container's sysfs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("cannot list {path}")]
    List {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl ContainerView {
    /// Reads `<root>/sys/class/infiniband` (`root` is `/` in production; tests and the
    /// `RAILGUARD_NCCL_SYSFS_ROOT` knob pass a synthetic tree). A missing directory is a
    /// container without RDMA devices; a device whose links cannot be read is kept with what
    /// could be read, so it simply matches no rail.
    pub fn read(root: &Path) -> Result<ContainerView, ViewError> {
        let dir = root.join("sys/class/infiniband");
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ContainerView::default()),
            Err(source) => return Err(ViewError::List { path: dir, source }),
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort_by_key(|n| natural_key(n));
        let devices = names
            .into_iter()
            .map(|name| {
                let dev = dir.join(&name);
                let device = dev.join("device");
                RdmaDevice {
                    pci_address: link_pci_address(&device),
                    physfn: link_pci_address(&device.join("physfn")),
                    netdevs: list_names(&device.join("net")),
                    ports: {
                        let mut p: Vec<u32> = list_names(&dev.join("ports"))
                            .iter()
                            .filter_map(|n| n.parse().ok())
                            .collect();
                        p.sort_unstable();
                        p
                    },
                    name,
                }
            })
            .collect();
        Ok(ContainerView { devices })
    }
}

/// The PCI address a sysfs link (`device`, `physfn`) points at: its last path component.
fn link_pci_address(link: &Path) -> Option<String> {
    let target = fs::read_link(link)
        .ok()
        .or_else(|| fs::canonicalize(link).ok())?;
    normalize_pci_address(&target.file_name()?.to_string_lossy())
}

fn list_names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(dir)
        .map(|es| {
            es.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// `mlx5_10` sorts after `mlx5_9`.
pub(crate) fn natural_key(s: &str) -> (String, u64) {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = s.split_at(s.len() - digits);
    (head.to_string(), tail.parse().unwrap_or(0))
}

/// Builds synthetic container sysfs trees laid out as the kernel does.
#[cfg(test)]
pub(crate) mod fixture {
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};

    /// A tree under `root`: PCI functions under `sys/devices/pci0000:00/`, RDMA devices under
    /// `sys/class/infiniband/` linking to them.
    pub struct SysfsTree {
        pub root: PathBuf,
    }

    impl SysfsTree {
        pub fn new(root: &Path) -> SysfsTree {
            SysfsTree {
                root: root.to_path_buf(),
            }
        }

        fn pci_dir(&self, addr: &str) -> PathBuf {
            self.root.join("sys/devices/pci0000:00").join(addr)
        }

        /// A PCI function with network interfaces (`net/<ifname>`).
        pub fn pci_function(&self, addr: &str, netdevs: &[&str]) -> &Self {
            for n in netdevs {
                fs::create_dir_all(self.pci_dir(addr).join("net").join(n)).unwrap();
            }
            fs::create_dir_all(self.pci_dir(addr)).unwrap();
            self
        }

        /// An SR-IOV VF of `pf`: `physfn` is a relative link, as in the kernel's tree.
        pub fn virtual_function(&self, addr: &str, pf: &str, netdevs: &[&str]) -> &Self {
            self.pci_function(addr, netdevs);
            symlink(format!("../{pf}"), self.pci_dir(addr).join("physfn")).unwrap();
            self
        }

        /// `sys/class/infiniband/<name>` with `device` -> the PCI function and `ports/<n>`.
        pub fn rdma_device(&self, name: &str, pci: &str, ports: &[u32]) -> &Self {
            let dev = self.root.join("sys/class/infiniband").join(name);
            fs::create_dir_all(&dev).unwrap();
            fs::create_dir_all(self.pci_dir(pci)).unwrap();
            symlink(
                format!("../../../devices/pci0000:00/{pci}"),
                dev.join("device"),
            )
            .unwrap();
            for p in ports {
                fs::create_dir_all(dev.join("ports").join(p.to_string())).unwrap();
            }
            self
        }

        /// A device without a `device` link (its PCI function cannot be told).
        pub fn rdma_device_without_pci(&self, name: &str, ports: &[u32]) -> &Self {
            let dev = self.root.join("sys/class/infiniband").join(name);
            for p in ports {
                fs::create_dir_all(dev.join("ports").join(p.to_string())).unwrap();
            }
            fs::create_dir_all(&dev).unwrap();
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::SysfsTree;
    use super::*;

    #[test]
    fn reads_pfs_vfs_netdevs_and_ports_in_natural_order() {
        let tmp = tempfile::tempdir().unwrap();
        let t = SysfsTree::new(tmp.path());
        t.pci_function("0000:0c:00.0", &["ibp12s0"])
            .rdma_device("mlx5_0", "0000:0c:00.0", &[1])
            .virtual_function("0000:2a:00.3", "0000:2a:00.0", &["net1"])
            .rdma_device("mlx5_10", "0000:2a:00.3", &[1])
            .rdma_device("mlx5_9", "0000:4d:00.0", &[2, 1]);
        let view = ContainerView::read(tmp.path()).unwrap();
        let names: Vec<&str> = view.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["mlx5_0", "mlx5_9", "mlx5_10"]);
        assert_eq!(
            view.devices[0],
            RdmaDevice {
                name: "mlx5_0".into(),
                pci_address: Some("0000:0c:00.0".into()),
                physfn: None,
                netdevs: vec!["ibp12s0".into()],
                ports: vec![1],
            }
        );
        assert_eq!(view.devices[1].ports, [1, 2]);
        assert_eq!(view.devices[2].pci_address.as_deref(), Some("0000:2a:00.3"));
        assert_eq!(view.devices[2].physfn.as_deref(), Some("0000:2a:00.0"));
        assert_eq!(view.devices[2].netdevs, ["net1"]);
    }

    #[test]
    fn no_infiniband_directory_is_a_container_without_rdma_devices() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(
            ContainerView::read(tmp.path()).unwrap(),
            ContainerView::default()
        );
    }

    #[test]
    fn a_device_without_links_is_kept_with_what_could_be_read() {
        let tmp = tempfile::tempdir().unwrap();
        SysfsTree::new(tmp.path()).rdma_device_without_pci("rxe0", &[1]);
        let view = ContainerView::read(tmp.path()).unwrap();
        assert_eq!(view.devices[0].pci_address, None);
        assert_eq!(view.devices[0].physfn, None);
        assert_eq!(view.devices[0].ports, [1]);
    }

    #[test]
    fn an_unlistable_directory_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        // A file where the directory should be: listing it fails with something else than
        // "not found", which must not pass as "no devices".
        fs::create_dir_all(tmp.path().join("sys/class")).unwrap();
        fs::write(tmp.path().join("sys/class/infiniband"), "").unwrap();
        let e = ContainerView::read(tmp.path()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "cannot list {}",
                tmp.path().join("sys/class/infiniband").display()
            )
        );
        assert!(std::error::Error::source(&e).is_some());
    }
}
