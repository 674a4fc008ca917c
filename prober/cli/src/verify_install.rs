//! `railguard-prober verify-install`: the chart's `helm test`. It asks the webhook, through
//! its Service and with the CA it serves (the caBundle the API server uses), to admit a GPU
//! training pod and requires an AdmissionReview answer for that request; then it waits for
//! enough Nodes certified by railguard. The judgements are pure functions below.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueHint};
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::Api;
use railguard_api::error::error_chain;
use railguard_api::{keys, Verdict};
use serde_json::{json, Value as Json};

use crate::{Outcome, Status};

/// The UID of the probe's AdmissionReview request, echoed in the answer.
const PROBE_UID: &str = "railguard-verify-install";

#[derive(Args, Debug)]
pub struct VerifyInstallArgs {
    /// The webhook's mutating endpoint, through its Service.
    #[arg(long, env = "RAILGUARD_WEBHOOK_URL")]
    pub webhook_url: String,
    /// Connect to this address (IP:port) instead of resolving the URL's host; TLS still
    /// verifies the URL's host name. The chart passes the Service's cluster IP from the
    /// kubelet's service environment, so the test needs no cluster DNS.
    #[arg(long, env = "RAILGUARD_WEBHOOK_ADDRESS")]
    pub webhook_address: Option<std::net::SocketAddr>,
    /// The CA that signs the webhook's serving certificate (PEM).
    #[arg(long, env = "RAILGUARD_WEBHOOK_CA_FILE", value_hint = ValueHint::FilePath)]
    pub webhook_ca_file: PathBuf,
    /// GPU resource the probe pod requests (one of the webhook's --gpu-resources).
    #[arg(long, env = "RAILGUARD_GPU_RESOURCE", default_value = "nvidia.com/gpu")]
    pub gpu_resource: String,
    /// Nodes that must carry a railguard certification of `certified`; 0 checks the webhook
    /// only.
    #[arg(long, env = "RAILGUARD_MIN_CERTIFIED_NODES", default_value_t = 1)]
    pub min_certified_nodes: usize,
    /// How long to wait for the webhook to answer and the Nodes to be certified, seconds.
    #[arg(long, env = "RAILGUARD_VERIFY_TIMEOUT_SECS", default_value_t = 300)]
    pub timeout_secs: u64,
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "RAILGUARD_KUBECONFIG", value_hint = ValueHint::FilePath)]
    pub kubeconfig: Option<PathBuf>,
}

/// The AdmissionReview a pod CREATE sends: an 8-GPU pod labelled for injection.
pub fn probe_review(gpu_resource: &str) -> Json {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": PROBE_UID,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "railguard-verify-install",
            "operation": "CREATE",
            "dryRun": true,
            "userInfo": {"username": "system:serviceaccount:railguard:verify-install"},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "verify-install",
                    "namespace": "railguard-verify-install",
                    "labels": {"railguard.io/inject": "true"},
                },
                "spec": {"containers": [{
                    "name": "train",
                    "image": "registry.invalid/train:1",
                    "resources": {"limits": {gpu_resource: "8"}},
                }]},
            },
        },
    })
}

/// What the webhook said about the probe pod, or why the body is not an answer to it.
pub fn judge_answer(status: u16, body: &[u8]) -> Result<String, String> {
    if status != 200 {
        return Err(format!(
            "HTTP {status} (the webhook answers every review with 200)"
        ));
    }
    let review: Json =
        serde_json::from_slice(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    if review["kind"] != "AdmissionReview" {
        return Err(format!("the answer is not an AdmissionReview: {review}"));
    }
    let response = &review["response"];
    if response["uid"] != PROBE_UID {
        return Err(format!(
            "the answer's uid is {}, not the request's",
            response["uid"]
        ));
    }
    let allowed = response["allowed"]
        .as_bool()
        .ok_or_else(|| format!("the answer has no allowed: {response}"))?;
    let patched = response["patch"].as_str().is_some_and(|p| !p.is_empty());
    let warnings = response["warnings"].as_array().map_or(0, Vec::len);
    let audit = response["auditAnnotations"]
        .as_object()
        .map_or(0, serde_json::Map::len);
    Ok(match (allowed, patched) {
        (true, true) => "admitted the probe pod with a patch".to_string(),
        (true, false) => format!(
            "admitted the probe pod unchanged ({warnings} warnings, {audit} audit annotations)"
        ),
        (false, _) => format!(
            "denied the probe pod: {}",
            response["status"]["message"]
                .as_str()
                .unwrap_or("no reason")
        ),
    })
}

/// Nodes whose railguard certification is `certified`, by name.
pub fn certified_nodes(nodes: &[Node]) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(keys::LABEL_FABRIC))
                .is_some_and(|v| v == Verdict::Certified.as_label())
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

