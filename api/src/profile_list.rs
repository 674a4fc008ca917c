//! FabricProfiles decoded one object at a time, so that one object the CRD schema accepts but
//! railguard cannot use (a field out of range for its Rust type, or one `validate()` rejects)
//! is reported by name and skipped instead of failing a whole list or watch.
//!
//! [`ProfileObject`] is what the watches and lists of the webhook, the extender and the
//! prober ask the API server for: it always deserializes (its metadata, and the profile or
//! why the object is not one), so a typed `Api<ProfileObject>` serves every valid profile
//! whatever the others hold. [`decode_profile`] is the pure decision it makes.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Deserializer};

use crate::error::{error_chain, ProfileError};
use crate::profile::{FabricProfile, RENAMED_FIELDS};

/// A FabricProfile object that cannot be used, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidProfile {
    /// `metadata.name` (empty when the object has none).
    pub name: String,
    /// `metadata.generation`, so a report can say which edit it is about.
    pub generation: Option<i64>,
    /// One line: the field path and what is wrong with it (every problem `validate()` found,
    /// or the first field that does not decode).
    pub reason: String,
}

impl std::fmt::Display for InvalidProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FabricProfile {:?} is invalid: {}",
            self.name, self.reason
        )
    }
}

/// Decodes and validates one FabricProfile object as the API server sends it. `status` is
/// not read: it is railguard's report about the profile, and a status the profile's users
/// cannot edit must not make it unusable.
pub fn decode_profile(mut object: serde_json::Value) -> Result<FabricProfile, InvalidProfile> {
    let meta = object.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_string();
    let generation = meta
        .and_then(|m| m.get("generation"))
        .and_then(serde_json::Value::as_i64);
    let invalid = |reason: String| InvalidProfile {
        name: name.clone(),
        generation,
        reason,
    };
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    let profile: FabricProfile = serde_path_to_error::deserialize(object).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let what = error_chain(&inner);
        invalid(if path == "." {
            what
        } else {
            format!("{path}: {what}")
        })
    })?;
    match profile.validate() {
        Ok(()) => Ok(profile),
        Err(ProfileError::Invalid { problems }) => Err(invalid(
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        )),
        Err(e) => Err(invalid(error_chain(&e))),
    }
}

/// The deprecated field names an object uses, each with its new name, in the order of
/// [`RENAMED_FIELDS`]: `spec.thresholds.busbwPlateauGbps is now busbwPlateauGBps`.
pub fn renamed_fields_in(object: &serde_json::Value) -> Vec<String> {
    RENAMED_FIELDS
        .iter()
        .filter(|f| {
            object
                .pointer(f.object)
                .and_then(|o| o.get(f.old))
                .is_some()
        })
        .map(|f| format!("{} is now {}", f.old_path(), f.new))
        .collect()
}

/// Type of the FabricProfile status condition railguard writes.
pub const VALID_CONDITION: &str = "Valid";
/// Reason of a `Valid=False` condition, and of the Warning Event that goes with it.
pub const INVALID_REASON: &str = "InvalidProfile";
/// Reason of a `Valid=True` condition.
pub const ACCEPTED_REASON: &str = "Accepted";
/// Reason of a `Valid=True` condition of a profile that uses deprecated field names.
pub const DEPRECATED_FIELDS_REASON: &str = "DeprecatedFields";

/// The `Valid` condition as it is, or as it should be: `(status, reason, message)` and the
/// generation it describes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidCondition {
    pub status: String,
    pub reason: String,
    pub message: String,
    pub observed_generation: Option<i64>,
    /// RFC 3339, as read (kept when a rewrite does not change `status`).
    pub last_transition_time: Option<String>,
}

impl ValidCondition {
    /// What the condition should say about a decoded object that uses the `renamed` old
    /// field names ([`renamed_fields_in`]).
    pub fn wanted(
        decoded: &Result<FabricProfile, InvalidProfile>,
        generation: Option<i64>,
        renamed: &[String],
    ) -> Self {
        let (status, reason, message) = match decoded {
            Ok(p) if renamed.is_empty() => (
                "True",
                ACCEPTED_REASON,
                format!("served by railguard ({} rails)", p.spec.rails.len()),
            ),
            Ok(p) => (
                "True",
                DEPRECATED_FIELDS_REASON,
                format!(
                    "served by railguard ({} rails); deprecated names, read until the next release: {}",
                    p.spec.rails.len(),
                    renamed.join("; ")
                ),
            ),
            Err(e) => (
                "False",
                INVALID_REASON,
                format!("railguard skips this profile: {}", e.reason),
            ),
        };
        ValidCondition {
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: None,
        }
    }

