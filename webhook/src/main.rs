//! `railguard-webhook`: the mutating admission webhook server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use railguard_webhook::catalog::Catalog;
use railguard_webhook::cert_sync::{self, SelfSignedOptions};
use railguard_webhook::certs::CertSpec;
use railguard_webhook::metrics::Metrics;
use railguard_webhook::server::{self, AppState, ServeOptions};
use railguard_webhook::tls::CertReloader;
use railguard_webhook::{FailureMode, WebhookConfig};

/// Configures GPU training pods for their RDMA fabric at admission.
#[derive(Debug, Parser)]
#[command(name = "railguard-webhook", version)]
struct Cli {
    /// Address of the TLS admission endpoint (`POST /mutate`).
    #[arg(long, env = "RAILGUARD_LISTEN", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// PEM certificate chain; reloaded when it changes (Secret-volume rotation included).
    #[arg(long, env = "RAILGUARD_TLS_CERT")]
    tls_cert: PathBuf,
    /// PEM private key matching --tls-cert.
    #[arg(long, env = "RAILGUARD_TLS_KEY")]
    tls_key: PathBuf,
    /// Plain-HTTP address of /healthz, /readyz and /metrics.
    #[arg(long, env = "RAILGUARD_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    metrics_listen: SocketAddr,
    /// Standalone mode: a YAML stream of FabricProfiles instead of the cluster's. Namespace
    /// labels are then unknown (empty): selector exemptions and Pod Security labels are not
    /// seen; exemptions listed by namespace name still apply.
    #[arg(long, env = "RAILGUARD_PROFILES")]
    profiles: Option<PathBuf>,
    /// Kubeconfig for cluster mode (default: in-cluster or $KUBECONFIG).
    #[arg(long, env = "RAILGUARD_KUBECONFIG", conflicts_with = "profiles")]
    kubeconfig: Option<PathBuf>,
    /// On an internal error building a patch: `open` allows unchanged with a warning,
    /// `closed` denies.
    #[arg(long, env = "RAILGUARD_FAILURE_MODE", value_enum, default_value_t = FailureMode::Open)]
    failure_mode: FailureMode,
    /// Resource names that make a container a GPU container (comma list).
    #[arg(
        long,
        env = "RAILGUARD_GPU_RESOURCES",
        value_delimiter = ',',
        default_value = "nvidia.com/gpu"
    )]
    gpu_resources: Vec<String>,
    /// Namespaces never touched (comma list); the webhook's own namespace is added.
    #[arg(
        long,
        env = "RAILGUARD_EXCLUDED_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system"
    )]
    excluded_namespaces: Vec<String>,
    /// The webhook's own namespace (default: the service account's, when in a cluster).
    #[arg(long, env = "RAILGUARD_NAMESPACE")]
    namespace: Option<String>,
    /// railguard-prober image for the optional preflight init container.
    #[arg(long, env = "RAILGUARD_PROBER_IMAGE")]
    prober_image: Option<String>,
    /// Largest request body accepted, bytes.
    #[arg(long, env = "RAILGUARD_MAX_BODY_BYTES", default_value_t = 6 << 20)]
    max_body_bytes: usize,
    /// Per-request timeout, seconds.
    #[arg(long, env = "RAILGUARD_REQUEST_TIMEOUT_SECONDS", default_value_t = 10)]
    request_timeout_seconds: u64,
    /// How long shutdown waits for in-flight requests, seconds.
    #[arg(long, env = "RAILGUARD_SHUTDOWN_GRACE_SECONDS", default_value_t = 20)]
    shutdown_grace_seconds: u64,
    /// How often the certificate files are checked for changes, seconds.
    #[arg(long, env = "RAILGUARD_CERT_POLL_SECONDS", default_value_t = 2)]
    cert_poll_seconds: u64,
    /// Self-managed certificates: the Secret (in --namespace) holding the CA and serving pair.
    /// The webhook creates or renews it, writes the pair to --tls-cert/--tls-key and the CA
    /// into --webhook-config-name's caBundle.
    #[arg(long, env = "RAILGUARD_SELF_SIGNED_SECRET", requires_all = ["webhook_config_name", "service_name"])]
    self_signed_secret: Option<String>,
    /// MutatingWebhookConfiguration whose caBundle (every entry) trusts the self-managed CA.
    #[arg(
        long,
        env = "RAILGUARD_WEBHOOK_CONFIG_NAME",
        requires = "self_signed_secret"
    )]
    webhook_config_name: Option<String>,
    /// Service the API server dials; the certificate covers `<svc>.<ns>.svc[.cluster.local]`.
    #[arg(long, env = "RAILGUARD_SERVICE_NAME", requires = "self_signed_secret")]
    service_name: Option<String>,
    /// Lifetime of a self-managed serving certificate, days.
    #[arg(long, env = "RAILGUARD_CERT_VALIDITY_DAYS", default_value_t = 365)]
    cert_validity_days: u32,
    /// Renew a self-managed certificate this many days before it expires.
    #[arg(long, env = "RAILGUARD_CERT_ROTATE_BEFORE_DAYS", default_value_t = 30)]
    cert_rotate_before_days: u32,
    /// How often the self-managed Secret and caBundle are checked, seconds.
    #[arg(long, env = "RAILGUARD_CERT_SYNC_SECONDS", default_value_t = 300)]
    cert_sync_seconds: u64,
    /// Log as JSON lines.
    #[arg(long, env = "RAILGUARD_LOG_JSON")]
    log_json: bool,
}

