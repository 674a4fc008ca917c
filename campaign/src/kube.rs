//! The thin Kubernetes shell of a campaign: the profile's nodes and their endpoints, GPU pods
//! on a node, writing findings into certificates by server-side apply, and the Lease that
//! makes one coordinator the leader (and stops its writes the moment it is not).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::Client;
use railguard_api::{keys, Certificate, FabricProfile, Verdict};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use railguard_kube::lease::LeaderLease;

use super::CampaignError;
use railguard_api::campaign_findings::NodeFindings;
use railguard_api::campaign_findings::{campaign_fabric_label, merge_findings};
use railguard_api::error::error_chain;
use railguard_kube::node_writer::{
    after_conflict, NodeWriter, OnConflict, Written, WRITE_ATTEMPTS,
};
use railguard_prober::publish::write_condition;

/// The log of an MPIJob's launcher once it finished, and how it finished.
#[derive(Debug, Clone, PartialEq)]
pub struct LauncherLog {
    pub pod: String,
    pub state: super::mpijob::LauncherState,
    pub log: String,
}

/// Waits (polling every `poll`, at most `timeout`) for the launcher pod of MPIJob
/// `namespace/job_name` to finish, then reads its log through the API.
pub async fn collect_launcher_log(
    client: &Client,
    namespace: &str,
    job_name: &str,
    timeout: std::time::Duration,
    poll: std::time::Duration,
) -> Result<LauncherLog, CampaignError> {
    use super::mpijob::{launcher_selector, launcher_state, LauncherState};
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let lp = ListParams::default().labels(&launcher_selector(job_name));
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let list = pods.list(&lp).await.map_err(|source| CampaignError::Kube {
            what: format!("list the launcher pod of MPIJob {namespace}/{job_name}"),
            source,
        })?;
        if let Some((pod, state)) = launcher_state(&list.items) {
            if state != LauncherState::Waiting {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let log = pods
                    .logs(&name, &kube::api::LogParams::default())
                    .await
                    .map_err(|source| CampaignError::Kube {
                        what: format!("read the log of launcher pod {namespace}/{name}"),
                        source,
                    })?;
                return Ok(LauncherLog {
                    pod: name,
                    state,
                    log,
                });
            }
        }
        if tokio::time::Instant::now() + poll > deadline {
            return Err(CampaignError::Timeout {
                peer: format!("launcher of MPIJob {namespace}/{job_name}"),
                after_ms: timeout.as_millis() as u64,
            });
        }
        tokio::time::sleep(poll).await;
    }
}

/// Node annotation: `host:port` of the node's peer endpoint, when it is not the node's
/// InternalIP and the default port.
pub const ANNOTATION_PEER_ENDPOINT: &str = "railguard.io/peer-endpoint";

/// Where GPU pods on a node are looked up.
#[derive(Clone)]
pub enum GpuPodSource {
    /// No pod information (a simulated node outside a cluster): never blocks a test.
    Unchecked,
    /// Pods bound to `node` in the API that request one of `resources`.
    Kube {
        client: Client,
        node: String,
        resources: Vec<String>,
    },
}

impl GpuPodSource {
    /// `namespace/name` of the running or pending GPU pods on the node.
    pub async fn gpu_pods(&self) -> Result<Vec<String>, CampaignError> {
        match self {
            GpuPodSource::Unchecked => Ok(Vec::new()),
            GpuPodSource::Kube {
                client,
                node,
                resources,
            } => {
                let pods: Api<Pod> = Api::all(client.clone());
                let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
                let list = pods.list(&lp).await.map_err(|source| CampaignError::Kube {
                    what: format!("list pods on node {node}"),
                    source,
                })?;
                Ok(gpu_pods_of(&list.items, resources))
            }
        }
    }
}

/// `namespace/name` of the pods among `pods` that hold one of `resources` or a DRA claim
/// ([`railguard_api::pod::holds_devices`]): an invasive test would disturb them.
pub fn gpu_pods_of(pods: &[Pod], resources: &[String]) -> Vec<String> {
    pods.iter()
        .filter(|p| railguard_api::pod::holds_devices(p, resources))
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or("default"),
                p.metadata.name.as_deref().unwrap_or("?")
            )
        })
        .collect()
}