    /// Whether `self` says what `other` says (times aside).
    pub fn same_as(&self, other: &ValidCondition) -> bool {
        (
            &self.status,
            &self.reason,
            &self.message,
            self.observed_generation,
        ) == (
            &other.status,
            &other.reason,
            &other.message,
            other.observed_generation,
        )
    }

    /// Read leniently from an object's `status.conditions`: anything unusable is `None`.
    fn read(object: &serde_json::Value) -> Option<Self> {
        let c = object
            .pointer("/status/conditions")?
            .as_array()?
            .iter()
            .find(|c| c.get("type").and_then(serde_json::Value::as_str) == Some(VALID_CONDITION))?;
        let text = |k: &str| {
            c.get(k)
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        };
        Some(ValidCondition {
            status: text("status")?,
            reason: text("reason").unwrap_or_default(),
            message: text("message").unwrap_or_default(),
            observed_generation: c
                .get("observedGeneration")
                .and_then(serde_json::Value::as_i64),
            last_transition_time: text("lastTransitionTime"),
        })
    }
}

/// One FabricProfile object as listed or watched: its metadata, and the profile or why it
/// is not one. Always deserializes (an object without usable metadata has default
/// metadata), so one bad object never fails a list.
#[derive(Clone, Debug)]
pub struct ProfileObject {
    pub metadata: ObjectMeta,
    pub decoded: Result<FabricProfile, InvalidProfile>,
    /// The `Valid` condition the object carries now, if any.
    pub condition: Option<ValidCondition>,
    /// The deprecated field names it uses ([`renamed_fields_in`]).
    pub renamed: Vec<String>,
}

impl ProfileObject {
    /// The profile's name (cluster-scoped, so unique).
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The condition to write, when the one the object carries does not already say it.
    pub fn condition_update(&self) -> Option<ValidCondition> {
        let mut wanted =
            ValidCondition::wanted(&self.decoded, self.metadata.generation, &self.renamed);
        match &self.condition {
            Some(seen) if seen.same_as(&wanted) => None,
            Some(seen) if seen.status == wanted.status => {
                wanted.last_transition_time = seen.last_transition_time.clone();
                Some(wanted)
            }
            _ => Some(wanted),
        }
    }
}

impl<'de> Deserialize<'de> for ProfileObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let object = serde_json::Value::deserialize(d)?;
        let metadata = object
            .get("metadata")
            .cloned()
            .and_then(|m| serde_json::from_value(m).ok())
            .unwrap_or_default();
        let condition = ValidCondition::read(&object);
        let renamed = renamed_fields_in(&object);
        Ok(ProfileObject {
            metadata,
            decoded: decode_profile(object),
            condition,
            renamed,
        })
    }
}

impl Resource for ProfileObject {
    type DynamicType = ();
    type Scope = <FabricProfile as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        FabricProfile::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        FabricProfile::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        FabricProfile::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        FabricProfile::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Splits decoded objects into the valid profiles (sorted by name) and the invalid ones
/// (sorted by name).
pub fn partition<'a>(
    objects: impl IntoIterator<Item = &'a ProfileObject>,
) -> (Vec<FabricProfile>, Vec<InvalidProfile>) {
    let mut valid = Vec::new();
    let mut invalid = Vec::new();
    for o in objects {
        match &o.decoded {
            Ok(p) => valid.push(p.clone()),
            Err(e) => invalid.push(e.clone()),
        }
    }
    valid.sort_by(|a, b| a.name().cmp(b.name()));
    invalid.sort_by(|a, b| a.name.cmp(&b.name));
    (valid, invalid)
}

/// What changed in the set of invalid profiles.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ProfileChanges {
    /// Invalid now and not before, or invalid for another reason.
    pub newly_invalid: Vec<InvalidProfile>,
    /// Invalid before, now valid or gone.
    pub no_longer_invalid: Vec<String>,
}

/// The profiles skipped as invalid, by name, with their reasons. Pure: callers feed it the
/// invalid objects of their cache and act on the changes (`railguard_kube` logs them and
/// counts them in the `fabric_profiles_invalid` gauge).
#[derive(Debug, Default)]
pub struct InvalidProfiles {
    current: BTreeMap<String, InvalidProfile>,
}

impl InvalidProfiles {
    /// Replaces the whole set (after a list or a rebuild from a store).
    pub fn replace(&mut self, now: impl IntoIterator<Item = InvalidProfile>) -> ProfileChanges {
        let now: BTreeMap<String, InvalidProfile> =
            now.into_iter().map(|p| (p.name.clone(), p)).collect();
        let mut changes = ProfileChanges::default();
        for (name, p) in &now {
            if self.current.get(name).map(|o| &o.reason) != Some(&p.reason) {
                changes.newly_invalid.push(p.clone());
            }
        }
        for name in self.current.keys() {
            if !now.contains_key(name) {
                changes.no_longer_invalid.push(name.clone());
            }
        }
        self.current = now;
        changes
    }

