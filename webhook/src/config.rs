//! Plain configuration the pure core reads.

use std::collections::BTreeMap;

use railguard_api::keys;

/// What the webhook operator configured (flags), as plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Resource names that make a container a GPU container.
    pub gpu_resources: Vec<String>,
    /// Namespaces whose pods are never touched.
    pub excluded_namespaces: Vec<String>,
    /// Image of `railguard-prober` for the optional preflight init container.
    pub prober_image: Option<String>,
    /// Where `libnccl-env-railguard.so` is on every node (and, mounted at the same path, in
    /// the containers of `delivery: Plugin` profiles).
    pub nccl_plugin_path: String,
    /// Where the prober writes the node file the plugin reads (same path in the containers).
    pub nccl_config_path: String,
}

/// Default of [`WebhookConfig::nccl_plugin_path`] (chart value `ncclPlugin.hostDir`).
pub const DEFAULT_NCCL_PLUGIN_PATH: &str = "/opt/railguard/nccl/libnccl-env-railguard.so";
/// Default of [`WebhookConfig::nccl_config_path`] (chart value `ncclPlugin.configDir`).
pub const DEFAULT_NCCL_CONFIG_PATH: &str = "/run/railguard/nccl.json";

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            gpu_resources: keys::DEFAULT_GPU_RESOURCES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            excluded_namespaces: vec!["kube-system".to_string()],
            prober_image: None,
            nccl_plugin_path: DEFAULT_NCCL_PLUGIN_PATH.to_string(),
            nccl_config_path: DEFAULT_NCCL_CONFIG_PATH.to_string(),
        }
    }
}

/// The namespace of the pod under review: its name and labels. In standalone mode
/// (`--profiles FILE`) the labels are unknown and empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

impl NamespaceInfo {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            labels: BTreeMap::new(),
        }
    }

    #[cfg(test)]
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
}

/// What to do when a patch cannot be built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailureMode {
    /// Allow the pod unchanged, with a warning.
    #[default]
    Open,
    /// Deny the pod.
    Closed,
}

impl FailureMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Open => "open",
            FailureMode::Closed => "closed",
        }
    }
}
