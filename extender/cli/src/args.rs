//! `railguard-extender`'s command line: flags and their `RAILGUARD_*` environment variables.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueHint};
use railguard_runtime::LogFormat;

use railguard_extender::server::DEFAULT_MAX_NODES;
use railguard_extender::ExtenderConfig;

/// Example invocations shown by `--help`.
pub const EXAMPLES: &str = "\
Examples:
  # In a cluster, next to kube-scheduler (what the chart runs):
  railguard-extender --listen 127.0.0.1:8888 --metrics-listen 0.0.0.0:9090 --log-format json

  # Without a cluster, full-Node requests only, with profiles from a file:
  railguard-extender --standalone --profiles profiles.yaml

Exit status: 0 after a clean shutdown, 2 on a usage, configuration or runtime error.";

/// Keeps training pods off nodes with uncertified, expired or regressed RDMA fabric.
#[derive(Debug, Parser)]
#[command(name = "railguard-extender", version, after_help = EXAMPLES)]
pub struct Cli {
    /// Address of the extender endpoint (`/filter`, `/prioritize`).
    #[arg(long, env = "RAILGUARD_LISTEN", default_value = "0.0.0.0:8888")]
    pub listen: SocketAddr,
    /// Plain HTTP address for `/healthz`, `/readyz` and `/metrics`.
    #[arg(long, env = "RAILGUARD_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: SocketAddr,
    /// Kubeconfig file; in-cluster config or $KUBECONFIG when unset.
    #[arg(long, env = "RAILGUARD_KUBECONFIG", value_hint = ValueHint::FilePath)]
    pub kubeconfig: Option<PathBuf>,
    /// Run without a cluster: profiles from --profiles, full-Node requests only.
    #[arg(long, env = "RAILGUARD_STANDALONE", requires = "profiles")]
    pub standalone: bool,
    /// YAML stream of FabricProfiles (standalone mode).
    #[arg(long, env = "RAILGUARD_PROFILES", value_hint = ValueHint::FilePath)]
    pub profiles: Option<PathBuf>,
    /// PEM certificate chain for TLS on --listen.
    #[arg(long, env = "RAILGUARD_TLS_CERT", value_hint = ValueHint::FilePath, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS on --listen.
    #[arg(long, env = "RAILGUARD_TLS_KEY", value_hint = ValueHint::FilePath, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Pod label keys that group the pods of one job, tried in order.
    #[arg(long, env = "RAILGUARD_JOB_LABEL_KEYS", value_delimiter = ',',
          default_values_t = railguard_api::keys::DEFAULT_JOB_LABEL_KEYS.iter().map(|s| s.to_string()).collect::<Vec<_>>())]
    pub job_label_keys: Vec<String>,
    /// Node topology label keys, most specific first (profiles may set their own).
    #[arg(long, env = "RAILGUARD_TOPOLOGY_KEYS", value_delimiter = ',',
          default_values_t = railguard_api::keys::DEFAULT_TOPOLOGY_KEYS.iter().map(|s| s.to_string()).collect::<Vec<_>>())]
    pub topology_keys: Vec<String>,
    /// Resources that make a pod a GPU pod.
    #[arg(long, env = "RAILGUARD_GPU_RESOURCES", value_delimiter = ',',
          default_values_t = railguard_api::keys::DEFAULT_GPU_RESOURCES.iter().map(|s| s.to_string()).collect::<Vec<_>>())]
    pub gpu_resources: Vec<String>,
    /// Report nodes that can never fit in `FailedNodes` too, for kube-scheduler 1.20 and
    /// older, which ignore `FailedAndUnresolvableNodes` (their reasons would be missing from
    /// the pod's events; preemption may then try those nodes).
    #[arg(long, env = "RAILGUARD_REPORT_UNRESOLVABLE_AS_FAILED")]
    pub report_unresolvable_as_failed: bool,
    /// Most candidate nodes accepted in one request.
    #[arg(long, env = "RAILGUARD_MAX_NODES", default_value_t = DEFAULT_MAX_NODES)]
    pub max_nodes: usize,
    /// Largest request body accepted, bytes (full-Node requests of big clusters are large).
    #[arg(long, env = "RAILGUARD_MAX_BODY_BYTES", default_value_t = 512 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Log format: `text` (coloured only on a terminal) or `json` lines. The filter comes
    /// from RAILGUARD_LOG (or RUST_LOG), default `info`.
    #[arg(long, env = "RAILGUARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl Cli {
    /// The settings that shape the extender's decisions.
    pub fn extender_config(&self) -> ExtenderConfig {
        ExtenderConfig {
            gpu_resources: self.gpu_resources.clone(),
            job_label_keys: self.job_label_keys.clone(),
            topology_keys: self.topology_keys.clone(),
            report_unresolvable_as_failed: self.report_unresolvable_as_failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_become_the_decision_config() {
        let cli = Cli::parse_from([
            "railguard-extender",
            "--gpu-resources",
            "nvidia.com/gpu,amd.com/gpu",
            "--report-unresolvable-as-failed",
        ]);
        let config = cli.extender_config();
        assert_eq!(config.gpu_resources, ["nvidia.com/gpu", "amd.com/gpu"]);
        assert!(config.report_unresolvable_as_failed);
        assert_eq!(
            config.job_label_keys,
            ExtenderConfig::default().job_label_keys
        );
    }
}