    /// One object changed: `Some` when it is invalid, `None` when it is valid or deleted.
    pub fn set(&mut self, name: &str, invalid: Option<InvalidProfile>) -> ProfileChanges {
        let mut now = self.current.clone();
        match invalid {
            Some(p) => now.insert(name.to_string(), p),
            None => now.remove(name),
        };
        self.replace(now.into_values())
    }

    pub fn len(&self) -> usize {
        self.current.len()
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }
}

#[cfg(test)]
mod tests {
    fn invalid(name: &str, reason: &str) -> InvalidProfile {
        InvalidProfile {
            name: name.into(),
            generation: Some(1),
            reason: reason.into(),
        }
    }

    #[test]
    fn each_invalid_profile_is_reported_once_per_change() {
        let mut set = InvalidProfiles::default();
        let c = set.replace([invalid("a", "port"), invalid("b", "rate")]);
        assert_eq!(c.newly_invalid.len(), 2);
        assert!(c.no_longer_invalid.is_empty());
        // A resync with the same reasons: nothing new.
        assert_eq!(
            set.replace([invalid("a", "port"), invalid("b", "rate")]),
            ProfileChanges::default()
        );
        // Another reason is news; a fixed one is no longer invalid.
        let c = set.set("a", Some(invalid("a", "rails")));
        assert_eq!(c.newly_invalid, [invalid("a", "rails")]);
        let c = set.set("b", None);
        assert_eq!(c.no_longer_invalid, ["b"]);
        assert_eq!(set.len(), 1);
        assert_eq!(set.set("b", None), ProfileChanges::default());
    }

    use super::*;

    fn fixture() -> serde_json::Value {
        let text = include_str!("../fixtures/profiles/dgx-h100-ndr.yaml");
        serde_yaml_ng::from_str(text).unwrap()
    }

    fn object(v: serde_json::Value) -> ProfileObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_valid_object_decodes() {
        let p = decode_profile(fixture()).unwrap();
        assert_eq!(p.name(), "h100-ndr");
    }

    #[test]
    fn a_port_out_of_range_for_u32_names_the_field_and_the_value() {
        let mut v = fixture();
        v["metadata"]["generation"] = 3.into();
        v["spec"]["rails"][1]["port"] = 4294967296u64.into();
        let e = decode_profile(v.clone()).unwrap_err();
        assert_eq!(e.name, "h100-ndr");
        assert_eq!(e.generation, Some(3));
        assert!(e.reason.starts_with("spec.rails[1].port: "), "{}", e.reason);
        assert!(e.reason.contains("4294967296"), "{}", e.reason);
        // The same object in a list: the list decodes, this one is the invalid one.
        let o = object(v);
        assert_eq!(o.name(), "h100-ndr");
        assert_eq!(o.decoded.unwrap_err(), e);
    }

    #[test]
    fn what_validate_rejects_is_invalid_with_every_problem() {
        let mut v = fixture();
        v["spec"]["certification"]["intervalSeconds"] = 90000.into();
        v["spec"]["certification"]["ttlSeconds"] = 86400.into();
        v["spec"]["nccl"]["env"] = serde_json::json!({"LD_PRELOAD": "/tmp/x.so"});
        let e = decode_profile(v).unwrap_err();
        assert!(
            e.reason.contains("spec.certification.intervalSeconds: must be positive and shorter than ttlSeconds (86400)"),
            "{}",
            e.reason
        );
        assert!(
            e.reason
                .contains("spec.nccl.env.LD_PRELOAD: only NCCL_* variables belong here"),
            "{}",
            e.reason
        );
        assert_eq!(
            e.to_string(),
            format!("FabricProfile \"h100-ndr\" is invalid: {}", e.reason)
        );
    }

    #[test]
    fn a_missing_required_field_and_a_wrong_type_are_invalid() {
        let mut v = fixture();
        v["spec"].as_object_mut().unwrap().remove("thresholds");
        let e = decode_profile(v).unwrap_err();
        assert!(
            e.reason.contains("missing field `thresholds`"),
            "{}",
            e.reason
        );
        let mut v = fixture();
        v["spec"]["rails"] = "all of them".into();
        let e = decode_profile(v).unwrap_err();
        assert!(
            e.reason.starts_with("spec.rails: invalid type"),
            "{}",
            e.reason
        );
    }

    #[test]
    fn status_is_not_read() {
        let mut v = fixture();
        v["status"] = serde_json::json!({"rails": 4294967296u64, "conditions": "junk"});
        assert!(decode_profile(v).is_ok());
    }

