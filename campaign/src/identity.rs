//! Who speaks on a campaign's control channel, checked with the API server rather than the
//! shared token (which every prober holds, so it proves membership, not identity).
//!
//! - An endpoint proves its node with its pod's projected service-account token (audience
//!   [`DEFAULT_AUDIENCE`]): the coordinator reviews it (TokenReview), reads the pod the token
//!   is bound to and requires the pod to run on the node the endpoint claims. Only then does
//!   the endpoint get pair keys, so a node can only speak for itself.
//! - The coordinator proves itself to an endpoint with a token of its own service account
//!   requested for that one connection: the audience names the endpoint's node and its fresh
//!   nonce ([`coordinator_audience`]), so a token seen by one endpoint is worthless anywhere
//!   else. Without this any token holder could pose as the coordinator, hand out pair keys and
//!   collect other endpoints' tokens.
//!
//! The decisions ([`reviewed_pod`], [`pod_runs_on`], [`check_coordinator`]) are pure; the
//! API calls around them are a thin shell.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::{
    TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec, TokenReviewStatus,
};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::Client;

use super::CampaignError;

/// Audience of the endpoints' projected tokens (the chart mounts them with it).
pub const DEFAULT_AUDIENCE: &str = "railguard-campaign";
/// The pod a bound service-account token belongs to, in a TokenReview's `user.extra`.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";
/// Lifetime of a coordinator's per-connection token (the API's minimum).
pub const COORDINATOR_TOKEN_SECONDS: i64 = 600;

/// A service account, `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountRef {
    pub namespace: String,
    pub name: String,
}

