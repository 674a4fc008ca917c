//! `railguard-webhook`'s command line: flags and their `RAILGUARD_*` environment variables.
//!
//! In the shell's library so the chart's contract test parses the Deployment's arguments with
//! the binary's own definition.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum, ValueHint};
use railguard_runtime::{LogFormat, ServeArgs};

/// Example invocations shown by `--help`.
pub const EXAMPLES: &str = "\
Examples:
  # Standalone, with profiles from a file and a certificate pair on disk:
  railguard-webhook --profiles profiles.yaml --tls-cert tls.crt --tls-key tls.key

  # In a cluster with self-managed certificates (what the chart runs):
  railguard-webhook --tls-cert /etc/railguard/tls/tls.crt --tls-key /etc/railguard/tls/tls.key \\
    --self-signed-secret railguard-webhook-tls --webhook-config-name railguard-webhook \\
    --service-name railguard-webhook --log-format json

Exit status: 0 after a clean shutdown, 2 on a usage, configuration or runtime error.";

/// Configures GPU training pods for their RDMA fabric at admission.
#[derive(Debug, Parser)]
#[command(name = "railguard-webhook", version, after_help = EXAMPLES)]
pub struct Cli {
    /// Address of the TLS admission endpoint (`POST /mutate`).
    #[arg(long, env = "RAILGUARD_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// PEM certificate chain; reloaded when it changes (Secret-volume rotation included).
    #[arg(long, env = "RAILGUARD_TLS_CERT", value_hint = ValueHint::FilePath)]
    pub tls_cert: PathBuf,
    /// PEM private key matching --tls-cert.
    #[arg(long, env = "RAILGUARD_TLS_KEY", value_hint = ValueHint::FilePath)]
    pub tls_key: PathBuf,
    /// Plain-HTTP address of /healthz, /readyz and /metrics.
    #[arg(long, env = "RAILGUARD_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: SocketAddr,
    /// Standalone mode: a YAML stream of FabricProfiles instead of the cluster's. Namespace
    /// labels are then unknown (empty): selector exemptions and Pod Security labels are not
    /// seen; exemptions listed by namespace name still apply.
    #[arg(long, env = "RAILGUARD_PROFILES", value_hint = ValueHint::FilePath)]
    pub profiles: Option<PathBuf>,
    /// Kubeconfig for cluster mode (default: in-cluster or $KUBECONFIG).
    #[arg(
        long,
        env = "RAILGUARD_KUBECONFIG",
        value_hint = ValueHint::FilePath,
        conflicts_with = "profiles"
    )]
    pub kubeconfig: Option<PathBuf>,
    /// On an internal error building a patch: `open` allows unchanged with a warning,
    /// `closed` denies.
    #[arg(long, env = "RAILGUARD_FAILURE_MODE", value_enum, default_value_t = FailureMode::Open)]
    pub failure_mode: FailureMode,
    /// `audit`: admit every pod unchanged, recording the patch (or denial) railguard would
    /// apply in the `railguard.io/audit` annotation, a warning and the `audit-mutate` /
    /// `audit-deny` admission outcomes; `enforce`: apply it. A profile's `policy.mode`
    /// overrides this for its pods. Case-insensitive (the chart passes `Audit`/`Enforce`).
    #[arg(
        long,
        env = "RAILGUARD_MODE",
        value_enum,
        ignore_case = true,
        default_value_t = AdmissionMode::Enforce
    )]
    pub mode: AdmissionMode,
    /// Opt-in scope: only pods in namespaces whose labels this selector matches (or pods that
    /// --opt-in-pod-selector matches) are configured; the rest are admitted untouched. A
    /// Kubernetes LabelSelector as JSON, e.g. `{"matchLabels":{"railguard.io/inject":"true"}}`.
    /// Unset with --opt-in-pod-selector unset too: every GPU pod.
    #[arg(long, env = "RAILGUARD_OPT_IN_NAMESPACE_SELECTOR")]
    pub opt_in_namespace_selector: Option<String>,
    /// Opt-in scope: pods whose own labels this selector matches are configured in any
    /// namespace not excluded (JSON LabelSelector; with Kueue, the label Kueue puts on the pod
    /// template of every Job, JobSet or Kubeflow job it admits:
    /// `{"matchExpressions":[{"key":"kueue.x-k8s.io/podset","operator":"Exists"}]}`).
    #[arg(long, env = "RAILGUARD_OPT_IN_POD_SELECTOR")]
    pub opt_in_pod_selector: Option<String>,
    /// Resource names that make a container a GPU container (comma list).
    #[arg(
        long,
        env = "RAILGUARD_GPU_RESOURCES",
        value_delimiter = ',',
        default_value = "nvidia.com/gpu"
    )]
    pub gpu_resources: Vec<String>,
    /// Namespaces never touched (comma list); the webhook's own namespace is added.
    #[arg(
        long,
        env = "RAILGUARD_EXCLUDED_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system"
    )]
    pub excluded_namespaces: Vec<String>,
    /// The webhook's own namespace (default: the service account's, when in a cluster).
    #[arg(long, env = "RAILGUARD_NAMESPACE")]
    pub namespace: Option<String>,
    /// railguard-prober image for the optional preflight init container.
    #[arg(long, env = "RAILGUARD_PROBER_IMAGE")]
    pub prober_image: Option<String>,
    /// Where `libnccl-env-railguard.so` is on every node: pods of `delivery: Plugin`
    /// profiles get `NCCL_ENV_PLUGIN` set to it and its directory mounted read-only at the
    /// same path (the prober installs it there; chart value `ncclPlugin.hostDir`).
    #[arg(
        long,
        env = "RAILGUARD_NCCL_PLUGIN_PATH",
        default_value = railguard_webhook::DEFAULT_NCCL_PLUGIN_PATH
    )]
    pub nccl_plugin_path: String,
    /// Where the prober writes the plugin's node file on every node: `delivery: Plugin` pods
    /// get `RAILGUARD_NCCL_CONFIG` set to it and its directory mounted read-only at the same
    /// path (chart value `ncclPlugin.configDir`).
    #[arg(
        long,
        env = "RAILGUARD_NCCL_CONFIG_PATH",
        default_value = railguard_webhook::DEFAULT_NCCL_CONFIG_PATH
    )]
    pub nccl_config_path: String,
    /// Largest request body accepted, bytes.
    #[arg(long, env = "RAILGUARD_MAX_BODY_BYTES", default_value_t = 6 << 20)]
    pub max_body_bytes: usize,
    /// Per-request timeout, seconds.
    #[arg(long, env = "RAILGUARD_REQUEST_TIMEOUT_SECONDS", default_value_t = 10)]
    pub request_timeout_seconds: u64,
    /// Pod decisions held, so the identical pods of a job or ReplicaSet are decided once
    /// (at most 16 MiB whatever the count; 0 turns the cache off).
    #[arg(long, env = "RAILGUARD_DECISION_CACHE_ENTRIES", default_value_t = 256)]
    pub decision_cache_entries: usize,
    #[command(flatten)]
    pub serve: ServeArgs,
    /// How long shutdown waits for in-flight requests, seconds.
    #[arg(long, env = "RAILGUARD_SHUTDOWN_GRACE_SECONDS", default_value_t = 20)]
    pub shutdown_grace_seconds: u64,
    /// After SIGTERM, keep serving this many seconds while /readyz reports not ready, so
    /// the API server stops sending reviews here before the listener closes.
    #[arg(long, env = "RAILGUARD_SHUTDOWN_DELAY_SECONDS", default_value_t = 5)]
    pub shutdown_delay_seconds: u64,
    /// How often the certificate files are checked for changes, seconds.
    #[arg(long, env = "RAILGUARD_CERT_POLL_SECONDS", default_value_t = 2)]
    pub cert_poll_seconds: u64,
    /// Self-managed certificates: the Secret (in --namespace) holding the CA and serving pair.
    /// The webhook creates or renews it, writes the pair to --tls-cert/--tls-key and the CA
    /// into --webhook-config-name's caBundle.
    #[arg(long, env = "RAILGUARD_SELF_SIGNED_SECRET", requires_all = ["webhook_config_name", "service_name"])]
    pub self_signed_secret: Option<String>,
    /// MutatingWebhookConfiguration whose caBundle (every entry) trusts the self-managed CA.
    #[arg(
        long,
        env = "RAILGUARD_WEBHOOK_CONFIG_NAME",
        requires = "self_signed_secret"
    )]
    pub webhook_config_name: Option<String>,
    /// Service the API server dials; the certificate covers `<svc>.<ns>.svc[.cluster.local]`.
    #[arg(long, env = "RAILGUARD_SERVICE_NAME", requires = "self_signed_secret")]
    pub service_name: Option<String>,
    /// Lifetime of a self-managed serving certificate, days.
    #[arg(long, env = "RAILGUARD_CERT_VALIDITY_DAYS", default_value_t = 365)]
    pub cert_validity_days: u32,
    /// Renew a self-managed certificate this many days before it expires.
    #[arg(long, env = "RAILGUARD_CERT_ROTATE_BEFORE_DAYS", default_value_t = 30)]
    pub cert_rotate_before_days: u32,
    /// How often the self-managed Secret and caBundle are checked, seconds.
    #[arg(long, env = "RAILGUARD_CERT_SYNC_SECONDS", default_value_t = 300)]
    pub cert_sync_seconds: u64,
    /// Node guard: the probers' ServiceAccount (in --node-guard-prober-namespace). Given, the
    /// webhook serves `POST /validate-nodes`, which lets only the prober of a node (its token
    /// bound to a prober pod on that node), the campaign coordinator and
    /// --node-guard-allowed-groups change railguard's certification outputs on Nodes, and only
    /// the fleet controller and those groups its outlier condition (cluster mode only).
    #[arg(
        long,
        env = "RAILGUARD_NODE_GUARD_PROBER_SERVICE_ACCOUNT",
        requires = "node_guard_prober_selector",
        conflicts_with = "profiles"
    )]
    pub node_guard_prober_service_account: Option<String>,
    /// Node guard: the namespace of the probers' and the campaign coordinator's
    /// ServiceAccounts and of the prober pods (default: --namespace). The chart sets it when
    /// `prober.namespace.name` moves the probers into a `privileged` Pod Security namespace
    /// of their own; the same account names in --namespace then certify nothing.
    #[arg(
        long,
        env = "RAILGUARD_NODE_GUARD_PROBER_NAMESPACE",
        requires = "node_guard_prober_service_account"
    )]
    pub node_guard_prober_namespace: Option<String>,
    /// Node guard: label selector of the prober pods in the prober namespace (watched into the
    /// cache requesters are checked against), e.g. `app.kubernetes.io/component=prober`.
    #[arg(
        long,
        env = "RAILGUARD_NODE_GUARD_PROBER_SELECTOR",
        requires = "node_guard_prober_service_account"
    )]
    pub node_guard_prober_selector: Option<String>,
    /// Node guard: the campaign coordinator's ServiceAccount (in the prober namespace),
    /// allowed to record findings (fabric label, certificate, condition) on nodes that have a
    /// certificate.
    #[arg(
        long,
        env = "RAILGUARD_NODE_GUARD_CAMPAIGN_SERVICE_ACCOUNT",
        requires = "node_guard_prober_service_account"
    )]
    pub node_guard_campaign_service_account: Option<String>,
    /// Node guard: the fleet controller's ServiceAccount (in --namespace), allowed to set and
    /// clear the RailguardFleetOutlier condition (and nothing else); unset, only
    /// --node-guard-allowed-groups may change that condition.
    #[arg(
        long,
        env = "RAILGUARD_NODE_GUARD_FLEET_SERVICE_ACCOUNT",
        requires = "node_guard_prober_service_account"
    )]
    pub node_guard_fleet_service_account: Option<String>,
    /// Node guard: groups whose members may change any output (break-glass repair; comma
    /// list, empty for none). system:masters bypasses RBAC and may delete the webhook
    /// configuration anyway.
    #[arg(
        long,
        env = "RAILGUARD_NODE_GUARD_ALLOWED_GROUPS",
        value_delimiter = ',',
        default_value = "system:masters"
    )]
    pub node_guard_allowed_groups: Vec<String>,
    /// Self-managed certificates: the node guard's ValidatingWebhookConfiguration, whose
    /// caBundle (every entry) trusts the self-managed CA as well.
    #[arg(
        long,
        env = "RAILGUARD_NODE_GUARD_CONFIG_NAME",
        requires = "self_signed_secret"
    )]
    pub node_guard_config_name: Option<String>,
    /// Log format: `text` (coloured only on a terminal) or `json` lines. The filter comes
    /// from RAILGUARD_LOG (or RUST_LOG), default `info`.
    #[arg(long, env = "RAILGUARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Deprecated: `--log-format json`.
    #[arg(long, env = "RAILGUARD_LOG_JSON", hide = true)]
    pub log_json: bool,
}

impl Cli {
    /// The log format, `--log-json` (deprecated) meaning `json`.
    pub fn log_format(&self) -> LogFormat {
        if self.log_json {
            LogFormat::Json
        } else {
            self.log_format
        }
    }
}

/// `--mode`: the command-line face of [`railguard_api::profile::AdmissionMode`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum AdmissionMode {
    /// Record what would be done; change nothing.
    Audit,
    /// Apply it.
    #[default]
    Enforce,
}

impl From<AdmissionMode> for railguard_api::profile::AdmissionMode {
    fn from(mode: AdmissionMode) -> Self {
        match mode {
            AdmissionMode::Audit => Self::Audit,
            AdmissionMode::Enforce => Self::Enforce,
        }
    }
}

/// `--failure-mode`: the command-line face of [`railguard_webhook::FailureMode`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum FailureMode {
    /// Allow the pod unchanged, with a warning.
    #[default]
    Open,
    /// Deny the pod.
    Closed,
}

impl From<FailureMode> for railguard_webhook::FailureMode {
    fn from(mode: FailureMode) -> Self {
        match mode {
            FailureMode::Open => Self::Open,
            FailureMode::Closed => Self::Closed,
        }
    }
}