impl VerifyInstallArgs {
    pub async fn run(self) -> anyhow::Result<Outcome> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(self.timeout_secs);
        let ca = std::fs::read(&self.webhook_ca_file)
            .with_context(|| format!("reading {}", self.webhook_ca_file.display()))?;
        let ca = reqwest::Certificate::from_pem(&ca)
            .with_context(|| format!("{} is not a PEM CA", self.webhook_ca_file.display()))?;
        let mut http = reqwest::Client::builder()
            .add_root_certificate(ca)
            .timeout(Duration::from_secs(10));
        if let Some(address) = self.webhook_address {
            let url = reqwest::Url::parse(&self.webhook_url)
                .with_context(|| format!("--webhook-url {}", self.webhook_url))?;
            let host = url
                .host_str()
                .with_context(|| format!("--webhook-url {} has no host", self.webhook_url))?;
            http = http.resolve(host, address);
        }
        let http = http.build().context("building the HTTPS client")?;
        let review = probe_review(&self.gpu_resource);
        let webhook = loop {
            let last = match http.post(&self.webhook_url).json(&review).send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let body = resp.bytes().await.unwrap_or_default();
                    match judge_answer(status, &body) {
                        Ok(said) => break said,
                        Err(why) => why,
                    }
                }
                Err(e) => error_chain(&e),
            };
            if tokio::time::Instant::now() >= deadline {
                return Ok(Outcome::new(
                    format!("FAIL webhook {}: {last}", self.webhook_url),
                    Status::Fail,
                ));
            }
            tracing::info!(url = %self.webhook_url, last = %last, "webhook not answering yet");
            tokio::time::sleep(Duration::from_secs(2)).await;
        };
        let mut text = format!("ok webhook {}: {webhook}\n", self.webhook_url);
        if self.min_certified_nodes == 0 {
            return Ok(Outcome::pass(text));
        }
        let client = crate::cluster_client(self.kubeconfig.as_deref()).await?;
        let nodes: Api<Node> = Api::all(client);
        let params = ListParams::default().labels(keys::LABEL_FABRIC);
        loop {
            let listed = nodes.list(&params).await.context("listing Nodes")?;
            let certified = certified_nodes(&listed.items);
            if certified.len() >= self.min_certified_nodes {
                text.push_str(&format!(
                    "ok {} certified node(s): {}\n",
                    certified.len(),
                    certified.join(", ")
                ));
                return Ok(Outcome::pass(text));
            }
            if tokio::time::Instant::now() >= deadline {
                text.push_str(&format!(
                    "FAIL {} certified node(s), {} wanted, after {}s\n",
                    certified.len(),
                    self.min_certified_nodes,
                    self.timeout_secs
                ));
                return Ok(Outcome::new(text, Status::Fail));
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(response: Json) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response
        }))
        .unwrap()
    }

    #[test]
    fn a_patch_an_audit_and_a_denial_are_all_answers() {
        let patched = answer(
            json!({"uid": PROBE_UID, "allowed": true, "patch": "W10=", "patchType": "JSONPatch"}),
        );
        assert_eq!(
            judge_answer(200, &patched).unwrap(),
            "admitted the probe pod with a patch"
        );
        let audit = answer(
            json!({"uid": PROBE_UID, "allowed": true, "warnings": ["railguard audit: would add IPC_LOCK"]}),
        );
        assert!(judge_answer(200, &audit).unwrap().contains("1 warnings"));
        let denied = answer(
            json!({"uid": PROBE_UID, "allowed": false, "status": {"message": "no certified node"}}),
        );
        assert_eq!(
            judge_answer(200, &denied).unwrap(),
            "denied the probe pod: no certified node"
        );
    }

    #[test]
    fn wrong_status_body_or_uid_is_not_an_answer() {
        assert!(judge_answer(500, b"{}").unwrap_err().contains("HTTP 500"));
        assert!(judge_answer(200, b"<html>")
            .unwrap_err()
            .contains("not JSON"));
        assert!(judge_answer(200, b"{\"kind\":\"Status\"}")
            .unwrap_err()
            .contains("not an AdmissionReview"));
        let other = answer(json!({"uid": "someone-else", "allowed": true}));
        assert!(judge_answer(200, &other).unwrap_err().contains("uid"));
        let no_allowed = answer(json!({"uid": PROBE_UID}));
        assert!(judge_answer(200, &no_allowed)
            .unwrap_err()
            .contains("no allowed"));
    }

    #[test]
    fn the_probe_is_a_gpu_pod_labelled_for_injection() {
        let review = probe_review("nvidia.com/gpu");
        let pod = &review["request"]["object"];
        assert_eq!(pod["metadata"]["labels"]["railguard.io/inject"], "true");
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "8"
        );
        assert_eq!(review["request"]["dryRun"], true);
    }

    #[test]
    fn only_certified_nodes_count() {
        let node = |name: &str, fabric: Option<&str>| {
            let mut n = Node::default();
            n.metadata.name = Some(name.into());
            if let Some(f) = fabric {
                n.metadata.labels = Some([(keys::LABEL_FABRIC.to_string(), f.to_string())].into());
            }
            n
        };
        let nodes = [
            node("a", Some("certified")),
            node("b", Some("failed")),
            node("c", None),
            node("d", Some("certified")),
        ];
        assert_eq!(certified_nodes(&nodes), ["a", "d"]);
    }
}
