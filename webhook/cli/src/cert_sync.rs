//! Self-managed certificates, the IO shell: reads the Secret, asks [`crate::certs`] what to
//! do, writes the Secret (optimistic concurrency: the loser of a race between replicas
//! adopts the winner's material), patches every caBundle of the MutatingWebhookConfiguration
//! (and of the node guard's ValidatingWebhookConfiguration, when there is one) and writes the
//! serving pair to the files [`crate::tls::CertReloader`] watches.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use time::OffsetDateTime;

use crate::certs::{self, CertMaterial, CertSpec, RenewReason, SecretDecision};
use crate::error::CertSyncError;

pub const FIELD_MANAGER: &str = "railguard-webhook";

/// Where the material lives and who trusts it.
#[derive(Clone, Debug)]
pub struct SelfSignedOptions {
    pub secret_name: String,
    pub namespace: String,
    pub webhook_config_name: String,
    /// The node guard's ValidatingWebhookConfiguration, trusting the same CA; None when the
    /// guard is not installed.
    pub validating_webhook_config_name: Option<String>,
    pub spec: CertSpec,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
}

/// What happened to the Secret in one pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretAction {
    Kept,
    /// This replica wrote new material.
    Issued {
        reason: String,
    },
    /// Another replica wrote first; its material is used.
    AdoptedWinner,
}

/// The outcome of one pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncReport {
    pub secret: SecretAction,
    /// Webhook entries whose caBundle was changed (both configurations).
    pub bundles_patched: usize,
    /// The MutatingWebhookConfiguration, or the ValidatingWebhookConfiguration named in the
    /// options, does not exist (yet: an install applies them after the Deployment); the pass
    /// is repeated soon.
    pub webhook_config_missing: bool,
    pub files_written: bool,
    /// When the material enters its rotation window.
    pub renew_at: Option<OffsetDateTime>,
}

/// One pass: Secret, then caBundle, then files — so the new CA is trusted before the new
/// pair is served (the old CA stays in the bundle for replicas not yet switched).
pub async fn sync_once(
    client: &Client,
    opts: &SelfSignedOptions,
    now: OffsetDateTime,
) -> Result<SyncReport, CertSyncError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &opts.namespace);
    let (material, previous_ca, action) = settle_secret(&secrets, opts, now).await?;
    let ca = CaUpdate {
        material: &material,
        previous_ca: previous_ca.as_deref(),
        now,
    };
    let mutating = patch_ca_bundles(
        Api::<MutatingWebhookConfiguration>::all(client.clone()),
        &opts.webhook_config_name,
        &ca,
    )
    .await?;
    let validating = match &opts.validating_webhook_config_name {
        Some(name) => {
            patch_ca_bundles(
                Api::<ValidatingWebhookConfiguration>::all(client.clone()),
                name,
                &ca,
            )
            .await?
        }
        None => Some(0),
    };
    let webhook_config_missing = mutating.is_none() || validating.is_none();
    let files_written = write_files_if_stale(opts, &material)?;
    let renew_at = match certs::assess_secret(Some(&bytes_map(&material)), &opts.spec, now) {
        SecretDecision::Keep { renew_at, .. } => Some(renew_at),
        SecretDecision::Renew { .. } => None,
    };
    Ok(SyncReport {
        secret: action,
        bundles_patched: mutating.unwrap_or(0) + validating.unwrap_or(0),
        webhook_config_missing,
        files_written,
        renew_at,
    })
}

/// Repeats [`sync_once`] until `stop` changes: the first pass after `first` (soon, when the
/// pass at start-up found no MutatingWebhookConfiguration to trust the CA), then every
/// `interval`. Failures are logged and retried soon (the pair in service keeps serving).
pub async fn run_after(
    client: Client,
    opts: SelfSignedOptions,
    first: Duration,
    interval: Duration,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) {
    let mut wait = first;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        wait = match sync_once(&client, &opts, OffsetDateTime::now_utc()).await {
            Ok(report) => {
                log_report(&opts, &report);
                if report.webhook_config_missing {
                    interval.min(RETRY_INTERVAL)
                } else {
                    interval
                }
            }
            Err(e) => {
                tracing::warn!(
                    secret = %opts.secret_name,
                    error = %railguard_api::error::error_chain(&e),
                    "self-managed certificate pass failed; retrying soon"
                );
                interval.min(RETRY_INTERVAL)
            }
        };
    }
}

