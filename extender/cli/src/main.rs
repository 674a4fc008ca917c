//! `railguard-extender`: the kube-scheduler extender binary.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use railguard_extender_cli::cache::ClusterState;
use railguard_extender_cli::metrics::{Metrics, ResultLabels};
use railguard_extender_cli::server::{self, AppState, Source};
use railguard_extender_cli::{tls_bootstrap, Cli, Command};
use railguard_runtime::{
    error_line, limit_requests, StartupError, TlsFiles, TlsReloader, EXIT_ERROR,
};

const NAME: &str = "railguard-extender";

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Cli::parse();
    let log_format = match &args.command {
        Some(Command::TlsBootstrap(a)) => a.log_format,
        None => args.log_format,
    };
    railguard_runtime::init_logging(log_format, "info");
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| match &args.command {
            Some(Command::TlsBootstrap(a)) => rt.block_on(tls_bootstrap::run(a)),
            None => rt.block_on(run(args)),
        });
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
        let client = railguard_kube::kube_client(
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
        (Some(cert), Some(key)) => {
            let (cert, key, client_ca) = (cert.clone(), key.clone(), args.tls_client_ca.clone());
            let files = [Some(&cert), Some(&key), client_ca.as_ref()]
                .into_iter()
                .flatten()
                .cloned()
                .collect();
            let reloader = TlsReloader::new(files, move || {
                railguard_runtime::server_tls(TlsFiles {
                    cert: &cert,
                    key: &key,
                    client_ca: client_ca.as_deref(),
                })
            })?;
            let source = reloader.source();
            let metrics = state.metrics.clone();
            let interval = Duration::from_secs(args.cert_poll_seconds);
            let count = move |result| {
                metrics
                    .tls_reloads
                    .get_or_create(&ResultLabels { result })
                    .inc();
            };
            tokio::spawn(reloader.run(interval, std::future::pending(), "extender", count));
            Some(source)
        }
        _ => None,
    };
    tracing::info!(
        listen = %args.listen, metrics = %args.metrics_listen, tls = tls.is_some(),
        client_auth = args.tls_client_ca.is_some(), max_body_bytes = args.max_body_bytes(),
        "serving"
    );

    let requests = args.request_limits();
    let limits = args.serve_limits();
    let extender = railguard_runtime::spawn_serve(
        listener,
        limit_requests(
            server::extender_router(state.clone(), args.max_body_bytes()),
            &requests,
        ),
        tls,
        limits.clone(),
    )
    .context("cannot serve the extender listener")?;
    let draining = Arc::new(AtomicBool::new(false));
    let health = railguard_runtime::spawn_serve(
        metrics_listener,
        limit_requests(server::health_router(state, draining.clone()), &requests),
        None,
        limits,
    )
    .context("cannot serve the metrics listener")?;
    let (drain_extender, drain_health) = (extender.drain.clone(), health.drain.clone());
    let (stop_extender, stop_health) = (extender.stop.clone(), health.stop.clone());
    let delay = Duration::from_secs(args.shutdown_delay_seconds);
    tokio::spawn(async move {
        railguard_runtime::shutdown_signal().await;
        tracing::info!(
            delay_seconds = delay.as_secs(),
            "stop requested: not ready, still serving"
        );
        draining.store(true, Ordering::Relaxed);
        drain_extender.cancel();
        drain_health.cancel();
        tokio::time::sleep(delay).await;
        tracing::info!("shutting down; finishing in-flight requests");
        stop_extender.cancel();
        stop_health.cancel();
    });
    let (extender, health) = tokio::join!(extender.task, health.task);
    extender
        .context("extender endpoint failed")?
        .context("extender endpoint failed")?;
    health
        .context("metrics endpoint failed")?
        .context("metrics endpoint failed")?;
    if let Some(w) = watches {
        w.abort();
    }
    Ok(())
}
