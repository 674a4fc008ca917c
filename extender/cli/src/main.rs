//! `railguard-extender`: the kube-scheduler extender binary.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use railguard_extender::cache::ClusterState;
use railguard_extender::metrics::Metrics;
use railguard_extender::server::{self, AppState, Source};
use railguard_extender_cli::Cli;
use railguard_runtime::{describe_io, error_line, StartupError, EXIT_ERROR};

const NAME: &str = "railguard-extender";

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Cli::parse();
    railguard_runtime::init_logging(args.log_format, "info");
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| rt.block_on(run(args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{NAME}: {}", error_line(e.as_ref()));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

async fn run(args: Cli) -> anyhow::Result<()> {
    // Both ports first: one in use fails before the caches start.
    let listener = railguard_runtime::bind(args.listen, "scheduler requests", "--listen")?;
    let metrics_listener = railguard_runtime::bind(
        args.metrics_listen,
        "metrics and health",
        "--metrics-listen",
    )?;

    let config = args.extender_config();
    let metrics = Arc::new(Metrics::new());
    let mut watches = None;
    let source = if args.standalone {
        let path = args.profiles.as_ref().ok_or_else(|| {
            StartupError::new(
                "--standalone needs FabricProfiles",
                "no --profiles given",
                "pass --profiles FILE",
            )
        })?;
        let profiles = railguard_runtime::read_profiles(path, "--profiles")?;
        tracing::info!(profiles = profiles.len(), "standalone mode");
        Source::Standalone {
            profiles: Arc::new(profiles),
        }
    } else {
        let client = railguard_runtime::kube_client(
            args.kubeconfig.as_deref(),
            "--kubeconfig",
            "pass --kubeconfig, run in a cluster, or use --standalone --profiles FILE",
        )
        .await?;
        let cluster = Arc::new(ClusterState::new(config.clone()));
        watches = Some(tokio::spawn(cluster.clone().run(client, metrics.clone())));
        Source::Cluster(cluster)
    };
    let state = Arc::new(AppState {
        source,
        config,
        max_nodes: args.max_nodes,
        metrics,
    });

    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(load_tls(cert, key).await?),
        _ => None,
    };
    let metrics_listener = tokio::net::TcpListener::from_std(metrics_listener)
        .context("cannot serve the metrics listener")?;
    tracing::info!(listen = %args.listen, metrics = %args.metrics_listen, tls = tls.is_some(), "serving");

    let handle = axum_server::Handle::new();
    let shutdown = handle.clone();
    tokio::spawn(async move {
        railguard_runtime::shutdown_signal().await;
        tracing::info!("shutting down");
        shutdown.graceful_shutdown(Some(std::time::Duration::from_secs(5)));
    });
    let health = axum::serve(metrics_listener, server::health_router(state.clone()));
    let extender = server::serve_extender(
        listener,
        tls,
        server::extender_router(state, args.max_body_bytes),
        handle,
    );
    tokio::select! {
        r = extender => r.context("extender endpoint failed")?,
        r = health => r.context("metrics endpoint failed")?,
    }
    if let Some(w) = watches {
        w.abort();
    }
    Ok(())
}

/// The TLS pair of `--tls-cert`/`--tls-key`, each file named when it cannot be read.
async fn load_tls(
    cert: &Path,
    key: &Path,
) -> Result<axum_server::tls_rustls::RustlsConfig, StartupError> {
    let cert_pem = std::fs::read(cert)
        .map_err(|e| StartupError::unreadable("the TLS certificate", cert, "--tls-cert", &e))?;
    let key_pem = std::fs::read(key)
        .map_err(|e| StartupError::unreadable("the TLS key", key, "--tls-key", &e))?;
    axum_server::tls_rustls::RustlsConfig::from_pem(cert_pem, key_pem)
        .await
        .map_err(|e| {
            StartupError::new(
                format!(
                    "cannot use the TLS certificate {} (--tls-cert) with the key {} (--tls-key)",
                    cert.display(),
                    key.display()
                ),
                describe_io(&e),
                "give a PEM certificate chain and the PEM private key that belongs to it",
            )
        })
}
