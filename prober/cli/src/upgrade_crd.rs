//! `railguard-prober upgrade-crd`: brings the cluster's FabricProfile CRD to this release's
//! schema, the chart's `pre-install,pre-upgrade` hook (why a hook: `railguard_api::crd`).
//! The decision is `railguard_api::crd_upgrade_step`; this adapts the cluster to it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueHint};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use railguard_api::crd::{ANNOTATION_CRD_VERSION, CRD_VERSION};
use railguard_api::{crd_upgrade_step, fabric_profile_crd, CrdUpgradeStep};

use crate::Outcome;

/// The field manager of the hook's apply; it owns the whole schema, so a later release's
/// apply replaces it and a field a user added by hand is taken over (`force`).
const FIELD_MANAGER: &str = "railguard-upgrade-crd";

#[derive(Args, Debug)]
pub struct UpgradeCrdArgs {
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "RAILGUARD_KUBECONFIG", value_hint = ValueHint::FilePath)]
    pub kubeconfig: Option<PathBuf>,
    /// Wait this long, seconds, for the API server to serve the applied schema
    /// (condition Established) before Helm goes on to the chart's profiles.
    #[arg(long, env = "RAILGUARD_UPGRADE_CRD_TIMEOUT_SECS", default_value_t = 60)]
    pub timeout_secs: u64,
}

impl UpgradeCrdArgs {
    pub async fn run(self) -> anyhow::Result<Outcome> {
        let client = crate::cluster_client(self.kubeconfig.as_deref()).await?;
        let crds: Api<CustomResourceDefinition> = Api::all(client);
        let ours = fabric_profile_crd();
        let name = ours.metadata.name.clone().unwrap_or_default();
        let live = crds
            .get_opt(&name)
            .await
            .with_context(|| format!("reading CustomResourceDefinition {name}"))?;
        let annotation = live.as_ref().map(|crd| {
            crd.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_CRD_VERSION))
                .map(String::as_str)
        });
        let step = crd_upgrade_step(annotation, CRD_VERSION)
            .with_context(|| format!("CustomResourceDefinition {name}"))?;
        let text = match &step {
            CrdUpgradeStep::Create => {
                crds.create(&PostParams::default(), &ours)
                    .await
                    .with_context(|| format!("creating CustomResourceDefinition {name}"))?;
                format!("{name}: created at {CRD_VERSION}")
            }
            CrdUpgradeStep::Apply { from } => {
                let params = PatchParams::apply(FIELD_MANAGER).force();
                crds.patch(&name, &params, &Patch::Apply(&ours))
                    .await
                    .with_context(|| format!("applying CustomResourceDefinition {name}"))?;
                format!(
                    "{name}: applied {CRD_VERSION} over {}",
                    from.as_deref()
                        .unwrap_or("an unversioned schema (before 0.2.0)")
                )
            }
            CrdUpgradeStep::KeepNewer { found } => {
                tracing::warn!(crd = %name, found = %found, ours = CRD_VERSION, "cluster has a newer railguard CRD; left unchanged");
                return Ok(Outcome::pass(format!(
                    "{name}: kept {found}, newer than this release ({CRD_VERSION})"
                )));
            }
        };
        wait_established(&crds, &name, Duration::from_secs(self.timeout_secs)).await?;
        tracing::info!(crd = %name, version = CRD_VERSION, step = ?step, "FabricProfile CRD is current");
        Ok(Outcome::pass(text))
    }
}

/// Until the API server reports the CRD `Established` (its schema served).
async fn wait_established(
    crds: &Api<CustomResourceDefinition>,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let crd = crds
            .get(name)
            .await
            .with_context(|| format!("reading {name}"))?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("{name} is not Established after {}s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