impl ServiceAccountRef {
    pub fn parse(text: &str) -> Result<Self, IdentityError> {
        match text.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(ServiceAccountRef {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(IdentityError::ServiceAccount {
                text: text.to_string(),
            }),
        }
    }

    /// The user name its tokens authenticate as.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

impl std::fmt::Display for ServiceAccountRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why an identity was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IdentityError {
    #[error("{text:?} is not a service account NAMESPACE/NAME")]
    ServiceAccount { text: String },
    #[error("the token was not accepted: {reason}")]
    NotAuthenticated { reason: String },
    #[error("the token is not for audience {audience}")]
    Audience { audience: String },
    #[error("the token belongs to {got}, expected {expected}")]
    WrongAccount { got: String, expected: String },
    #[error("the token is not bound to a pod")]
    NotPodBound,
    #[error("pod {pod}: {reason}")]
    Pod { pod: String, reason: String },
    #[error("pod {pod} runs on node {runs_on}, the endpoint claims node {claimed}")]
    OtherNode {
        pod: String,
        runs_on: String,
        claimed: String,
    },
}

fn one_extra(extra: Option<&BTreeMap<String, Vec<String>>>, key: &str) -> Option<String> {
    match extra.and_then(|e| e.get(key)).map(Vec::as_slice) {
        Some([one]) if !one.is_empty() => Some(one.clone()),
        _ => None,
    }
}

/// The common part: the review accepted the token, for `audience`, as `account`.
fn check_review(
    status: &TokenReviewStatus,
    audience: &str,
    account: &ServiceAccountRef,
) -> Result<(), IdentityError> {
    if status.authenticated != Some(true) {
        return Err(IdentityError::NotAuthenticated {
            reason: status
                .error
                .clone()
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "not authenticated".into()),
        });
    }
    // The API server checks the audiences it was asked for and echoes the ones that
    // matched; an empty echo means it checked none.
    if !status
        .audiences
        .as_deref()
        .is_some_and(|a| a.iter().any(|a| a == audience))
    {
        return Err(IdentityError::Audience {
            audience: audience.to_string(),
        });
    }
    let got = status
        .user
        .as_ref()
        .and_then(|u| u.username.clone())
        .unwrap_or_default();
    if got != account.username() {
        return Err(IdentityError::WrongAccount {
            got,
            expected: account.username(),
        });
    }
    Ok(())
}

/// The pod (name, uid) a reviewed endpoint token is bound to, if the review accepted it for
/// `audience` as the endpoints' service account.
pub fn reviewed_pod(
    status: &TokenReviewStatus,
    audience: &str,
    endpoints: &ServiceAccountRef,
) -> Result<(String, Option<String>), IdentityError> {
    check_review(status, audience, endpoints)?;
    let extra = status.user.as_ref().and_then(|u| u.extra.as_ref());
    let pod = one_extra(extra, POD_NAME_EXTRA).ok_or(IdentityError::NotPodBound)?;
    Ok((pod, one_extra(extra, POD_UID_EXTRA)))
}

/// Whether `pod` (read from the API) is the token's pod, of the endpoints' account, and runs
/// on `claimed_node`.
pub fn pod_runs_on(
    pod: &Pod,
    token_pod: &(String, Option<String>),
    endpoints: &ServiceAccountRef,
    claimed_node: &str,
) -> Result<(), IdentityError> {
    let name = format!("{}/{}", endpoints.namespace, token_pod.0);
    let refuse = |reason: String| IdentityError::Pod {
        pod: name.clone(),
        reason,
    };
    if pod.metadata.name.as_deref() != Some(token_pod.0.as_str())
        || pod.metadata.namespace.as_deref() != Some(endpoints.namespace.as_str())
    {
        return Err(refuse("is not the pod the token is bound to".into()));
    }
    // A pod recreated under the same name (perhaps elsewhere) is another pod.
    if let Some(uid) = &token_pod.1 {
        if pod.metadata.uid.as_deref() != Some(uid.as_str()) {
            return Err(refuse(format!("has another uid than the token's {uid}")));
        }
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Err(refuse("is being deleted".into()));
    }
    let spec = pod.spec.as_ref();
    let account = spec
        .and_then(|s| s.service_account_name.as_deref())
        .unwrap_or("default");
    if account != endpoints.name {
        return Err(refuse(format!(
            "runs as service account {account}, not {}",
            endpoints.name
        )));
    }
    match spec.and_then(|s| s.node_name.as_deref()) {
        Some(node) if node == claimed_node => Ok(()),
        Some(node) => Err(IdentityError::OtherNode {
            pod: name,
            runs_on: node.to_string(),
            claimed: claimed_node.to_string(),
        }),
        None => Err(refuse("is not bound to a node".into())),
    }
}

/// The audience of the coordinator's token for one connection to `node`'s endpoint.
pub fn coordinator_audience(node: &str, endpoint_nonce: &[u8]) -> String {
    format!(
        "railguard-campaign-coordinator/{node}/{}",
        hex::encode(endpoint_nonce)
    )
}

/// Whether a reviewed token is the coordinator's, for this connection.
pub fn check_coordinator(
    status: &TokenReviewStatus,
    audience: &str,
    coordinator: &ServiceAccountRef,
) -> Result<(), IdentityError> {
    check_review(status, audience, coordinator)
}

fn kube_error(what: String) -> impl FnOnce(kube::Error) -> CampaignError {
    move |source| CampaignError::Kube { what, source }
}

/// Reviews `token` for `audience`.
pub async fn review(
    client: &Client,
    token: &str,
    audience: &str,
) -> Result<TokenReviewStatus, CampaignError> {
    let api: Api<TokenReview> = Api::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec {
            audiences: Some(vec![audience.to_string()]),
            token: Some(token.to_string()),
        },
        ..Default::default()
    };
    let reviewed = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(kube_error("TokenReview".into()))?;
    Ok(reviewed.status.unwrap_or_default())
}

/// What the coordinator checks an endpoint's identity against.
#[derive(Clone)]
pub struct EndpointIdentityCheck {
    pub client: Client,
    /// The service account of the prober pods.
    pub endpoints: ServiceAccountRef,
    pub audience: String,
}

