//! `railguard-webhook`: the mutating admission webhook server.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use railguard_webhook::catalog::Catalog;
use railguard_webhook::cert_sync::{self, SelfSignedOptions};
use railguard_webhook::certs::CertSpec;
use railguard_webhook::cli::Args;
use railguard_webhook::metrics::Metrics;
use railguard_webhook::server::{self, AppState, ServeOptions};
use railguard_webhook::tls::CertReloader;
use railguard_webhook::WebhookConfig;

const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Args::parse();
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
            // No configuration to trust the CA yet (an install applies it after this
            // Deployment): try again soon rather than a whole interval later.
            let first = if report.webhook_config_missing {
                interval.min(cert_sync::RETRY_INTERVAL)
            } else {
                interval
            };
            let mut stop = cert_stop_rx;
            Some(tokio::spawn(async move {
                cert_sync::run_after(client, opts, first, interval, &mut stop).await
            }))
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
    tracing::info!(
        delay_seconds = cli.shutdown_delay_seconds,
        "stop requested: not ready, still serving"
    );
    running.begin_drain();
    tokio::time::sleep(Duration::from_secs(cli.shutdown_delay_seconds)).await;
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
