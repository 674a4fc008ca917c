//! `admission.k8s.io/v1` AdmissionReview in and out, and the admission decision around
//! [`mutate()`](crate::mutate()) (request kind, operation, failure mode). No IO.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use railguard_api::FabricProfile;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::ProfileSet;
use crate::config::{FailureMode, NamespaceInfo, WebhookConfig};
pub use crate::decisions::Decision;
use crate::decisions::{DecisionCache, Lookup};
use crate::error::DecodeError;
use crate::json_text;
use crate::mutate::{mutate, Warning, WarningKind};
pub use crate::patch::EncodedPatch;

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(borrow)]
    request: Option<RequestWire<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestWire<'a> {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    kind: GroupVersionKind,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    dry_run: Option<bool>,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    old_object: Option<&'a RawValue>,
    #[serde(default)]
    user_info: Option<UserInfo>,
}

/// `request.kind` of the review.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

/// `request.userInfo`: who asked the API server for the change (as it authenticated them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub groups: Vec<String>,
    /// Extra attributes; a bound service-account token carries
    /// `authentication.kubernetes.io/pod-name` and `pod-uid` here.
    #[serde(default)]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// The parts of an AdmissionRequest railguard reads. `object` borrows the raw JSON.
#[derive(Clone, Debug)]
pub struct AdmissionRequest<'a> {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub sub_resource: Option<String>,
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub operation: String,
    pub dry_run: bool,
    pub object: Option<&'a RawValue>,
    /// The object before an UPDATE (None on CREATE).
    pub old_object: Option<&'a RawValue>,
    pub user_info: UserInfo,
}

impl AdmissionRequest<'_> {
    /// Whether the request is about a Pod itself (not a subresource).
    pub fn is_pod(&self) -> bool {
        self.kind.group.is_empty()
            && self.kind.version == "v1"
            && self.kind.kind == "Pod"
            && self.sub_resource.as_deref().is_none_or(str::is_empty)
    }
}

/// Decodes the body. An error means the body is not an AdmissionReview at all (HTTP 400).
pub fn decode(body: &[u8]) -> Result<AdmissionRequest<'_>, DecodeError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(DecodeError::Empty);
    }
    let env: Envelope<'_> =
        serde_json::from_slice(body).map_err(|source| DecodeError::Json { source })?;
    let api_version = env.api_version.unwrap_or_default();
    if api_version != API_VERSION {
        return Err(DecodeError::ApiVersion { found: api_version });
    }
    let kind = env.kind.unwrap_or_default();
    if kind != KIND {
        return Err(DecodeError::Kind { found: kind });
    }
    let r = env.request.ok_or(DecodeError::NoRequest)?;
    if r.uid.is_empty() {
        return Err(DecodeError::NoUid);
    }
    Ok(AdmissionRequest {
        uid: r.uid,
        kind: r.kind,
        sub_resource: r.sub_resource,
        name: r.name,
        namespace: r.namespace,
        operation: r.operation,
        dry_run: r.dry_run.unwrap_or(false),
        object: r.object,
        old_object: r.old_object,
        user_info: r.user_info.unwrap_or_default(),
    })
}

/// The AdmissionResponse railguard sends.
#[derive(Clone, Debug, PartialEq)]
pub struct ReviewResponse {
    pub uid: String,
    pub allowed: bool,
    /// JSON-patch document, if any.
    pub patch: Option<Arc<EncodedPatch>>,
    pub warnings: Vec<String>,
    /// Denial message (HTTP-like code 403 in `status`).
    pub denial: Option<String>,
}

impl ReviewResponse {
    pub fn allow(uid: impl Into<String>) -> Self {
        Self {
            uid: uid.into(),
            allowed: true,
            patch: None,
            warnings: Vec::new(),
            denial: None,
        }
    }

