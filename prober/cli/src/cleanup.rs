//! `railguard-prober cleanup`: takes off the Nodes what railguard put there, and deletes the
//! fleet controller's DeviceTaintRules: the chart's `post-delete` hook, so `helm uninstall`
//! leaves no railguard taint or rule behind. What each Node loses is
//! `railguard_fleet::cleanup::node_cleanup`; this adapts the cluster to it.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueHint};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, DynamicObject, ListParams};
use kube::{Api, Client};
use railguard_api::{dra, keys};
use railguard_fleet::cleanup::node_cleanup;
use railguard_kube::node_writer::{NodeWriter, OnConflict, Written};

use crate::Outcome;

/// Field manager of the clean-up's writes.
const FIELD_MANAGER: &str = "railguard-cleanup";
/// Tries per Node: a write refused because the Node changed is planned again from it.
const ATTEMPTS: u32 = 5;

#[derive(Args, Debug)]
pub struct CleanupArgs {
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "RAILGUARD_KUBECONFIG", value_hint = ValueHint::FilePath)]
    pub kubeconfig: Option<PathBuf>,
    /// Keep railguard's node labels (`railguard.io/fabric`, `profile`, `signature`,
    /// `simulated`) and conditions (`RailguardFabricReady`, `RailguardFleetOutlier`); the
    /// taint and the DeviceTaintRules go regardless (the chart's
    /// `cleanup.keepNodeState`).
    #[arg(long, env = "RAILGUARD_KEEP_NODE_STATE", default_value_t = false, action = clap::ArgAction::Set)]
    pub keep_node_state: bool,
}

impl CleanupArgs {
    pub async fn run(self) -> anyhow::Result<Outcome> {
        let client = crate::cluster_client(self.kubeconfig.as_deref()).await?;
        let nodes: Api<Node> = Api::all(client.clone());
        let writer = NodeWriter::new(client.clone(), FIELD_MANAGER);
        let list = nodes
            .list(&ListParams::default())
            .await
            .context("cannot list Nodes")?;
        let mut cleaned = 0usize;
        for node in list.items {
            let name = node.metadata.name.clone().unwrap_or_default();
            if clean_node(&writer, node, self.keep_node_state).await? {
                cleaned += 1;
                tracing::info!(node = %name, keep_node_state = self.keep_node_state, "node cleaned");
            }
        }
        let rules = delete_rules(&client).await?;
        let text = format!(
            "{cleaned} node(s) cleaned ({}), {rules}",
            if self.keep_node_state {
                "taint; labels and conditions kept"
            } else {
                "taint, labels, conditions"
            }
        );
        tracing::info!(nodes = cleaned, "clean-up done");
        Ok(Outcome::pass(text))
    }
}

/// Cleans one Node; whether it needed anything. A write refused because the Node changed
/// (its resourceVersion) is planned again from a fresh read.
async fn clean_node(writer: &NodeWriter, mut node: Node, keep: bool) -> anyhow::Result<bool> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut wrote = false;
    for attempt in 1..=ATTEMPTS {
        let plan = node_cleanup(&node, keep);
        if plan.is_empty() {
            return Ok(wrote);
        }
        if let Some(status) = plan.status {
            // Removing railguard's own conditions, whatever else changed.
            writer
                .patch_status(&name, status, &OnConflict::LastWriterWins)
                .await
                .with_context(|| {
                    format!("cannot remove railguard's conditions from node {name}")
                })?;
            wrote = true;
        }
        if let Some(patch) = plan.node {
            // The taint list is written whole: planned on this read, or planned again.
            let precondition = OnConflict::Precondition(node.metadata.resource_version.clone());
            match writer.merge(&name, patch, &precondition).await {
                Ok(Written::Done(_)) => return Ok(true),
                Ok(Written::Conflict) if attempt < ATTEMPTS => {
                    tracing::info!(node = %name, attempt, "node changed meanwhile; planning again");
                }
                Ok(Written::Conflict) => {
                    anyhow::bail!("node {name} kept changing while railguard's marks were removed ({ATTEMPTS} attempts)")
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "cannot remove the {} taint or railguard's labels from node {name}",
                            keys::TAINT_FABRIC_UNHEALTHY
                        )
                    })
                }
            }
        } else {
            return Ok(true);
        }
        node = writer
            .get(&name)
            .await
            .with_context(|| format!("cannot read node {name}"))?;
    }
    Ok(wrote)
}

/// Deletes the fleet controller's DeviceTaintRules (labelled
/// `app.kubernetes.io/managed-by=railguard-fleet`) where the server serves them.
async fn delete_rules(client: &Client) -> anyhow::Result<String> {
    match client.list_api_group_resources(dra::API_VERSION).await {
        Ok(list) if list.resources.iter().any(|r| r.name == "devicetaintrules") => {}
        Ok(_) => return Ok("no DeviceTaintRules served".into()),
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok("no DeviceTaintRules served".into()),
        Err(e) => {
            return Err(e).context("cannot read the API server's resource.k8s.io/v1 resources")
        }
    }
    let api = Api::<DynamicObject>::all_with(
        client.clone(),
        &crate::fleet::dra::resource("DeviceTaintRule"),
    );
    let ours =
        ListParams::default().labels(&format!("{}={}", dra::LABEL_MANAGED_BY, dra::MANAGED_BY));
    let names: Vec<String> = api
        .list_metadata(&ours)
        .await
        .context("cannot list railguard's DeviceTaintRules")?
        .items
        .into_iter()
        .filter_map(|r| r.metadata.name)
        .collect();
    for name in &names {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(rule = %name, "device taint rule deleted"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(e).with_context(|| format!("cannot delete DeviceTaintRule {name}"))
            }
        }
    }
    Ok(format!("{} DeviceTaintRule(s) deleted", names.len()))
}
