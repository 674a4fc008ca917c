//! `railguard-webhook`: the mutating admission webhook server.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use railguard_runtime::{error_line, StartupError, EXIT_ERROR};
use railguard_webhook::catalog::Catalog;
use railguard_webhook::cert_sync::{self, SelfSignedOptions};
use railguard_webhook::certs::CertSpec;
use railguard_webhook::cli::Args;
use railguard_webhook::metrics::Metrics;
use railguard_webhook::server::{self, AppState, ServeOptions};
use railguard_webhook::tls::CertReloader;
use railguard_webhook::{TlsError, WebhookConfig};

const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
const NAME: &str = "railguard-webhook";

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Args::parse();
    railguard_runtime::init_logging(cli.log_format(), "info");
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| rt.block_on(run(cli)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{NAME}: {}", error_line(e.as_ref()));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

async fn run(cli: Args) -> anyhow::Result<()> {
    if cli.log_json {
        tracing::warn!("--log-json (RAILGUARD_LOG_JSON) is deprecated: use --log-format json");
    }
    // Both ports first: one in use fails before certificates or caches are touched.
    let listener = railguard_runtime::bind(cli.listen, "admission requests", "--listen")?;
    let metrics_listener =
        railguard_runtime::bind(cli.metrics_listen, "metrics and health", "--metrics-listen")?;

    let gpu_resources: Vec<String> = clean_list(&cli.gpu_resources);
    if gpu_resources.is_empty() {
        return Err(StartupError::new(
            "invalid --gpu-resources",
            "it names no resource",
            "give the resource names of GPU containers, e.g. nvidia.com/gpu",
        )
        .into());
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
            let profiles = railguard_runtime::read_profiles(path, "--profiles")?;
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
            let namespace = own.clone().ok_or_else(|| {
                StartupError::new(
                    "--self-signed-secret needs the webhook's namespace",
                    "no --namespace and no service account namespace file",
                    "pass --namespace (RAILGUARD_NAMESPACE)",
                )
            })?;
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
        .map_err(|e| tls_error(&e, &cli.tls_cert, &cli.tls_key))?;
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
    let running = server::start_on(state, reloader, opts, listener, metrics_listener)
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

async fn kube_client(kubeconfig: Option<&Path>) -> Result<kube::Client, StartupError> {
    railguard_runtime::kube_client(
        kubeconfig,
        "--kubeconfig",
        "pass --kubeconfig, run in a cluster, or use --profiles FILE (standalone)",
    )
    .await
}

/// The serving pair could not be loaded: which file, which flag.
fn tls_error(e: &TlsError, cert: &Path, key: &Path) -> StartupError {
    let flag = |path: &Path| {
        if path == key && path != cert {
            ("TLS key", "--tls-key")
        } else {
            ("TLS certificate", "--tls-cert")
        }
    };
    let pem_fix = "give PEM files (tls.crt: the certificate chain, tls.key: its private key)";
    match e {
        TlsError::Read { path, source } => {
            let (what, flag) = flag(path);
            StartupError::unreadable(&format!("the {what}"), path, flag, source)
        }
        TlsError::NoCertificate { path } | TlsError::NoKey { path } => {
            let (what, flag) = flag(path);
            StartupError::new(
                format!("invalid {what} {} ({flag})", path.display()),
                e.to_string(),
                pem_fix,
            )
        }
        TlsError::Pem { path, .. } => {
            let (what, flag) = flag(path);
            StartupError::invalid(what, path, flag, e, pem_fix)
        }
        TlsError::Pair { .. } => StartupError::new(
            format!(
                "the TLS certificate {} (--tls-cert) and key {} (--tls-key) are not a usable pair",
                cert.display(),
                key.display()
            ),
            railguard_runtime::error_chain(e),
            "give the private key that belongs to the certificate",
        ),
    }
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