impl EndpointIdentityCheck {
    /// Whether `token` proves that its holder runs on `claimed_node`.
    pub async fn verify(&self, claimed_node: &str, token: &str) -> Result<(), CampaignError> {
        let refused = |e: IdentityError| CampaignError::Identity {
            node: claimed_node.to_string(),
            reason: e.to_string(),
        };
        let status = review(&self.client, token, &self.audience).await?;
        let token_pod = reviewed_pod(&status, &self.audience, &self.endpoints).map_err(refused)?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.endpoints.namespace);
        let pod = pods
            .get_opt(&token_pod.0)
            .await
            .map_err(kube_error(format!("get pod {}", token_pod.0)))?
            .ok_or_else(|| {
                refused(IdentityError::Pod {
                    pod: format!("{}/{}", self.endpoints.namespace, token_pod.0),
                    reason: "does not exist".into(),
                })
            })?;
        pod_runs_on(&pod, &token_pod, &self.endpoints, claimed_node).map_err(refused)
    }
}

/// The coordinator's own account, for its per-connection tokens.
#[derive(Clone)]
pub struct CoordinatorIdentity {
    pub client: Client,
    pub account: ServiceAccountRef,
    /// How endpoints are checked; `None`: endpoints are trusted by the shared token alone.
    pub endpoints: Option<EndpointIdentityCheck>,
}

impl CoordinatorIdentity {
    /// A token of the coordinator's account for one connection to `node`.
    pub async fn token_for(&self, node: &str, nonce: &[u8]) -> Result<String, CampaignError> {
        let api: Api<ServiceAccount> =
            Api::namespaced(self.client.clone(), &self.account.namespace);
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![coordinator_audience(node, nonce)],
                expiration_seconds: Some(COORDINATOR_TOKEN_SECONDS),
                ..Default::default()
            },
            ..Default::default()
        };
        let issued = api
            .create_token_request(&self.account.name, &PostParams::default(), &req)
            .await
            .map_err(kube_error(format!("TokenRequest for {}", self.account)))?;
        Ok(issued.status.map(|s| s.token).unwrap_or_default())
    }
}

/// What an endpoint checks the coordinator against.
#[derive(Clone)]
pub struct CoordinatorCheck {
    pub client: Client,
    pub coordinator: ServiceAccountRef,
}

impl CoordinatorCheck {
    /// Whether `token` is the coordinator's token for this connection to `node`.
    pub async fn verify(&self, node: &str, nonce: &[u8], token: &str) -> Result<(), String> {
        let audience = coordinator_audience(node, nonce);
        let status = review(&self.client, token, &audience)
            .await
            .map_err(|e| e.to_string())?;
        check_coordinator(&status, &audience, &self.coordinator).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;
    use serde_json::json;

    fn prober() -> ServiceAccountRef {
        ServiceAccountRef::parse("railguard/railguard-prober").unwrap()
    }

    fn status(username: &str, audiences: &[&str], pod: Option<(&str, &str)>) -> TokenReviewStatus {
        let mut extra = BTreeMap::new();
        if let Some((name, uid)) = pod {
            extra.insert(POD_NAME_EXTRA.to_string(), vec![name.to_string()]);
            extra.insert(POD_UID_EXTRA.to_string(), vec![uid.to_string()]);
        }
        TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
            user: Some(UserInfo {
                username: Some(username.to_string()),
                extra: Some(extra),
                ..Default::default()
            }),
            error: None,
        }
    }