    /// The AdmissionReview JSON, written in one pass. The bytes are those serde_json writes for
    /// the same fields in this order (`uid`, `allowed`, `patchType`, `patch`, `warnings`,
    /// `status`), absent ones left out.
    pub fn encode(&self) -> Vec<u8> {
        const HEAD: &str =
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#;
        let patch_len = self.patch.as_ref().map_or(0, |p| p.base64().len() + 40);
        let text_len: usize = self.warnings.iter().map(|w| w.len() + 3).sum::<usize>()
            + self.denial.as_ref().map_or(0, |d| d.len() + 60);
        let mut out =
            String::with_capacity(HEAD.len() + self.uid.len() + 24 + patch_len + text_len);
        out.push_str(HEAD);
        json_text::push_str(&mut out, &self.uid);
        out.push_str(if self.allowed {
            r#","allowed":true"#
        } else {
            r#","allowed":false"#
        });
        if let Some(patch) = &self.patch {
            out.push_str(r#","patchType":"JSONPatch","patch":""#);
            // Base64 needs no escaping.
            out.push_str(patch.base64());
            out.push('"');
        }
        if !self.warnings.is_empty() {
            out.push_str(r#","warnings":"#);
            json_text::push_str_array(&mut out, &self.warnings);
        }
        if let Some(message) = &self.denial {
            out.push_str(r#","status":{"code":403,"message":"#);
            json_text::push_str(&mut out, message);
            out.push_str(r#","reason":"Forbidden"}"#);
        }
        out.push_str("}}");
        out.into_bytes()
    }
}

/// The full decision for one request, with what metrics need.
#[derive(Clone, Debug)]
pub struct Admission {
    pub response: ReviewResponse,
    /// Metrics outcome label: a [`Outcome`] name, `ignored` or `error`.
    pub outcome: &'static str,
    pub profile: Option<String>,
    pub warning_kinds: Vec<WarningKind>,
    /// An internal error, for the log.
    pub error: Option<String>,
    /// Whether [`admit_cached`] found the decision held (None: no cache was asked).
    pub cache: Option<Lookup>,
}

/// Decides a decoded request: only Pod CREATE is mutated; anything else is allowed as is
/// (a non-Pod object also gets a warning, since the webhook configuration is then wrong).
pub fn admit(
    request: &AdmissionRequest<'_>,
    namespace: &NamespaceInfo,
    profiles: &[FabricProfile],
    config: &WebhookConfig,
    failure_mode: FailureMode,
) -> Admission {
    admit_with(request, namespace, profiles, config, failure_mode, None)
}

/// [`admit`], with the pod's decision taken from `cache` when an equal pod was decided under
/// the same namespace, `profiles` snapshot and `config` (the answer is the same either way).
pub fn admit_cached(
    request: &AdmissionRequest<'_>,
    namespace: &NamespaceInfo,
    profiles: &ProfileSet,
    config: &WebhookConfig,
    failure_mode: FailureMode,
    cache: &DecisionCache,
) -> Admission {
    admit_with(
        request,
        namespace,
        profiles,
        config,
        failure_mode,
        Some((cache, profiles)),
    )
}

fn admit_with(
    request: &AdmissionRequest<'_>,
    namespace: &NamespaceInfo,
    profiles: &[FabricProfile],
    config: &WebhookConfig,
    failure_mode: FailureMode,
    cache: Option<(&DecisionCache, &ProfileSet)>,
) -> Admission {
    let mut response = ReviewResponse::allow(request.uid.clone());
    let ignored = |response: ReviewResponse, warning: Option<Warning>| {
        let mut response = response;
        let mut kinds = Vec::new();
        if let Some(w) = warning {
            kinds.push(w.kind);
            response.warnings.push(w.message);
        }
        Admission {
            response,
            outcome: "ignored",
            profile: None,
            warning_kinds: kinds,
            error: None,
            cache: None,
        }
    };
    if !request.is_pod() {
        let k = &request.kind;
        let what = if k.group.is_empty() {
            format!("{}/{}", k.version, k.kind)
        } else {
            format!("{}/{}/{}", k.group, k.version, k.kind)
        };
        let sub = request
            .sub_resource
            .as_deref()
            .filter(|s| !s.is_empty())
            .map(|s| format!(" subresource {s}"))
            .unwrap_or_default();
        return ignored(
            response,
            Some(Warning::new(
                WarningKind::NotPod,
                format!("railguard-webhook mutates only Pods, got {what}{sub}; allowed unchanged"),
            )),
        );
    }
    if request.operation != "CREATE" {
        return ignored(response, None);
    }
    let failed = |message: String, response: ReviewResponse| {
        let mut response = response;
        let text = format!("railguard-webhook could not configure the pod: {message}");
        match failure_mode {
            FailureMode::Open => {
                response
                    .warnings
                    .push(Warning::new(WarningKind::Internal, &text).message);
            }
            FailureMode::Closed => {
                response.allowed = false;
                response.denial = Some(text);
            }
        }
        Admission {
            response,
            outcome: "error",
            profile: None,
            warning_kinds: vec![WarningKind::Internal],
            error: Some(message),
            cache: None,
        }
    };
    let Some(raw) = request.object else {
        return failed("request has no object".to_string(), response);
    };
    let pod: Pod = match serde_json::from_str(raw.get()) {
        Ok(p) => p,
        Err(e) => return failed(format!("object is not a valid Pod: {e}"), response),
    };
    let decide = |pod: &Pod| mutate(pod, namespace, profiles, config).map(Decision::from_plan);
    let decided = match cache {
        Some((cache, set)) => cache
            .decide(pod, raw.get().len(), namespace, set, config, decide)
            .map(|(d, lookup)| (d, Some(lookup))),
        None => decide(&pod).map(|d| (Arc::new(d), None)),
    };
    let (decision, lookup) = match decided {
        Ok(d) => d,
        Err(e) => return failed(railguard_api::error::error_chain(&e), response),
    };
    response.allowed = decision.denial.is_none();
    response.denial.clone_from(&decision.denial);
    response.warnings.clone_from(&decision.warnings);
    response.patch.clone_from(&decision.patch);
    Admission {
        response,
        outcome: decision.outcome,
        profile: decision.profile.clone(),
        warning_kinds: decision.warning_kinds.clone(),
        error: None,
        cache: lookup,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use base64::Engine as _;
    use serde::Serialize;

    use super::*;

    /// The answer as serde_json writes it from the wire structs (how `encode` was written
    /// before it wrote the bytes itself): the reference for byte-for-byte equality.
    fn serde_encode(r: &ReviewResponse) -> Vec<u8> {
        #[derive(Serialize)]
        struct ReviewOut<'a> {
            #[serde(rename = "apiVersion")]
            api_version: &'static str,
            kind: &'static str,
            response: ResponseWire<'a>,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct ResponseWire<'a> {
            uid: &'a str,
            allowed: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            patch_type: Option<&'static str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            patch: Option<String>,
            #[serde(skip_serializing_if = "<[String]>::is_empty")]
            warnings: &'a [String],
            #[serde(skip_serializing_if = "Option::is_none")]
            status: Option<StatusWire<'a>>,
        }
        #[derive(Serialize)]
        struct StatusWire<'a> {
            code: u16,
            message: &'a str,
            reason: &'static str,
        }
        serde_json::to_vec(&ReviewOut {
            api_version: API_VERSION,
            kind: KIND,
            response: ResponseWire {
                uid: &r.uid,
                allowed: r.allowed,
                patch_type: r.patch.as_ref().map(|_| "JSONPatch"),
                patch: r
                    .patch
                    .as_ref()
                    .map(|p| base64::engine::general_purpose::STANDARD.encode(&p[..])),
                warnings: &r.warnings,
                status: r.denial.as_deref().map(|message| StatusWire {
                    code: 403,
                    message,
                    reason: "Forbidden",
                }),
            },
        })
        .unwrap()
    }

    #[test]
    fn answers_are_the_bytes_serde_json_writes() {
        let mut cases = vec![ReviewResponse::allow(
            "0b7f8a2e-9d43-4c1e-8a51-0d7a5c1f2e11",
        )];
        // Every patch length modulo 3 (base64 padding), empty included.
        for len in [0, 1, 2, 3, 4, 5, 3000, 3001, 3002] {
            let mut r = ReviewResponse::allow("u");
            r.patch = Some(Arc::new(EncodedPatch::new(
                (0..len).map(|i| (i * 7 % 256) as u8).collect(),
            )));
            r.warnings = vec!["container t: NCCL_IB_HCA=\"x\" kept\n".into(), "é…".into()];
            cases.push(r);
        }
        let mut denied = ReviewResponse::allow("uid \"quoted\" \\ \u{1}");
        denied.allowed = false;
        denied.denial = Some("railguard-webhook could not configure the pod: \t/~".into());
        denied.warnings = vec!["w".into()];
        cases.push(denied);
        for r in &cases {
            let ours = r.encode();
            assert_eq!(
                String::from_utf8(ours.clone()).unwrap(),
                String::from_utf8(serde_encode(r)).unwrap()
            );
            let v: serde_json::Value = serde_json::from_slice(&ours).unwrap();
            assert_eq!(v["apiVersion"], API_VERSION);
            assert_eq!(v["kind"], KIND);
        }
    }
}