const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if cli.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }

    let gpu_resources: Vec<String> = clean_list(&cli.gpu_resources);
    if gpu_resources.is_empty() {
        bail!("--gpu-resources names no resource");
    }
    let mut excluded = clean_list(&cli.excluded_namespaces);
    let own = cli
        .namespace
        .clone()
        .or_else(|| std::fs::read_to_string(SA_NAMESPACE_FILE).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    if let Some(own) = &own {
        if !excluded.contains(own) {
            excluded.push(own.clone());
        }
    }
    let config = WebhookConfig {
        gpu_resources,
        excluded_namespaces: excluded,
        prober_image: cli.prober_image.clone().filter(|s| !s.trim().is_empty()),
    };

    let metrics = Arc::new(Metrics::new());
    let catalog = match &cli.profiles {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --profiles {}", path.display()))?;
            let profiles = railguard_api::profiles_from_yaml(&text)
                .with_context(|| format!("invalid --profiles {}", path.display()))?;
            if profiles.is_empty() {
                bail!("--profiles {} holds no FabricProfile", path.display());
            }
            tracing::info!(count = profiles.len(), file = %path.display(), "standalone mode");
            metrics.profiles.set(profiles.len() as i64);
            Catalog::standalone(profiles)
        }
        None => {
            let client = kube_client(cli.kubeconfig.as_deref()).await?;
            Catalog::cluster(client, metrics.clone())
        }
    };

    // Self-managed certificates are settled before the first load, so the files exist.
    let (cert_stop_tx, cert_stop_rx) = tokio::sync::watch::channel(false);
    let cert_task = match &cli.self_signed_secret {
        Some(secret) => {
            let namespace = own
                .clone()
                .context("--self-signed-secret needs --namespace (or a service account)")?;
            let spec = CertSpec::new(
                cli.service_name.as_deref().unwrap_or_default(),
                &namespace,
                cli.cert_validity_days,
                cli.cert_rotate_before_days,
            )?;
            let opts = SelfSignedOptions {
                secret_name: secret.clone(),
                namespace,
                webhook_config_name: cli.webhook_config_name.clone().unwrap_or_default(),
                spec,
                tls_cert: cli.tls_cert.clone(),
                tls_key: cli.tls_key.clone(),
            };
            let client = kube_client(cli.kubeconfig.as_deref()).await?;
            let report = cert_sync::sync_once(&client, &opts, time::OffsetDateTime::now_utc())
                .await
                .context("cannot provision the self-managed certificate")?;
            cert_sync::log_report(&opts, &report);
            let interval = Duration::from_secs(cli.cert_sync_seconds.max(1));
            Some(tokio::spawn(cert_sync::run(
                client,
                opts,
                interval,
                cert_stop_rx,
            )))
        }
        None => None,
    };

    let reloader = CertReloader::new(&cli.tls_cert, &cli.tls_key)
        .context("cannot load the serving certificate")?;
    let state = Arc::new(AppState {
        catalog,
        config,
        failure_mode: cli.failure_mode,
        metrics,
    });
    let opts = ServeOptions {
        listen: cli.listen,
        metrics_listen: cli.metrics_listen,
        max_body_bytes: cli.max_body_bytes,
        request_timeout: Duration::from_secs(cli.request_timeout_seconds.max(1)),
        shutdown_grace: Duration::from_secs(cli.shutdown_grace_seconds),
        cert_poll_interval: Duration::from_secs(cli.cert_poll_seconds.max(1)),
    };
    let running = server::start(state, reloader, opts)
        .await
        .context("cannot start the server")?;
    shutdown_signal().await;
    tracing::info!("shutting down; finishing in-flight requests");
    let _ = cert_stop_tx.send(true);
    if let Some(task) = cert_task {
        let _ = task.await;
    }
    running.shutdown().await.context("server error")?;
    Ok(())
}

fn clean_list(items: &[String]) -> Vec<String> {
    items
        .iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("invalid --kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig: pass --kubeconfig, run in a cluster, or use --profiles")?,
    };
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