    fn pod(name: &str, uid: &str, node: &str, sa: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "railguard", "uid": uid},
            "spec": {"nodeName": node, "serviceAccountName": sa, "containers": []},
        }))
        .unwrap()
    }

    const USER: &str = "system:serviceaccount:railguard:railguard-prober";

    #[test]
    fn an_endpoint_speaks_for_the_node_its_pod_runs_on_and_no_other() {
        let s = status(USER, &[DEFAULT_AUDIENCE], Some(("prober-x1", "u1")));
        let token_pod = reviewed_pod(&s, DEFAULT_AUDIENCE, &prober()).unwrap();
        assert_eq!(token_pod, ("prober-x1".to_string(), Some("u1".to_string())));
        let p = pod("prober-x1", "u1", "node-x", "railguard-prober");
        assert_eq!(pod_runs_on(&p, &token_pod, &prober(), "node-x"), Ok(()));
        let e = pod_runs_on(&p, &token_pod, &prober(), "node-y").unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod railguard/prober-x1 runs on node node-x, the endpoint claims node node-y"
        );
        // A pod of the same name but another uid, another account, or not bound to a node.
        let e = pod_runs_on(
            &pod("prober-x1", "u2", "node-x", "railguard-prober"),
            &token_pod,
            &prober(),
            "node-x",
        );
        assert!(matches!(e, Err(IdentityError::Pod { .. })), "{e:?}");
        let e = pod_runs_on(
            &pod("prober-x1", "u1", "node-x", "tenant"),
            &token_pod,
            &prober(),
            "node-x",
        );
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("runs as service account tenant"));
        let mut unbound = pod("prober-x1", "u1", "node-x", "railguard-prober");
        unbound.spec.as_mut().unwrap().node_name = None;
        assert!(pod_runs_on(&unbound, &token_pod, &prober(), "node-x").is_err());
        let e = pod_runs_on(
            &pod("other", "u1", "node-x", "railguard-prober"),
            &token_pod,
            &prober(),
            "node-x",
        );
        assert!(e.is_err());
    }

    #[test]
    fn reviews_that_prove_nothing_are_refused() {
        let sa = prober();
        let mut s = status(USER, &[DEFAULT_AUDIENCE], Some(("p", "u")));
        s.authenticated = Some(false);
        s.error = Some("token expired".into());
        assert_eq!(
            reviewed_pod(&s, DEFAULT_AUDIENCE, &sa)
                .unwrap_err()
                .to_string(),
            "the token was not accepted: token expired"
        );
        let s = status(USER, &["api"], Some(("p", "u")));
        assert!(matches!(
            reviewed_pod(&s, DEFAULT_AUDIENCE, &sa),
            Err(IdentityError::Audience { .. })
        ));
        let s = status(USER, &[], Some(("p", "u")));
        assert!(matches!(
            reviewed_pod(&s, DEFAULT_AUDIENCE, &sa),
            Err(IdentityError::Audience { .. })
        ));
        let s = status(
            "system:serviceaccount:tenant:default",
            &[DEFAULT_AUDIENCE],
            Some(("p", "u")),
        );
        assert!(matches!(
            reviewed_pod(&s, DEFAULT_AUDIENCE, &sa),
            Err(IdentityError::WrongAccount { .. })
        ));
        let s = status(USER, &[DEFAULT_AUDIENCE], None);
        assert_eq!(
            reviewed_pod(&s, DEFAULT_AUDIENCE, &sa),
            Err(IdentityError::NotPodBound)
        );
        assert!(reviewed_pod(&TokenReviewStatus::default(), DEFAULT_AUDIENCE, &sa).is_err());
    }

    #[test]
    fn a_coordinator_token_is_good_for_one_connection_only() {
        let coord = ServiceAccountRef::parse("railguard/railguard-campaign").unwrap();
        let aud = coordinator_audience("node-b", &[1u8; 32]);
        assert!(aud.starts_with("railguard-campaign-coordinator/node-b/0101"));
        let user = coord.username();
        assert_eq!(
            check_coordinator(&status(&user, &[&aud], None), &aud, &coord),
            Ok(())
        );
        let elsewhere = coordinator_audience("node-c", &[1u8; 32]);
        assert!(check_coordinator(&status(&user, &[&aud], None), &elsewhere, &coord).is_err());
        assert!(check_coordinator(&status(USER, &[&aud], None), &aud, &coord).is_err());
        assert!(ServiceAccountRef::parse("no-slash").is_err());
        assert!(ServiceAccountRef::parse("a/b/c").is_err());
        assert_eq!(coord.to_string(), "railguard/railguard-campaign");
    }
}