/// How soon a pass is repeated after a failure or a missing webhook configuration: until
/// then the API server cannot verify the webhook.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(5);

pub fn log_report(opts: &SelfSignedOptions, report: &SyncReport) {
    if report.webhook_config_missing {
        tracing::warn!(
            secret = %opts.secret_name,
            webhook_config = %opts.webhook_config_name,
            validating_webhook_config = opts.validating_webhook_config_name.as_deref().unwrap_or(""),
            "webhook configuration not found: its caBundle cannot trust the CA yet; retrying"
        );
    }
    if report.secret == SecretAction::Kept && report.bundles_patched == 0 && !report.files_written {
        tracing::debug!(secret = %opts.secret_name, "self-managed certificate unchanged");
        return;
    }
    tracing::info!(
        secret = %opts.secret_name,
        action = ?report.secret,
        bundles_patched = report.bundles_patched,
        files_written = report.files_written,
        renew_at = ?report.renew_at,
        "self-managed certificate synced"
    );
}

async fn settle_secret(
    secrets: &Api<Secret>,
    opts: &SelfSignedOptions,
    now: OffsetDateTime,
) -> Result<(CertMaterial, Option<String>, SecretAction), CertSyncError> {
    let err = |action: &'static str| {
        let (namespace, name) = (opts.namespace.clone(), opts.secret_name.clone());
        move |source: kube::Error| CertSyncError::Secret {
            action,
            namespace,
            name,
            source: Box::new(source),
        }
    };
    // A few rounds: a conflict means someone else wrote; the next read sees their material.
    for round in 0..4 {
        let current = secrets
            .get_opt(&opts.secret_name)
            .await
            .map_err(err("read"))?;
        let data = current
            .as_ref()
            .map(railguard_kube::secret_fill::secret_data);
        let (reason, previous_ca) = match certs::assess_secret(data.as_ref(), &opts.spec, now) {
            SecretDecision::Keep { material, .. } => {
                let action = if round == 0 {
                    SecretAction::Kept
                } else {
                    SecretAction::AdoptedWinner
                };
                return Ok((material, None, action));
            }
            SecretDecision::Renew {
                reason,
                previous_ca,
            } => (reason, previous_ca),
        };
        if round > 0 {
            // The winner's material is itself unusable: renew again, once more at most.
            tracing::warn!(%reason, "secret written by another replica is not usable");
        }
        let material = certs::issue(&opts.spec, now)?;
        let string_map = material.to_secret_data();
        let data: BTreeMap<String, ByteString> = string_map
            .into_iter()
            .map(|(k, v)| (k, ByteString(v.into_bytes())))
            .collect();
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        // Keys the webhook does not own stay; a concurrent write fails the replace with 409.
        let mut merged = current
            .as_ref()
            .and_then(|s| s.data.clone())
            .unwrap_or_default();
        merged.extend(data);
        let written = railguard_kube::secret_fill::write_data(
            secrets,
            &pp,
            &opts.namespace,
            &opts.secret_name,
            current,
            merged,
        )
        .await;
        match written {
            Ok(_) => {
                return Ok((
                    material,
                    previous_ca,
                    SecretAction::Issued {
                        reason: render(&reason),
                    },
                ))
            }
            Err(kube::Error::Api(status)) if status.is_conflict() || status.is_already_exists() => {
                tracing::info!(secret = %opts.secret_name, "another replica wrote the secret first; re-reading");
                continue;
            }
            Err(e) => return Err(err("write")(e)),
        }
    }
    Err(CertSyncError::Contended {
        namespace: opts.namespace.clone(),
        name: opts.secret_name.clone(),
    })
}

fn render(reason: &RenewReason) -> String {
    reason.to_string()
}

/// The CA to trust, and the one it replaces (kept in the bundles during a rotation).
struct CaUpdate<'a> {
    material: &'a CertMaterial,
    previous_ca: Option<&'a str>,
    now: OffsetDateTime,
}

