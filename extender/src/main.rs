//! `railguard-extender`: the kube-scheduler extender binary.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use railguard_extender::cache::ClusterState;
use railguard_extender::cli::Args;
use railguard_extender::metrics::Metrics;
use railguard_extender::server::{self, AppState, Source};
use railguard_extender::ExtenderConfig;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if args.log_format == "json" {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }

    let config = ExtenderConfig {
        gpu_resources: args.gpu_resources.clone(),
        job_label_keys: args.job_label_keys.clone(),
        topology_keys: args.topology_keys.clone(),
        report_unresolvable_as_failed: args.report_unresolvable_as_failed,
    };
    let metrics = Arc::new(Metrics::new());
    let mut watches = None;
    let source = if args.standalone {
        let path = args
            .profiles
            .as_ref()
            .context("--standalone needs --profiles")?;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read profiles {}", path.display()))?;
        let profiles = railguard_api::profiles_from_yaml(&text)
            .with_context(|| format!("invalid FabricProfiles in {}", path.display()))?;
        if profiles.is_empty() {
            anyhow::bail!("{} holds no FabricProfile", path.display());
        }
        tracing::info!(profiles = profiles.len(), "standalone mode");
        Source::Standalone {
            profiles: Arc::new(profiles),
        }
    } else {
        let kube_config = match &args.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .context("invalid kubeconfig")?
            }
            None => kube::Config::infer()
                .await
                .context("no kubeconfig and not in a cluster")?,
        };
        let client = kube::Client::try_from(kube_config).context("cannot build a kube client")?;
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
        (Some(cert), Some(key)) => Some(server::load_tls(cert, key).await?),
        _ => None,
    };
    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let metrics_listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.metrics_listen))?;
    tracing::info!(listen = %args.listen, metrics = %args.metrics_listen, tls = tls.is_some(), "serving");

    let handle = axum_server::Handle::new();
    let shutdown = handle.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
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

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
