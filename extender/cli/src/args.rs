//! `railguard-extender`'s command line: flags and their `RAILGUARD_*` environment variables.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueHint};
use railguard_runtime::{LogFormat, RequestLimits, ServeArgs, ServeLimits};

use crate::server::{default_max_body_bytes, DEFAULT_MAX_NODES};
use railguard_extender::ExtenderConfig;

/// Example invocations shown by `--help`.
pub const EXAMPLES: &str = "\
Examples:
  # In a cluster, next to kube-scheduler (what the chart runs: TLS, the scheduler's
  # client certificate required):
  railguard-extender --listen 127.0.0.1:8888 --metrics-listen 0.0.0.0:9090 --log-format json \\
    --tls-cert /etc/railguard/tls/tls.crt --tls-key /etc/railguard/tls/tls.key \\
    --tls-client-ca /etc/railguard/tls/ca.crt

  # Without a cluster, full-Node requests only, with profiles from a file:
  railguard-extender --standalone --profiles profiles.yaml

Exit status: 0 after a clean shutdown, 2 on a usage, configuration or runtime error.";

/// Keeps training pods off nodes with uncertified, expired or regressed RDMA fabric.
#[derive(Debug, Parser)]
#[command(
    name = "railguard-extender",
    version,
    after_help = EXAMPLES,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// Without a subcommand the extender serves.
    #[command(subcommand)]
    pub command: Option<Command>,
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
    /// PEM CA bundle: with it, --listen requires a client certificate issued by this CA
    /// (the scheduler's, from its extender tlsConfig). Needs --tls-cert.
    #[arg(long, env = "RAILGUARD_TLS_CLIENT_CA", value_hint = ValueHint::FilePath, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// How often the TLS files (--tls-cert, --tls-key, --tls-client-ca) are checked for
    /// changes, seconds; a changed set that loads serves the next connections, one that does
    /// not keeps the old set in service.
    #[arg(long, env = "RAILGUARD_CERT_POLL_SECONDS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub cert_poll_seconds: u64,
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
    /// Largest request body accepted, bytes (413 beyond). Default: room for the Pod and
    /// --max-nodes candidates of 2 KiB each (about 35 MiB); full-Node requests
    /// (nodeCacheCapable: false) of big clusters may need more.
    #[arg(long, env = "RAILGUARD_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Per-request timeout (body read included), seconds; 408 beyond.
    #[arg(long, env = "RAILGUARD_REQUEST_TIMEOUT_SECONDS", default_value_t = 10)]
    pub request_timeout_seconds: u64,
    /// How long shutdown waits for requests in flight, seconds.
    #[arg(long, env = "RAILGUARD_SHUTDOWN_GRACE_SECONDS", default_value_t = 5)]
    pub shutdown_grace_seconds: u64,
    /// After SIGTERM, keep serving this many seconds while /readyz reports not ready (each
    /// answer closing its connection), so kube-scheduler and kube-proxy move off this pod
    /// before the listener closes.
    #[arg(long, env = "RAILGUARD_SHUTDOWN_DELAY_SECONDS", default_value_t = 5)]
    pub shutdown_delay_seconds: u64,
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Log format: `text` (coloured only on a terminal) or `json` lines. The filter comes
    /// from RAILGUARD_LOG (or RUST_LOG), default `info`.
    #[arg(long, env = "RAILGUARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// What runs instead of the extender's server.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Ensure the extender's TLS Secret holds a CA, serving and client pair (issued once when
    /// it does not) and write them to a directory: the init container of the chart's pods.
    #[command(after_help = crate::tls_bootstrap::TLS_BOOTSTRAP_EXAMPLE)]
    TlsBootstrap(crate::tls_bootstrap::TlsBootstrapArgs),
}

impl Cli {
    /// `--max-body-bytes`, or the limit derived from `--max-nodes`.
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
            .unwrap_or_else(|| default_max_body_bytes(self.max_nodes))
    }

    /// Connection limits of both listeners.
    pub fn serve_limits(&self) -> ServeLimits {
        self.serve
            .limits(Duration::from_secs(self.shutdown_grace_seconds))
    }

    /// Request limits of both listeners.
    pub fn request_limits(&self) -> RequestLimits {
        self.serve
            .request_limits(Duration::from_secs(self.request_timeout_seconds))
    }

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

    #[test]
    fn the_body_limit_follows_max_nodes_unless_given() {
        let cli = Cli::parse_from(["railguard-extender", "--max-nodes", "1000"]);
        assert_eq!(cli.max_body_bytes(), (6 << 20) + 1000 * 2048);
        let cli = Cli::parse_from(["railguard-extender"]);
        assert!(cli.max_body_bytes() < 40 << 20, "{}", cli.max_body_bytes());
        let cli = Cli::parse_from(["railguard-extender", "--max-body-bytes", "123"]);
        assert_eq!(cli.max_body_bytes(), 123);
        assert!(Cli::try_parse_from(["railguard-extender", "--tls-client-ca", "ca.crt"]).is_err());
    }

    #[test]
    fn tls_bootstrap_takes_the_sets_names_and_no_server_flags() {
        let cli = Cli::parse_from([
            "railguard-extender",
            "tls-bootstrap",
            "--secret=railguard-extender-tls",
            "--out=/etc/railguard/extender-tls",
            "--server-ip=127.0.0.1",
            "--server-dns=localhost,railguard-extender.ns.svc",
            "--validity-days=30",
        ]);
        let Some(Command::TlsBootstrap(args)) = cli.command else {
            panic!("not tls-bootstrap");
        };
        let spec = args.spec();
        assert_eq!(
            spec.server_ips,
            ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(spec.server_dns, ["localhost", "railguard-extender.ns.svc"]);
        assert_eq!(spec.validity_days, 30);
        assert_eq!(spec.client_common_name, "railguard-scheduler");
        assert!(args.namespace.is_none());
        // The server's flags belong to the server, not to the subcommand.
        assert!(Cli::try_parse_from([
            "railguard-extender",
            "--listen=127.0.0.1:8888",
            "tls-bootstrap",
            "--secret=s",
            "--out=/x",
        ])
        .is_err());
        assert!(Cli::try_parse_from([
            "railguard-extender",
            "tls-bootstrap",
            "--secret=s",
            "--out=/x",
            "--validity-days=0",
        ])
        .is_err());
    }
}
