//! From the command line to the library's configuration: plain functions, no IO, so the
//! rules (the webhook's own namespace is always excluded, an empty `--gpu-resources` is an
//! error, which flag a TLS failure names) are tested without starting anything.

use std::path::Path;
use std::time::Duration;

use crate::server::ServeOptions;
use crate::TlsError;
use railguard_api::selector::LabelSelector;
use railguard_runtime::StartupError;
use railguard_webhook::config::Scope;
use railguard_webhook::node_guard::GuardPolicy;
use railguard_webhook::WebhookConfig;

use crate::Cli;

/// Trimmed, non-empty items of a comma-list flag.
pub fn clean_list(items: &[String]) -> Vec<String> {
    items
        .iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The webhook's own namespace: `--namespace`, else what `service_account_namespace` reads
/// (the service account's namespace file, when there is one).
pub fn own_namespace(
    flag: Option<&str>,
    service_account_namespace: impl FnOnce() -> Option<String>,
) -> Option<String> {
    flag.map(str::to_string)
        .or_else(service_account_namespace)
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// What the pure core reads, from the flags and the webhook's own namespace (excluded too).
pub fn webhook_config(
    cli: &Cli,
    own_namespace: Option<&str>,
) -> Result<WebhookConfig, StartupError> {
    let gpu_resources = clean_list(&cli.gpu_resources);
    if gpu_resources.is_empty() {
        return Err(StartupError::new(
            "invalid --gpu-resources",
            "it names no resource",
            "give the resource names of GPU containers, e.g. nvidia.com/gpu",
        ));
    }
    let mut excluded_namespaces = clean_list(&cli.excluded_namespaces);
    if let Some(own) = own_namespace {
        if !excluded_namespaces.iter().any(|n| n == own) {
            excluded_namespaces.push(own.to_string());
        }
    }
    Ok(WebhookConfig {
        gpu_resources,
        excluded_namespaces,
        prober_image: cli.prober_image.clone().filter(|s| !s.trim().is_empty()),
        nccl_plugin_path: host_file("--nccl-plugin-path", &cli.nccl_plugin_path)?,
        nccl_config_path: host_file("--nccl-config-path", &cli.nccl_config_path)?,
        mode: cli.mode.into(),
        scope: Scope {
            namespaces: opt_in_selector(
                "--opt-in-namespace-selector",
                cli.opt_in_namespace_selector.as_deref(),
            )?,
            pods: opt_in_selector("--opt-in-pod-selector", cli.opt_in_pod_selector.as_deref())?,
        },
    })
}

/// An opt-in selector flag: a JSON LabelSelector Kubernetes would accept; blank is unset.
fn opt_in_selector(flag: &str, value: Option<&str>) -> Result<Option<LabelSelector>, StartupError> {
    let Some(text) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let invalid = |why: String| {
        StartupError::new(
            format!("invalid {flag}"),
            why,
            r#"give a LabelSelector as JSON, e.g. {"matchLabels":{"railguard.io/inject":"true"}}"#,
        )
    };
    let selector: LabelSelector = serde_json::from_str(text)
        .map_err(|e| invalid(format!("{text:?} is not a LabelSelector: {e}")))?;
    selector.validate().map_err(invalid)?;
    Ok(Some(selector))
}

/// A file on every node whose directory the webhook mounts into pods: absolute, plain
/// components, and not directly under `/` (the host's root is never mounted).
fn host_file(flag: &str, value: &str) -> Result<String, StartupError> {
    let path = value.trim();
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    let plain = path.starts_with('/')
        && parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && *p != "." && *p != "..");
    if plain {
        Ok(path.to_string())
    } else {
        Err(StartupError::new(
            format!("invalid {flag}"),
            format!("{value:?} is not an absolute file path below a directory"),
            "give the file's path on the nodes, e.g. /opt/railguard/nccl/libnccl-env-railguard.so",
        ))
    }
}

/// The node guard's policy, when `--node-guard-prober-service-account` enables it: the
/// fleet controller's service account lives in the webhook's own namespace, the probers' and
/// the campaign's in `--node-guard-prober-namespace` (default: the webhook's own).
pub fn node_guard_policy(
    cli: &Cli,
    own_namespace: Option<&str>,
) -> Result<Option<GuardPolicy>, StartupError> {
    let Some(prober) = cli
        .node_guard_prober_service_account
        .as_deref()
        .map(str::trim)
    else {
        return Ok(None);
    };
    let invalid = |what: &str| {
        StartupError::new(
            "invalid --node-guard-prober-service-account",
            what.to_string(),
            "name the probers' ServiceAccount and pass --namespace (RAILGUARD_NAMESPACE)",
        )
    };
    if prober.is_empty() {
        return Err(invalid("it is empty"));
    }
    let namespace = own_namespace.ok_or_else(|| {
        invalid("the node guard needs the webhook's namespace (the probers' namespace)")
    })?;
    let prober_namespace = match cli.node_guard_prober_namespace.as_deref().map(str::trim) {
        None | Some("") => namespace,
        Some(ns) if is_dns_label(ns) => ns,
        Some(ns) => {
            return Err(StartupError::new(
                "invalid --node-guard-prober-namespace",
                format!("{ns:?} is not a namespace name (a DNS label)"),
                "name the namespace the prober DaemonSets run in, e.g. railguard-probers",
            ))
        }
    };
    let selector = cli.node_guard_prober_selector.as_deref().map(str::trim);
    if selector.is_none_or(str::is_empty) {
        return Err(StartupError::new(
            "invalid --node-guard-prober-selector",
            "it is empty: every pod of the namespace would count as a prober",
            "give the probers' pod labels, e.g. app.kubernetes.io/component=prober",
        ));
    }
    Ok(Some(GuardPolicy {
        namespace: namespace.to_string(),
        prober_namespace: prober_namespace.to_string(),
        prober_service_account: prober.to_string(),
        campaign_service_account: service_account(&cli.node_guard_campaign_service_account),
        fleet_service_account: service_account(&cli.node_guard_fleet_service_account),
        allowed_groups: clean_list(&cli.node_guard_allowed_groups),
    }))
}

/// Whether `s` is a DNS label (RFC 1123), as namespace names are.
fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A ServiceAccount name given on the command line; blank is none.
fn service_account(flag: &Option<String>) -> Option<String> {
    flag.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Limits of the running server (zero intervals and timeouts become one second).
pub fn serve_options(cli: &Cli) -> ServeOptions {
    ServeOptions {
        listen: cli.listen,
        metrics_listen: cli.metrics_listen,
        max_body_bytes: cli.max_body_bytes,
        request_timeout: Duration::from_secs(cli.request_timeout_seconds.max(1)),
        connections: cli
            .serve
            .limits(Duration::from_secs(cli.shutdown_grace_seconds)),
        max_in_flight: cli.serve.max_concurrent_requests.max(1),
        shutdown_grace: Duration::from_secs(cli.shutdown_grace_seconds),
        cert_poll_interval: Duration::from_secs(cli.cert_poll_seconds.max(1)),
    }
}

/// The serving pair could not be loaded: which file, which flag.
pub fn tls_error(e: &TlsError, cert: &Path, key: &Path) -> StartupError {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::PathBuf;

    use clap::Parser;

    use super::*;

    fn cli(extra: &[&str]) -> Cli {
        let mut args = vec![
            "railguard-webhook",
            "--tls-cert",
            "/t/tls.crt",
            "--tls-key",
            "/t/tls.key",
        ];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args).unwrap()
    }

    #[test]
    fn the_own_namespace_is_excluded_once() {
        let c = cli(&["--excluded-namespaces", " kube-system, ,railguard"]);
        let config = webhook_config(&c, Some("railguard")).unwrap();
        assert_eq!(config.excluded_namespaces, ["kube-system", "railguard"]);
        let config = webhook_config(&c, Some("ops")).unwrap();
        assert_eq!(
            config.excluded_namespaces,
            ["kube-system", "railguard", "ops"]
        );
    }

    #[test]
    fn mode_and_opt_in_scope_come_from_their_flags() {
        use railguard_api::profile::AdmissionMode;
        let config = webhook_config(&cli(&[]), None).unwrap();
        assert_eq!(config.mode, AdmissionMode::Enforce);
        assert!(!config.scope.is_opt_in(), "every GPU pod by default");
        let c = cli(&[
            "--mode=Audit",
            r#"--opt-in-namespace-selector={"matchLabels":{"railguard.io/inject":"true"}}"#,
            r#"--opt-in-pod-selector={"matchExpressions":[{"key":"kueue.x-k8s.io/podset","operator":"Exists"}]}"#,
        ]);
        let config = webhook_config(&c, None).unwrap();
        assert_eq!(config.mode, AdmissionMode::Audit);
        let labels = |k: &str, v: &str| std::collections::BTreeMap::from([(k.into(), v.into())]);
        let none = Default::default();
        assert!(config
            .scope
            .admits(&labels("railguard.io/inject", "true"), &none));
        assert!(config
            .scope
            .admits(&none, &labels("kueue.x-k8s.io/podset", "q")));
        assert!(!config.scope.admits(&none, &none));
        assert_eq!(
            cli(&["--mode", "enforce"]).mode,
            crate::args::AdmissionMode::Enforce
        );
        assert!(Cli::try_parse_from([
            "railguard-webhook",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--mode",
            "report"
        ])
        .is_err());
        for (flag, bad, why) in [
            (
                "--opt-in-pod-selector",
                "railguard.io/inject=true",
                "is not a LabelSelector",
            ),
            (
                "--opt-in-namespace-selector",
                r#"{"matchExpressions":[{"key":"k","operator":"In"}]}"#,
                "needs values",
            ),
        ] {
            let e = webhook_config(&cli(&[&format!("{flag}={bad}")]), None).unwrap_err();
            let text = e.to_string();
            assert!(text.contains(flag) && text.contains(why), "{text}");
        }
        let blank = webhook_config(&cli(&["--opt-in-pod-selector= "]), None).unwrap();
        assert!(!blank.scope.is_opt_in());
    }

    #[test]
    fn the_flag_wins_over_the_service_account_file() {
        let sa = |text: &str| {
            let text = text.to_string();
            move || Some(text)
        };
        assert_eq!(own_namespace(Some(" ns "), sa("sa")).as_deref(), Some("ns"));
        assert_eq!(own_namespace(None, sa("sa\n")).as_deref(), Some("sa"));
        assert_eq!(own_namespace(None, sa("  ")), None);
        assert_eq!(own_namespace(None, || None), None);
    }

    #[test]
    fn no_gpu_resource_is_an_error_and_a_blank_prober_image_is_none() {
        let e = webhook_config(&cli(&["--gpu-resources", " , "]), None).unwrap_err();
        assert!(e.to_string().contains("--gpu-resources"), "{e}");
        let config = webhook_config(&cli(&["--prober-image", " "]), None).unwrap();
        assert_eq!(config.prober_image, None);
        assert_eq!(config.gpu_resources, ["nvidia.com/gpu"]);
    }

    #[test]
    fn nccl_paths_default_to_the_charts_and_must_be_files_below_a_directory() {
        let config = webhook_config(&cli(&[]), None).unwrap();
        assert_eq!(
            config.nccl_plugin_path,
            "/opt/railguard/nccl/libnccl-env-railguard.so"
        );
        assert_eq!(config.nccl_config_path, "/run/railguard/nccl.json");
        let config = webhook_config(&cli(&["--nccl-config-path", "/var/run/rg/n.json"]), None);
        assert_eq!(config.unwrap().nccl_config_path, "/var/run/rg/n.json");
        for bad in [
            "nccl.json",
            "/nccl.json",
            "/run/../nccl.json",
            "/run//nccl.json",
        ] {
            let e = webhook_config(&cli(&["--nccl-config-path", bad]), None).unwrap_err();
            assert!(e.to_string().contains("--nccl-config-path"), "{bad}: {e}");
        }
        let e = webhook_config(&cli(&["--nccl-plugin-path", "/x.so"]), None).unwrap_err();
        assert!(e.to_string().contains("--nccl-plugin-path"), "{e}");
    }

    #[test]
    fn the_node_guard_policy_comes_from_its_flags_and_the_own_namespace() {
        assert_eq!(
            node_guard_policy(&cli(&[]), Some("railguard")).unwrap(),
            None
        );
        let guarded = cli(&[
            "--node-guard-prober-service-account",
            "rg-prober",
            "--node-guard-prober-selector",
            "app.kubernetes.io/component=prober",
            "--node-guard-campaign-service-account",
            " ",
        ]);
        assert_eq!(
            node_guard_policy(&guarded, Some("railguard"))
                .unwrap()
                .unwrap()
                .fleet_service_account,
            None
        );
        let fleet = cli(&[
            "--node-guard-prober-service-account=rg-prober",
            "--node-guard-prober-selector=app=prober",
            "--node-guard-fleet-service-account= rg-fleet ",
        ]);
        let policy = node_guard_policy(&fleet, Some("ns")).unwrap().unwrap();
        assert_eq!(policy.fleet_service_account.as_deref(), Some("rg-fleet"));
        assert_eq!(
            policy.fleet_user().as_deref(),
            Some("system:serviceaccount:ns:rg-fleet")
        );
        let policy = node_guard_policy(&guarded, Some("railguard"))
            .unwrap()
            .unwrap();
        assert_eq!(policy.namespace, "railguard");
        assert_eq!(policy.prober_service_account, "rg-prober");
        assert_eq!(policy.campaign_service_account, None);
        assert_eq!(policy.allowed_groups, ["system:masters"]);
        let e = node_guard_policy(&guarded, None).unwrap_err();
        assert!(
            e.to_string()
                .contains("--node-guard-prober-service-account"),
            "{e}"
        );

        // The probers split into their own namespace: the prober and campaign accounts are
        // looked up there, the fleet controller's stays in the webhook's.
        let split = cli(&[
            "--node-guard-prober-service-account=rg-prober",
            "--node-guard-prober-selector=app=prober",
            "--node-guard-campaign-service-account=rg-campaign",
            "--node-guard-fleet-service-account=rg-fleet",
            "--node-guard-prober-namespace= rg-probers ",
        ]);
        let policy = node_guard_policy(&split, Some("railguard"))
            .unwrap()
            .unwrap();
        assert_eq!(policy.namespace, "railguard");
        assert_eq!(policy.prober_namespace, "rg-probers");
        assert_eq!(
            policy.prober_user(),
            "system:serviceaccount:rg-probers:rg-prober"
        );
        assert_eq!(
            policy.campaign_user().as_deref(),
            Some("system:serviceaccount:rg-probers:rg-campaign")
        );
        assert_eq!(
            policy.fleet_user().as_deref(),
            Some("system:serviceaccount:railguard:rg-fleet")
        );
        // Unset or blank: the webhook's own namespace, as before.
        let policy = node_guard_policy(&guarded, Some("railguard"))
            .unwrap()
            .unwrap();
        assert_eq!(policy.prober_namespace, "railguard");
        let blank_ns = cli(&[
            "--node-guard-prober-service-account=rg-prober",
            "--node-guard-prober-selector=app=prober",
            "--node-guard-prober-namespace=",
        ]);
        let policy = node_guard_policy(&blank_ns, Some("ns")).unwrap().unwrap();
        assert_eq!(policy.prober_namespace, "ns");
        for bad_ns in ["Probers", "rg_probers", "-rg", "rg/probers"] {
            let flag = format!("--node-guard-prober-namespace={bad_ns}");
            let bad = cli(&[
                "--node-guard-prober-service-account=rg-prober",
                "--node-guard-prober-selector=app=prober",
                &flag,
            ]);
            let e = node_guard_policy(&bad, Some("ns")).unwrap_err();
            assert!(
                e.to_string().contains("--node-guard-prober-namespace"),
                "{e}"
            );
        }

        let no_groups = cli(&[
            "--node-guard-prober-service-account=rg-prober",
            "--node-guard-prober-selector=app=prober",
            "--node-guard-allowed-groups=",
        ]);
        let policy = node_guard_policy(&no_groups, Some("ns")).unwrap().unwrap();
        assert!(policy.allowed_groups.is_empty());
        let blank = cli(&[
            "--node-guard-prober-service-account=rg-prober",
            "--node-guard-prober-selector= ",
        ]);
        let e = node_guard_policy(&blank, Some("ns")).unwrap_err();
        assert!(
            e.to_string().contains("--node-guard-prober-selector"),
            "{e}"
        );
        // The selector alone, or the guard in standalone mode, is a usage error.
        let bad = |args: &[&str]| {
            let mut all = vec!["railguard-webhook", "--tls-cert", "c", "--tls-key", "k"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all).is_err()
        };
        assert!(bad(&["--node-guard-prober-selector=app=prober"]));
        assert!(bad(&["--node-guard-prober-namespace=rg-probers"]));
        assert!(bad(&[
            "--profiles=p.yaml",
            "--node-guard-prober-service-account=sa",
            "--node-guard-prober-selector=app=prober",
        ]));
    }

    #[test]
    fn zero_intervals_become_one_second() {
        let opts = serve_options(&cli(&[
            "--request-timeout-seconds",
            "0",
            "--cert-poll-seconds",
            "0",
        ]));
        assert_eq!(opts.request_timeout, Duration::from_secs(1));
        assert_eq!(opts.cert_poll_interval, Duration::from_secs(1));
        let opts = serve_options(&cli(&[
            "--header-read-timeout-seconds",
            "3",
            "--max-connections",
            "7",
            "--max-concurrent-requests",
            "0",
        ]));
        assert_eq!(opts.connections.header_read_timeout, Duration::from_secs(3));
        assert_eq!(opts.connections.max_connections, 7);
        assert_eq!(opts.max_in_flight, 1);
    }

    #[test]
    fn a_tls_failure_names_the_flag_of_its_file() {
        let (cert, key) = (PathBuf::from("/t/tls.crt"), PathBuf::from("/t/tls.key"));
        let no_key = TlsError::NoKey { path: key.clone() };
        assert!(tls_error(&no_key, &cert, &key)
            .to_string()
            .contains("--tls-key"));
        let no_cert = TlsError::NoCertificate { path: cert.clone() };
        assert!(tls_error(&no_cert, &cert, &key)
            .to_string()
            .contains("--tls-cert"));
    }
}
