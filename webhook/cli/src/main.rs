//! `railguard-webhook`: the mutating admission webhook server.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use railguard_runtime::{error_line, StartupError, EXIT_ERROR};
use railguard_webhook::decisions::{CacheLimits, DecisionCache};
use railguard_webhook::node_guard::GuardPolicy;
use railguard_webhook_cli::catalog::Catalog;
use railguard_webhook_cli::cert_sync::{self, SelfSignedOptions};
use railguard_webhook_cli::certs::{time, CertSpec};
use railguard_webhook_cli::metrics::Metrics;
use railguard_webhook_cli::node_guard_cache::nodes::NodeOutputs;
use railguard_webhook_cli::node_guard_cache::probers::ProberPods;
use railguard_webhook_cli::server::{self, AppState, NodeGuardState};
use railguard_webhook_cli::tls::CertReloader;
use railguard_webhook_cli::{settings, Cli};
use tokio::task::JoinHandle;

const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
const NAME: &str = "railguard-webhook";

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
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

async fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.log_json {
        tracing::warn!("--log-json (RAILGUARD_LOG_JSON) is deprecated: use --log-format json");
    }
    // Both ports first: one in use fails before certificates or caches are touched.
    let listener = railguard_runtime::bind(cli.listen, "admission requests", "--listen")?;
    let metrics_listener =
        railguard_runtime::bind(cli.metrics_listen, "metrics and health", "--metrics-listen")?;

    let own = settings::own_namespace(cli.namespace.as_deref(), || {
        std::fs::read_to_string(SA_NAMESPACE_FILE).ok()
    });
    let config = settings::webhook_config(&cli, own.as_deref())?;
    tracing::info!(
        mode = config.mode.as_str(),
        opt_in = config.scope.is_opt_in(),
        "admission: {} (profiles may set their own policy.mode)",
        match config.mode {
            railguard_api::profile::AdmissionMode::Audit =>
                "audit, pods are admitted unchanged and railguard.io/audit records the patch",
            railguard_api::profile::AdmissionMode::Enforce => "enforce",
        }
    );

    let guard_policy = settings::node_guard_policy(&cli, own.as_deref())?;

    let metrics = Arc::new(Metrics::new());
    let mut routes = server::admission_routes();
    let mut guard = None;
    let catalog = match &cli.profiles {
        Some(path) => {
            let profiles = railguard_runtime::read_profiles(path, "--profiles")?;
            tracing::info!(count = profiles.len(), file = %path.display(), "standalone mode");
            metrics.profiles.set(profiles.len() as i64);
            Catalog::standalone(profiles)
        }
        None => {
            let client = kube_client(cli.kubeconfig.as_deref()).await?;
            let catalog = Catalog::cluster(client.clone(), metrics.clone());
            if let Some(policy) = guard_policy {
                let state = node_guard(&cli, policy, client, &catalog, &metrics);
                routes = routes.merge(server::node_guard_routes(state.clone()));
                guard = Some(state);
            }
            catalog
        }
    };

    // Self-managed certificates are settled before the first load, so the files exist.
    let (cert_stop_tx, cert_stop_rx) = tokio::sync::watch::channel(false);
    let cert_task = match &cli.self_signed_secret {
        Some(secret) => Some(start_self_signed(&cli, secret, own.clone(), cert_stop_rx).await?),
        None => None,
    };

    let reloader = CertReloader::new(&cli.tls_cert, &cli.tls_key)
        .map_err(|e| settings::tls_error(&e, &cli.tls_cert, &cli.tls_key))?;
    let state = Arc::new(AppState {
        catalog,
        config,
        failure_mode: cli.failure_mode.into(),
        metrics,
        decisions: DecisionCache::new(CacheLimits {
            max_entries: cli.decision_cache_entries,
            ..CacheLimits::default()
        }),
        node_guard: guard,
    });
    let opts = settings::serve_options(&cli);
    let running =
        server::start_routes_on(routes, state, reloader, opts, listener, metrics_listener)
            .await
            .context("cannot start the server")?;
    railguard_runtime::shutdown_signal().await;
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

/// The node guard's state, with the watches of the prober pods it checks requesters against
/// and of the Nodes' outputs.
fn node_guard(
    cli: &Cli,
    policy: GuardPolicy,
    client: kube::Client,
    catalog: &Arc<Catalog>,
    metrics: &Arc<Metrics>,
) -> Arc<NodeGuardState> {
    let selector = cli
        .node_guard_prober_selector
        .as_deref()
        .unwrap_or_default();
    tracing::info!(
        namespace = %policy.namespace, prober_namespace = %policy.prober_namespace,
        prober = %policy.prober_service_account,
        campaign = policy.campaign_service_account.as_deref().unwrap_or(""),
        fleet = policy.fleet_service_account.as_deref().unwrap_or(""),
        allowed_groups = %policy.allowed_groups.join(","), selector,
        "node guard on: POST /validate-nodes"
    );
    let probers = ProberPods::watch(client.clone(), &policy.prober_namespace, selector.trim());
    Arc::new(NodeGuardState {
        policy,
        probers,
        nodes: NodeOutputs::watch(client),
        catalog: catalog.clone(),
        metrics: metrics.clone(),
    })
}

/// Provisions the self-managed certificate once (the serving files must exist before the
/// first load), then keeps it in step in a task that ends when `stop` changes.
async fn start_self_signed(
    cli: &Cli,
    secret: &str,
    own_namespace: Option<String>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<()>> {
    let namespace = own_namespace.ok_or_else(|| {
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
        secret_name: secret.to_string(),
        namespace,
        webhook_config_name: cli.webhook_config_name.clone().unwrap_or_default(),
        validating_webhook_config_name: cli.node_guard_config_name.clone(),
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
    // No configuration to trust the CA yet (an install applies it after this Deployment):
    // try again soon rather than a whole interval later.
    let first = if report.webhook_config_missing {
        interval.min(cert_sync::RETRY_INTERVAL)
    } else {
        interval
    };
    Ok(tokio::spawn(async move {
        cert_sync::run_after(client, opts, first, interval, &mut stop).await
    }))
}

async fn kube_client(kubeconfig: Option<&Path>) -> Result<kube::Client, StartupError> {
    railguard_kube::kube_client(
        kubeconfig,
        "--kubeconfig",
        "pass --kubeconfig, run in a cluster, or use --profiles FILE (standalone)",
    )
    .await
}
