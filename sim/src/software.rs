//! The software facts of a simulated node: what a real node reads from NVML and the loaded
//! modules ([`HostSoftware`]), filled from the node model where the tree holds nothing.

use std::collections::BTreeMap;
use std::path::Path;

use railguard_prober::certify::run::{HostSoftware, SoftwareSource};

use crate::SoftwareVersions;

/// A simulated node's [`SoftwareSource`]: the host readers over the simulated tree first,
/// then the model's CUDA and OFED versions.
#[derive(Clone, Debug)]
pub struct ModelSoftware {
    host: HostSoftware,
    versions: SoftwareVersions,
}

impl ModelSoftware {
    /// The source for the tree at `root` written for a model with `versions`.
    pub fn new(root: &Path, versions: SoftwareVersions) -> Self {
        ModelSoftware {
            host: HostSoftware {
                sysfs_root: root.to_path_buf(),
                use_nvml: false,
            },
            versions,
        }
    }
}

impl SoftwareSource for ModelSoftware {
    fn versions(&self) -> BTreeMap<String, String> {
        let mut s = self.host.versions();
        s.entry("cuda".into())
            .or_insert_with(|| self.versions.cuda.clone());
        s.entry("ofed".into())
            .or_insert_with(|| self.versions.ofed.clone());
        s
    }
}