    #[test]
    fn an_object_without_metadata_still_decodes_as_invalid() {
        let o = object(serde_json::json!({"spec": 7}));
        assert_eq!(o.name(), "");
        let e = o.decoded.unwrap_err();
        assert!(e.reason.starts_with("spec: invalid type"), "{}", e.reason);
        let o = object(serde_json::json!("a string"));
        assert!(o.decoded.is_err());
    }

    #[test]
    fn the_condition_is_written_only_when_it_would_change() {
        let mut v = fixture();
        v["metadata"]["generation"] = 2.into();
        let o = object(v.clone());
        let wanted = o.condition_update().unwrap();
        assert_eq!(
            (
                wanted.status.as_str(),
                wanted.reason.as_str(),
                wanted.observed_generation
            ),
            ("True", ACCEPTED_REASON, Some(2))
        );
        assert_eq!(wanted.last_transition_time, None);
        // Already said: nothing to write (a resync or a restart writes nothing).
        v["status"] = serde_json::json!({"conditions": [{
            "type": "Valid", "status": "True", "reason": ACCEPTED_REASON,
            "message": wanted.message, "observedGeneration": 2,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        assert_eq!(object(v.clone()).condition_update(), None);
        // A new generation, still valid: rewritten, the transition time kept.
        v["metadata"]["generation"] = 3.into();
        let again = object(v.clone()).condition_update().unwrap();
        assert_eq!(again.observed_generation, Some(3));
        assert_eq!(
            again.last_transition_time.as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        // Broken: False with the reason, a new transition.
        v["spec"]["rails"][0]["port"] = 4294967296u64.into();
        let broken = object(v).condition_update().unwrap();
        assert_eq!(
            (broken.status.as_str(), broken.reason.as_str()),
            ("False", INVALID_REASON)
        );
        assert!(
            broken.message.contains("spec.rails[0].port"),
            "{}",
            broken.message
        );
        assert_eq!(broken.last_transition_time, None);
    }

    #[test]
    fn old_unit_names_are_read_with_a_warning_in_the_condition() {
        let mut v = fixture();
        let plateau = v["spec"]["thresholds"]
            .as_object_mut()
            .unwrap()
            .remove("busbwPlateauGBps")
            .unwrap();
        v["spec"]["thresholds"]["busbwPlateauGbps"] = plateau.clone();
        v["spec"]["certification"]["ncclPair"] = serde_json::json!({"minRailBusbwGbps": 45});
        let o = object(v.clone());
        let p = o.decoded.as_ref().unwrap();
        assert_eq!(Some(p.spec.thresholds.busbw_plateau_gbps), plateau.as_f64());
        assert_eq!(
            p.spec
                .certification
                .nccl_pair
                .as_ref()
                .unwrap()
                .min_rail_busbw_gbps,
            Some(45.0)
        );
        let c = o.condition_update().unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", DEPRECATED_FIELDS_REASON)
        );
        assert!(
            c.message.ends_with(
                "spec.thresholds.busbwPlateauGbps is now busbwPlateauGBps; \
                 spec.certification.ncclPair.minRailBusbwGbps is now minRailBusbwGBps"
            ),
            "{}",
            c.message
        );
        // Written back, the profile carries only the new names.
        let out = serde_json::to_value(p).unwrap();
        assert!(renamed_fields_in(&out).is_empty(), "{out}");
        assert_eq!(
            out["spec"]["thresholds"]["busbwPlateauGBps"].as_f64(),
            plateau.as_f64()
        );
        // The old and the new name at once: refused, not one silently preferred.
        v["spec"]["thresholds"]["busbwPlateauGBps"] = 1.into();
        let e = decode_profile(v).unwrap_err();
        assert!(e.reason.contains("duplicate field"), "{}", e.reason);
        // The shipped fixture uses only the new names.
        let fresh = object(fixture()).condition_update().unwrap();
        assert_eq!(fresh.reason, ACCEPTED_REASON);
    }

    #[test]
    fn partition_keeps_the_valid_and_names_the_invalid() {
        let good = fixture();
        let mut other = fixture();
        other["metadata"]["name"] = "a-bad".into();
        other["spec"]["rails"][0]["port"] = (-1).into();
        let objects = [object(good), object(other)];
        let (valid, invalid) = partition(&objects);
        assert_eq!(valid.len(), 1);
        assert_eq!(valid[0].name(), "h100-ndr");
        assert_eq!(invalid.len(), 1);
        assert_eq!(invalid[0].name, "a-bad");
        assert!(invalid[0].reason.starts_with("spec.rails[0].port: "));
    }
}
