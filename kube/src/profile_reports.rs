//! Reporting FabricProfiles railguard skips: the changes of the invalid set
//! (`railguard_api::profile_list::InvalidProfiles`, pure) logged once per change
//! ([`log_profile_changes`]) and counted in every component's `fabric_profiles_invalid`
//! metric ([`InvalidProfileGauge`]), and
//! [`ProfileStatusWriter`] (the webhook alone: the profile's `Valid` status condition and a
//! Warning Event `InvalidProfile` when it becomes invalid).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use railguard_api::node::NodeEvent;
use railguard_api::profile_list::{ProfileChanges, ProfileObject, ValidCondition, INVALID_REASON};
use railguard_api::FabricProfile;

use crate::events::record_event;

/// Logs the changes of the invalid set (`component` names who skips the profile).
pub fn log_profile_changes(changes: &ProfileChanges, component: &str) {
    for p in &changes.newly_invalid {
        tracing::warn!(
            component,
            profile = %p.name,
            generation = p.generation,
            reason = %p.reason,
            "skipping invalid FabricProfile (the other profiles are served)"
        );
    }
    for name in &changes.no_longer_invalid {
        tracing::info!(component, profile = %name, "FabricProfile no longer skipped");
    }
}

/// The label of `fabric_profiles_invalid`, the gauge every component exports (1 for each
/// profile it skips as invalid, by name).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ProfileLabels {
    pub profile: String,
}

/// A component's `fabric_profiles_invalid` gauge.
pub type InvalidProfileGauge = prometheus_client::metrics::family::Family<
    ProfileLabels,
    prometheus_client::metrics::gauge::Gauge,
>;

/// Sets the gauge for the profiles that became invalid and removes it for those that no
/// longer are.
pub fn record_profile_changes(changes: &ProfileChanges, gauge: &InvalidProfileGauge) {
    for p in &changes.newly_invalid {
        gauge
            .get_or_create(&ProfileLabels {
                profile: p.name.clone(),
            })
            .set(1);
    }
    for name in &changes.no_longer_invalid {
        gauge.remove(&ProfileLabels {
            profile: name.clone(),
        });
    }
}

/// Field manager of the FabricProfile status the webhook writes.
pub const PROFILE_STATUS_MANAGER: &str = "railguard-webhook-profile-status";

/// Writes each profile's `Valid` condition (and, for valid ones, `rails` and `signature`)
/// through the status subresource, and a Warning Event when a profile becomes invalid. Only
/// the webhook writes these, under [`PROFILE_STATUS_MANAGER`]; nothing reads them back.
///
/// An object that breaks the CRD's current schema (stored before the schema was tightened)
/// cannot take any write before Kubernetes ratchets CRD validation (1.30 and later): its
/// condition stays unwritten there, and the Event and the metric report it.
pub struct ProfileStatusWriter {
    api: Api<FabricProfile>,
    /// For the Events ([`record_event`]).
    client: Client,
    controller: String,
}

impl ProfileStatusWriter {
    pub fn new(client: Client, controller: &str) -> Self {
        ProfileStatusWriter {
            api: Api::all(client.clone()),
            client,
            controller: controller.to_string(),
        }
    }

    /// Brings one object's status up to date; a condition that already says it writes
    /// nothing (so resyncs and restarts add no writes and no Events). Failures are logged:
    /// the status is a report, serving does not depend on it.
    pub async fn update(&self, object: &ProfileObject) {
        let Some(condition) = object.condition_update() else {
            return;
        };
        let name = object.name();
        let became_invalid = condition.reason == INVALID_REASON
            && object.condition.as_ref().is_none_or(|seen| {
                seen.reason != INVALID_REASON || seen.message != condition.message
            });
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let body = status_patch(object, &condition, &now);
        let params = PatchParams::apply(PROFILE_STATUS_MANAGER).force();
        if let Err(e) = self
            .api
            .patch_status(name, &params, &Patch::Apply(&body))
            .await
        {
            tracing::warn!(profile = %name, error = %railguard_api::error::error_chain(&e), "cannot write FabricProfile status");
        }
        if became_invalid {
            let reference = ObjectReference {
                api_version: Some(FabricProfile::api_version(&()).into_owned()),
                kind: Some(FabricProfile::kind(&()).into_owned()),
                name: Some(name.to_string()),
                uid: object.metadata.uid.clone(),
                resource_version: object.metadata.resource_version.clone(),
                ..Default::default()
            };
            let event = NodeEvent {
                reason: INVALID_REASON,
                kind: "Warning",
                message: condition.message.clone(),
            };
            if let Err(e) = record_event(
                &self.client,
                reference,
                &event,
                &self.controller,
                &self.controller,
            )
            .await
            {
                tracing::warn!(profile = %name, error = %railguard_api::error::error_chain(&e), "cannot record the InvalidProfile Event");
            }
        }
    }
}

/// The server-side apply body of the status: the condition, and for a valid profile its
/// rail count and signature (the printer columns).
fn status_patch(object: &ProfileObject, c: &ValidCondition, now: &str) -> serde_json::Value {
    let mut condition = serde_json::json!({
        "type": railguard_api::profile_list::VALID_CONDITION,
        "status": c.status,
        "reason": c.reason,
        "message": c.message,
        "lastTransitionTime": c.last_transition_time.as_deref().unwrap_or(now),
    });
    if let Some(g) = c.observed_generation {
        condition["observedGeneration"] = g.into();
    }
    let mut status = serde_json::json!({ "conditions": [condition] });
    if let Ok(p) = &object.decoded {
        status["rails"] = p.spec.rails.len().into();
        status["signature"] = p.spec.signature().into();
    }
    serde_json::json!({
        "apiVersion": FabricProfile::api_version(&()),
        "kind": FabricProfile::kind(&()),
        "metadata": { "name": object.name() },
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_patch_carries_the_condition_and_for_valid_profiles_the_layout() {
        let text = include_str!("../../api/fixtures/profiles/dgx-h100-ndr.yaml");
        let mut v: serde_json::Value = serde_yaml_ng::from_str(text).unwrap();
        v["metadata"]["generation"] = 4.into();
        let o: ProfileObject = serde_json::from_value(v.clone()).unwrap();
        let c = o.condition_update().unwrap();
        let body = status_patch(&o, &c, "2026-12-01T00:00:00Z");
        assert_eq!(body["kind"], "FabricProfile");
        assert_eq!(body["apiVersion"], "railguard.io/v1alpha1");
        assert_eq!(body["status"]["rails"], 8);
        assert_eq!(body["status"]["conditions"][0]["status"], "True");
        assert_eq!(body["status"]["conditions"][0]["observedGeneration"], 4);
        assert_eq!(
            body["status"]["conditions"][0]["lastTransitionTime"],
            "2026-12-01T00:00:00Z"
        );
        v["spec"]["rails"][0]["rateGbps"] = 0.into();
        let o: ProfileObject = serde_json::from_value(v).unwrap();
        let c = o.condition_update().unwrap();
        let body = status_patch(&o, &c, "2026-12-01T00:00:00Z");
        assert_eq!(body["status"]["conditions"][0]["reason"], INVALID_REASON);
        assert!(body["status"].get("rails").is_none());
    }
}