/// `(entry name, caBundle)` of every webhook entry of a configuration.
/// A webhook configuration whose entries carry a caBundle: its kind, and each entry's name
/// with the bundle it trusts now.
trait CaBundles {
    const KIND: &'static str;
    fn bundles(&self) -> Vec<(String, Vec<u8>)>;
}

impl CaBundles for MutatingWebhookConfiguration {
    const KIND: &'static str = "MutatingWebhookConfiguration";
    fn bundles(&self) -> Vec<(String, Vec<u8>)> {
        let hooks = self.webhooks.iter().flatten();
        bundles_of(hooks.map(|w| (&w.name, &w.client_config)))
    }
}

impl CaBundles for ValidatingWebhookConfiguration {
    const KIND: &'static str = "ValidatingWebhookConfiguration";
    fn bundles(&self) -> Vec<(String, Vec<u8>)> {
        let hooks = self.webhooks.iter().flatten();
        bundles_of(hooks.map(|w| (&w.name, &w.client_config)))
    }
}

fn bundles_of<'a>(
    hooks: impl Iterator<Item = (&'a String, &'a WebhookClientConfig)>,
) -> Vec<(String, Vec<u8>)> {
    hooks
        .map(|(name, client_config)| {
            let bundle = client_config.ca_bundle.as_ref().map(|b| b.0.clone());
            (name.clone(), bundle.unwrap_or_default())
        })
        .collect()
}

/// Patches the caBundle of every entry of configuration `name` that does not trust the CA
/// yet; the number patched, None when the configuration does not exist.
async fn patch_ca_bundles<K>(
    api: Api<K>,
    name: &str,
    ca: &CaUpdate<'_>,
) -> Result<Option<usize>, CertSyncError>
where
    K: CaBundles
        + kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    use base64::Engine as _;
    let err = |action: &'static str| {
        let name = name.to_string();
        move |source: kube::Error| CertSyncError::WebhookConfig {
            action,
            kind: K::KIND,
            name,
            source: Box::new(source),
        }
    };
    let Some(config) = api.get_opt(name).await.map_err(err("read"))? else {
        return Ok(None);
    };
    let mut ops = Vec::new();
    for (i, (hook, existing)) in config.bundles().iter().enumerate() {
        if let Some(bundle) =
            certs::ca_bundle_update(&ca.material.ca_crt, ca.previous_ca, existing, ca.now)
        {
            // The test pins the index to the entry we looked at, in case the list changed.
            ops.push(serde_json::json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": hook}));
            ops.push(serde_json::json!({
                "op": "add",
                "path": format!("/webhooks/{i}/clientConfig/caBundle"),
                "value": base64::engine::general_purpose::STANDARD.encode(bundle.as_bytes()),
            }));
        }
    }
    if ops.is_empty() {
        return Ok(Some(0));
    }
    let patched = ops.len() / 2;
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|e| err("build a patch for")(kube::Error::SerdeError(e)))?;
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    api.patch(name, &pp, &Patch::Json::<()>(patch))
        .await
        .map_err(err("patch the caBundle of"))?;
    Ok(Some(patched))
}

fn write_files_if_stale(
    opts: &SelfSignedOptions,
    material: &CertMaterial,
) -> Result<bool, CertSyncError> {
    let cert = std::fs::read(&opts.tls_cert).ok();
    let key = std::fs::read(&opts.tls_key).ok();
    if !certs::files_stale(cert.as_deref(), key.as_deref(), material) {
        return Ok(false);
    }
    // Key first: the reloader rejects a half-switched pair and picks up the whole one later.
    write_atomic(&opts.tls_key, material.tls_key.as_bytes(), 0o600)?;
    write_atomic(&opts.tls_cert, material.tls_crt.as_bytes(), 0o644)?;
    Ok(true)
}

/// [`railguard_runtime::write_atomic`]: readers never see half a PEM.
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertSyncError> {
    railguard_runtime::write_atomic(path, contents, mode).map_err(|source| CertSyncError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn bytes_map(material: &CertMaterial) -> BTreeMap<String, Vec<u8>> {
    material
        .to_secret_data()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect()
}
