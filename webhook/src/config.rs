//! Plain configuration the pure core reads.

use std::collections::BTreeMap;

use railguard_api::keys;
use railguard_api::profile::AdmissionMode;
use railguard_api::selector::LabelSelector;

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
    /// Audit or Enforce, for profiles that do not set their own `policy.mode`.
    pub mode: AdmissionMode,
    /// Which pods railguard's admission is for (all GPU pods when unrestricted).
    pub scope: Scope,
}

/// The pods railguard configures: when either selector is set, only pods in a namespace the
/// namespace selector matches or whose own labels the pod selector matches (the chart's
/// default: the label `railguard.io/inject=true` on either). Pods outside are admitted
/// untouched, as if the webhook had not been called.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    pub namespaces: Option<LabelSelector>,
    pub pods: Option<LabelSelector>,
}

impl Scope {
    /// Whether the scope is restricted at all.
    pub fn is_opt_in(&self) -> bool {
        self.namespaces.is_some() || self.pods.is_some()
    }

    /// Whether a pod with `pod_labels` in a namespace with `namespace_labels` is in scope.
    pub fn admits(
        &self,
        namespace_labels: &BTreeMap<String, String>,
        pod_labels: &BTreeMap<String, String>,
    ) -> bool {
        if !self.is_opt_in() {
            return true;
        }
        let by = |selector: &Option<LabelSelector>, labels| {
            selector.as_ref().is_some_and(|s| s.matches(labels))
        };
        by(&self.namespaces, namespace_labels) || by(&self.pods, pod_labels)
    }
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
            mode: AdmissionMode::Enforce,
            scope: Scope::default(),
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

/// A consistent snapshot of the profiles, sorted by name (selector matches take the first).
pub type ProfileSet = std::sync::Arc<Vec<railguard_api::FabricProfile>>;
