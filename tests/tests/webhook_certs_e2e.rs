//! End-to-end: the webhook's self-managed certificates against a real kube-apiserver. The
//! provisioning pass runs in-process; assertions are on the stored Secret, the written
//! files and the MutatingWebhookConfiguration's caBundles.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: a failed setup fails the test loudly

use railguard_kube::secret_fill::secret_data;
use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use railguard_tests::ControlPlane;
use railguard_webhook_cli::cert_sync::{self, SecretAction, SelfSignedOptions};
use railguard_webhook_cli::certs::{self, time, CertSpec, SecretDecision};
use rustls::pki_types::CertificateDer;
use serde_json::json;

fn certs_in(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    certs::certificates_in(pem)
}

async fn bundles(api: &Api<MutatingWebhookConfiguration>, name: &str) -> Vec<Vec<u8>> {
    api.get(name)
        .await
        .expect("get config")
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|w| w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default())
        .collect()
}

/// A control plane (TLS through ring) with namespace `ns`; its admin client.
async fn cluster_with_namespace(ns: &str) -> (ControlPlane, kube::Client) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client();
    cp.create_namespace(ns, &BTreeMap::new())
        .await
        .expect("namespace");
    (cp, client)
}

/// Creates the webhook configuration `config`; the API of such configurations.
async fn create_config(
    client: &kube::Client,
    config: &MutatingWebhookConfiguration,
) -> Api<MutatingWebhookConfiguration> {
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    configs
        .create(&PostParams::default(), config)
        .await
        .expect("create config");
    configs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_managed_certificates_provision_noop_and_rotate() {
    let ns = "railguard-certs";
    let (_cp, client) = cluster_with_namespace(ns).await;

    // Two entries with empty caBundles; they match no pod (failurePolicy Ignore, selector).
    let hook = |name: &str| {
        json!({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "clientConfig": {"service": {"name": "railguard-webhook", "namespace": ns, "path": "/mutate"}},
            "objectSelector": {"matchLabels": {"railguard-certs-e2e": "never"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
        })
    };
    let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "railguard-certs-e2e"},
        "webhooks": [hook("pods.railguard.io"), hook("pods-again.railguard.io")],
    }))
    .expect("config");
    let configs = create_config(&client, &config).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let spec = CertSpec::new("railguard-webhook", ns, 365, 30).expect("spec");
    let opts = SelfSignedOptions {
        secret_name: "railguard-webhook-tls".into(),
        namespace: ns.into(),
        webhook_config_name: "railguard-certs-e2e".into(),
        validating_webhook_config_name: None,
        spec: spec.clone(),
        tls_cert: dir.path().join("tls/tls.crt"),
        tls_key: dir.path().join("tls/tls.key"),
    };
    let now = time::OffsetDateTime::now_utc();

    // First pass: no Secret yet.
    let first = cert_sync::sync_once(&client, &opts, now)
        .await
        .expect("first pass");
    assert!(
        matches!(first.secret, SecretAction::Issued { .. }),
        "{first:?}"
    );
    assert_eq!(first.bundles_patched, 2);
    assert!(first.files_written);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let stored = secrets.get("railguard-webhook-tls").await.expect("secret");
    let data = secret_data(&stored);
    let material = match certs::assess_secret(Some(&data), &spec, now) {
        SecretDecision::Keep { material, .. } => material,
        other => panic!("stored secret not valid: {other:?}"),
    };
    assert_eq!(
        std::fs::read(&opts.tls_cert).expect("cert file"),
        material.tls_crt.as_bytes()
    );
    assert_eq!(
        std::fs::read(&opts.tls_key).expect("key file"),
        material.tls_key.as_bytes()
    );
    // The written pair loads as a serving config (what the reloader does).
    railguard_webhook_cli::tls::load_server_config(&opts.tls_cert, &opts.tls_key)
        .expect("pair loads");
    let ca1 = certs_in(material.ca_crt.as_bytes());
    for bundle in bundles(&configs, "railguard-certs-e2e").await {
        assert_eq!(certs_in(&bundle), ca1);
    }

    // Second pass: nothing to do, nothing written.
    let rv = stored.metadata.resource_version.clone();
    let second = cert_sync::sync_once(&client, &opts, now)
        .await
        .expect("second pass");
    assert_eq!(second.secret, SecretAction::Kept);
    assert_eq!(second.bundles_patched, 0);
    assert!(!second.files_written);
    let again = secrets.get("railguard-webhook-tls").await.expect("secret");
    assert_eq!(again.metadata.resource_version, rv);

    // Inside the rotation window: new material, both CAs trusted, new files.
    let later = now + time::Duration::days(340);
    let third = cert_sync::sync_once(&client, &opts, later)
        .await
        .expect("rotation pass");
    assert!(
        matches!(third.secret, SecretAction::Issued { .. }),
        "{third:?}"
    );
    assert_eq!(third.bundles_patched, 2);
    assert!(third.files_written);
    let rotated = secret_data(&secrets.get("railguard-webhook-tls").await.expect("secret"));
    assert_ne!(rotated, data);
    let ca2 = certs_in(&rotated["ca.crt"]);
    assert_ne!(ca2, ca1);
    for bundle in bundles(&configs, "railguard-certs-e2e").await {
        let trusted = certs_in(&bundle);
        assert_eq!(trusted.len(), 2);
        assert_eq!(trusted[0], ca2[0]);
        assert_eq!(trusted[1], ca1[0]);
    }
    assert_eq!(
        std::fs::read(&opts.tls_cert).expect("cert file"),
        rotated["tls.crt"]
    );

    // A replica that lost the race (stale files) adopts the stored material without writing.
    std::fs::write(&opts.tls_cert, b"stale").expect("stale");
    let fourth = cert_sync::sync_once(&client, &opts, later)
        .await
        .expect("adopt pass");
    assert_eq!(fourth.secret, SecretAction::Kept);
    assert_eq!(fourth.bundles_patched, 0);
    assert!(fourth.files_written);
    assert!(!fourth.webhook_config_missing);
    assert_eq!(
        std::fs::read(&opts.tls_cert).expect("cert file"),
        rotated["tls.crt"]
    );

    // A webhook started before its MutatingWebhookConfiguration exists (an install applies
    // it after the Deployment): the pass succeeds, says so, and serves the stored pair.
    let early = SelfSignedOptions {
        webhook_config_name: "railguard-certs-e2e-not-yet".into(),
        validating_webhook_config_name: None,
        ..opts.clone()
    };
    let fifth = cert_sync::sync_once(&client, &early, later)
        .await
        .expect("a missing configuration is not an error");
    assert!(fifth.webhook_config_missing, "{fifth:?}");
    assert_eq!(fifth.bundles_patched, 0);
    assert_eq!(fifth.secret, SecretAction::Kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_replicas_agree_on_one_secret() {
    let ns = "railguard-race";
    let (_cp, client) = cluster_with_namespace(ns).await;
    let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "railguard-race"},
        "webhooks": [{
            "name": "pods.railguard.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Ignore",
            "clientConfig": {"service": {"name": "railguard-webhook", "namespace": ns}},
            "objectSelector": {"matchLabels": {"railguard-certs-e2e": "never"}},
        }],
    }))
    .expect("config");
    let configs = create_config(&client, &config).await;
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let opts: Vec<SelfSignedOptions> = dirs
        .iter()
        .map(|d| SelfSignedOptions {
            secret_name: "railguard-webhook-tls".into(),
            namespace: ns.into(),
            webhook_config_name: "railguard-race".into(),
            validating_webhook_config_name: None,
            spec: CertSpec::new("railguard-webhook", ns, 365, 30).expect("spec"),
            tls_cert: d.path().join("tls.crt"),
            tls_key: d.path().join("tls.key"),
        })
        .collect();
    let now = time::OffsetDateTime::now_utc();
    let (a, b) = tokio::join!(
        cert_sync::sync_once(&client, &opts[0], now),
        cert_sync::sync_once(&client, &opts[1], now)
    );
    a.expect("replica a");
    b.expect("replica b");
    // Whoever won, the loser adopted the winner's pair in the same pass.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let stored = secret_data(&secrets.get("railguard-webhook-tls").await.expect("secret"));
    for o in &opts {
        assert_eq!(std::fs::read(&o.tls_cert).expect("cert"), stored["tls.crt"]);
    }
    let trusted = certs_in(&bundles(&configs, "railguard-race").await[0]);
    assert_eq!(trusted[0], certs_in(&stored["ca.crt"])[0]);
}