/// The endpoint of a node: its annotation, else its InternalIP with `default_port`.
pub fn endpoint_of(node: &Node, default_port: u16) -> Option<String> {
    if let Some(a) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_PEER_ENDPOINT))
    {
        return Some(a.trim().to_string());
    }
    let ip = node
        .status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")?;
    if ip.address.contains(':') {
        Some(format!("[{}]:{default_port}", ip.address))
    } else {
        Some(format!("{}:{default_port}", ip.address))
    }
}

/// Nodes matching the profile's node selector, sorted by name.
pub async fn profile_nodes(
    client: &Client,
    profile: &FabricProfile,
) -> Result<Vec<Node>, CampaignError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let selector: Vec<String> = profile
        .spec
        .node_selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let lp = if selector.is_empty() {
        ListParams::default().labels(&format!("{}={}", keys::LABEL_PROFILE, profile.name()))
    } else {
        ListParams::default().labels(&selector.join(","))
    };
    let mut list = nodes
        .list(&lp)
        .await
        .map_err(|source| CampaignError::Kube {
            what: "list nodes".into(),
            source,
        })?;
    list.items
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(list.items)
}

/// Writes one node's findings into its certificate: labels and annotation by server-side
/// apply (field manager `railguard-campaign`), optimistic on the resourceVersion of the Node
/// just read and retried on a conflict, so the prober's results written meanwhile are merged,
/// not overwritten ([`railguard_api::campaign_findings`]); then the `RailguardFabricReady` condition
/// through the status subresource. With `leader`, every write is made only after a fresh
/// proof that this coordinator still holds the lease ([`Leadership::confirm`]).
/// Returns the certificate as written, or `None` when the node has no certificate to update.
pub async fn write_findings(
    client: &Client,
    node_name: &str,
    findings: &NodeFindings,
    leader: Option<&Leadership>,
) -> Result<Option<Certificate>, CampaignError> {
    let writer = NodeWriter::new(client.clone(), keys::CAMPAIGN_FIELD_MANAGER);
    let confirm = || async {
        match leader {
            Some(l) => l.confirm().await,
            None => Ok(()),
        }
    };
    for attempt in 0..WRITE_ATTEMPTS {
        let node = writer
            .get(node_name)
            .await
            .map_err(|source| CampaignError::Kube {
                what: format!("get node {node_name}"),
                source,
            })?;
        let Some(parsed) = Certificate::of_annotations(node.metadata.annotations.as_ref()) else {
            warn!(node = %node_name, "node has no certificate; campaign results not written");
            return Ok(None);
        };
        let mut cert = parsed.map_err(|source| CampaignError::Certificate {
            node: node_name.to_string(),
            source,
        })?;
        let before = cert.clone();
        if let Err(e) = merge_findings(&mut cert, findings) {
            warn!(node = %node_name, error = %e, "cannot encode campaign findings; applied, not stored");
        }
        if cert == before {
            return Ok(Some(cert));
        }
        let annotation = cert
            .to_annotation()
            .map_err(|source| CampaignError::Certificate {
                node: node_name.to_string(),
                source,
            })?;
        let fabric = campaign_fabric_label(
            node.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(keys::LABEL_FABRIC))
                .map(String::as_str),
            &cert,
            jiff::Timestamp::now(),
        );
        let labels: BTreeMap<&str, &str> = BTreeMap::from([
            (keys::LABEL_FABRIC, fabric),
            (keys::LABEL_PROFILE, cert.profile.as_str()),
            (keys::LABEL_SIGNATURE, cert.signature.as_str()),
        ]);
        let annotations = BTreeMap::from([(keys::ANNOTATION_CERTIFICATE, annotation.as_str())]);
        // Merged onto the certificate as read: written on that read, or merged again.
        let precondition = OnConflict::Precondition(node.metadata.resource_version.clone());
        confirm().await?;
        let written = writer
            .apply_metadata(node_name, &labels, &annotations, &precondition)
            .await
            .map_err(|source| CampaignError::Kube {
                what: format!("apply certificate to node {node_name}"),
                source,
            })?;
        let Written::Done(written) = written else {
            warn!(node = %node_name, "certificate changed while writing; merging again");
            after_conflict(attempt).await;
            continue;
        };
        // A node pending under its prober keeps its pending condition too.
        if fabric != keys::fabric::PENDING {
            confirm().await?;
            let (status, reason, message) = campaign_condition(&cert);
            write_condition(&writer, *written, &annotation, (status, reason, &message))
                .await
                .map_err(|source| CampaignError::Kube {
                    what: format!("patch condition of node {node_name}"),
                    source,
                })?;
        }
        info!(node = %node_name, verdict = %cert.verdict, "campaign findings written");
        return Ok(Some(cert));
    }
    Err(CampaignError::Node {
        node: node_name.to_string(),
        reason: "certificate kept changing while writing campaign results".into(),
    })
}

/// Pure: the condition `(status, reason, message)` of a certificate the campaign wrote.
pub fn campaign_condition(cert: &Certificate) -> (&'static str, &'static str, String) {
    let status = if cert.verdict == Verdict::Certified {
        "True"
    } else {
        "False"
    };
    let message = if cert.reasons.is_empty() {
        format!("fabric {}", cert.verdict)
    } else {
        cert.reasons.join("; ")
    };
    let reason = match cert.verdict {
        Verdict::Certified => "Certified",
        Verdict::Degraded => "Degraded",
        Verdict::Failed => "CertificationFailed",
        Verdict::Pending => "Pending",
    };
    (status, reason, message)
}

/// A coordinator's leadership, proven before each write: the lease renewed within the renew
/// deadline ([`still_leader`]) and no other holder seen. Once lost it stays lost
/// ([`Leadership::lost`] is cancelled): the coordinator stops the campaign and writes nothing.
#[derive(Clone)]
pub struct Leadership {
    lease: LeaderLease,
    renew_deadline: Duration,
    last_renewed: Arc<Mutex<Instant>>,
    lost: CancellationToken,
    /// One renewal at a time: two at once (the renewal loop and a write's confirmation)
    /// would make one of them a conflict, read as another holder.
    renewing: Arc<tokio::sync::Mutex<()>>,
}

/// Pure: whether a coordinator whose last successful renewal began `since_renewed` ago may
/// still act as leader, with `renew_deadline` (less than the lease duration, so a write made
/// now lands before anyone else may take the lease).
pub fn still_leader(since_renewed: Duration, renew_deadline: Duration) -> bool {
    since_renewed < renew_deadline
}

/// The renew deadline of a lease of `duration_secs`: two thirds of it (client-go's 15 s
/// lease, 10 s deadline).
pub fn renew_deadline(duration_secs: i32) -> Duration {
    Duration::from_millis(u64::try_from(duration_secs.max(1)).unwrap_or(1) * 2000 / 3)
}

impl Leadership {
    /// Takes the lease: `Ok(None)` when another coordinator holds it.
    pub async fn acquire(lease: LeaderLease) -> Result<Option<Leadership>, CampaignError> {
        let started = Instant::now();
        if !take_lease(&lease, Timestamp::now()).await? {
            return Ok(None);
        }
        Ok(Some(Leadership {
            renew_deadline: renew_deadline(
                i32::try_from(lease.duration().as_secs()).unwrap_or(i32::MAX),
            ),
            lease,
            last_renewed: Arc::new(Mutex::new(started)),
            lost: CancellationToken::new(),
            renewing: Arc::new(tokio::sync::Mutex::new(())),
        }))
    }

    /// Cancelled once the lease is lost.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    fn since_renewed(&self) -> Duration {
        self.last_renewed
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or(Duration::MAX)
    }

    fn give_up(&self, reason: String) -> CampaignError {
        self.lost.cancel();
        warn!(lease = %self.lease.name(), reason = %reason, "lost the lease; stopping");
        CampaignError::LeaseLost {
            lease: self.lease.name().to_string(),
            reason,
        }
    }

    /// Renews the lease now: `Ok(())` only while this coordinator provably holds it (a
    /// renewal that succeeded now, or one within the renew deadline when this one errs).
    pub async fn confirm(&self) -> Result<(), CampaignError> {
        let _one = self.renewing.lock().await;
        if self.lost.is_cancelled() {
            return Err(CampaignError::LeaseLost {
                lease: self.lease.name().to_string(),
                reason: "lost earlier".into(),
            });
        }
        let started = Instant::now();
        match take_lease(&self.lease, Timestamp::now()).await {
            Ok(true) => {
                if let Ok(mut t) = self.last_renewed.lock() {
                    *t = started;
                }
                Ok(())
            }
            Ok(false) => Err(self.give_up("another coordinator holds it".into())),
            Err(e) if still_leader(self.since_renewed(), self.renew_deadline) => {
                warn!(error = %error_chain(&e), "cannot renew the lease; still within its renew deadline");
                Ok(())
            }
            Err(e) => Err(self.give_up(format!(
                "not renewed within the renew deadline ({} ms): {}",
                self.renew_deadline.as_millis(),
                error_chain(&e)
            ))),
        }
    }

    /// Keeps the lease while the campaign runs: renews every `period` until cancelled or lost.
    pub async fn keep(self, period: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.lost.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            if self.confirm().await.is_err() {
                return;
            }
        }
    }
}

/// One round on `lease` at `now` ([`LeaderLease::try_lead_at`]), its API error named.
pub async fn take_lease(lease: &LeaderLease, now: Timestamp) -> Result<bool, CampaignError> {
    lease
        .try_lead_at(now)
        .await
        .map_err(|source| CampaignError::Kube {
            what: format!("take lease {}", lease.name()),
            source,
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str, gpu: Option<&str>) -> Pod {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": phase},
        });
        if let Some(q) = gpu {
            v["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": q}});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn gpu_pods_are_named_namespace_slash_name() {
        // Which pods hold a GPU is railguard_api::pod::holds_gpu's (tested there).
        let pods = vec![
            pod("train", "Running", Some("8")),
            pod("cpu", "Running", None),
        ];
        let r = vec!["nvidia.com/gpu".to_string()];
        assert_eq!(gpu_pods_of(&pods, &r), vec!["ml/train"]);
    }

    #[test]
    fn endpoint_from_annotation_or_internal_ip() {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": "a"},
            "status": {"addresses": [{"type": "Hostname", "address": "a"}, {"type": "InternalIP", "address": "10.0.0.5"}]}
        }))
        .unwrap();
        assert_eq!(endpoint_of(&n, 7470).as_deref(), Some("10.0.0.5:7470"));
        n.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_PEER_ENDPOINT.to_string(),
            "127.0.0.3:9000".to_string(),
        )]));
        assert_eq!(endpoint_of(&n, 7470).as_deref(), Some("127.0.0.3:9000"));
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "b"}})).unwrap();
        assert_eq!(endpoint_of(&bare, 7470), None);
    }

    #[test]
    fn leadership_ends_at_the_renew_deadline() {
        let deadline = renew_deadline(60);
        assert_eq!(deadline, Duration::from_secs(40));
        assert_eq!(renew_deadline(0), Duration::from_millis(666));
        assert!(still_leader(Duration::from_secs(39), deadline));
        assert!(!still_leader(Duration::from_secs(40), deadline));
        assert!(!still_leader(Duration::MAX, deadline));
    }

    #[test]
    fn the_campaigns_condition_follows_the_merged_certificate() {
        let cert: Certificate = serde_json::from_value(json!({
            "version": 1, "generation": 2, "issuedAt": "2026-01-01T00:00:00Z",
            "expiresAt": "2026-01-02T00:00:00Z", "profile": "p", "signature": "s",
            "verdict": "degraded", "reasons": ["campaign: rail mlx5_4:1 slow"],
        }))
        .unwrap();
        assert_eq!(
            campaign_condition(&cert),
            (
                "False",
                "Degraded",
                "campaign: rail mlx5_4:1 slow".to_string()
            )
        );
    }
}
