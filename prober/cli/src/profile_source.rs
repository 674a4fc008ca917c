//! Where the prober's FabricProfile comes from in a cluster, and what it does when that
//! profile cannot be used.
//!
//! Profiles are listed as [`ProfileObject`]s, each decoded and validated on its own: one
//! invalid profile (say a port past `u32`, or an `intervalSeconds` not below `ttlSeconds`)
//! never hides the valid ones. When the profile this node needs is invalid (or no profile
//! matches it, or it names an nccl-tests binary outside `--allowed-nccl-binaries`), the error
//! is an [`UnusableProfile`]:
//!
//! - `railguard-prober certify` prints it and exits 2 (a configuration error);
//! - `railguard-prober daemon` does not exit (no crash-loop): it sets the Node's
//!   `RailguardFabricReady` condition to `Unknown` with reason `InvalidProfile` (or
//!   `NoProfile`, or `NcclBinaryNotAllowed`) and the message saying which profile and field, keeps `/healthz` and
//!   `/metrics` served (`railguard_prober_fabric_profiles_invalid{profile}`), looks again
//!   every `--poll-ms`, and starts certifying as soon as the profile is fixed. The certificate
//!   already on the Node is left as it is. A GPU node that no profile matches (`NoProfile`)
//!   also gets one Warning Event `Unprofiled` and `railguard_prober_unprofiled` 1
//!   ([`crate::unprofiled`]). The daemon's waiting is `crate::daemon::profile_wait`.

use anyhow::Context;
use kube::{Api, Client};
use railguard_api::profile_list::{partition, ProfileObject};
use railguard_api::{FabricProfile, InvalidProfile};

/// Condition reason: the profile this node needs is invalid.
pub const REASON_INVALID_PROFILE: &str = "InvalidProfile";
/// Condition reason: no valid profile matches this node (and none is default).
pub const REASON_NO_PROFILE: &str = "NoProfile";
/// Condition reason: the profile names an nccl-tests binary this prober may not run.
pub const REASON_NCCL_BINARY_NOT_ALLOWED: &str = "NcclBinaryNotAllowed";

/// The profile this node needs cannot be used; `reason` is the condition reason.
#[derive(Debug)]
pub struct UnusableProfile {
    pub reason: &'static str,
    pub message: String,
    /// The invalid profiles seen, for the metric.
    pub invalid: Vec<InvalidProfile>,
}

impl std::fmt::Display for UnusableProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for UnusableProfile {}

impl UnusableProfile {
    pub fn invalid(message: String, invalid: &[InvalidProfile]) -> Self {
        UnusableProfile {
            reason: REASON_INVALID_PROFILE,
            message,
            invalid: invalid.to_vec(),
        }
    }

    /// The profile is valid but names `ncclTests.binary` outside the install-time allow list.
    pub fn binary_not_allowed(message: String) -> Self {
        UnusableProfile {
            reason: REASON_NCCL_BINARY_NOT_ALLOWED,
            message,
            invalid: Vec::new(),
        }
    }

    pub fn none(message: String, invalid: &[InvalidProfile]) -> Self {
        UnusableProfile {
            reason: if invalid.is_empty() {
                REASON_NO_PROFILE
            } else {
                REASON_INVALID_PROFILE
            },
            message,
            invalid: invalid.to_vec(),
        }
    }
}

/// Every FabricProfile of the cluster, each object decoded on its own: the valid ones and
/// the invalid ones (both sorted by name), each invalid one logged.
pub async fn cluster_profiles(
    client: &Client,
) -> anyhow::Result<(Vec<FabricProfile>, Vec<InvalidProfile>)> {
    let api: Api<ProfileObject> = Api::all(client.clone());
    let list = api
        .list(&Default::default())
        .await
        .context("cannot list FabricProfiles")?;
    let (valid, invalid) = partition(&list.items);
    for p in &invalid {
        tracing::warn!(profile = %p.name, generation = p.generation, reason = %p.reason, "skipping invalid FabricProfile");
    }
    Ok((valid, invalid))
}

/// One named FabricProfile of the cluster, decoded and validated; an invalid one is an
/// [`UnusableProfile`] naming the field.
pub async fn cluster_profile(client: &Client, name: &str) -> anyhow::Result<FabricProfile> {
    let api: Api<ProfileObject> = Api::all(client.clone());
    let object = api
        .get(name)
        .await
        .with_context(|| format!("cannot read FabricProfile {name}"))?;
    object.decoded.map_err(|e| {
        let message = e.to_string();
        UnusableProfile::invalid(message, std::slice::from_ref(&e)).into()
    })
}

/// The condition the Node carries while its profile cannot be used: `Unknown` (the prober
/// checks nothing), the reason, and what to fix.
pub fn unusable_condition(u: &UnusableProfile) -> (&'static str, &'static str, String) {
    (
        "Unknown",
        u.reason,
        format!(
            "{}; the prober checks nothing on this node until a valid FabricProfile for it exists (the certificate is left as it is)",
            u.message
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_condition_names_the_profile_problem_and_what_happens_meanwhile() {
        let bad = InvalidProfile {
            name: "h100".into(),
            generation: Some(2),
            reason: "spec.rails[0].port: invalid value".into(),
        };
        let u = UnusableProfile::invalid(bad.to_string(), std::slice::from_ref(&bad));
        let (status, reason, message) = unusable_condition(&u);
        assert_eq!((status, reason), ("Unknown", "InvalidProfile"));
        assert!(
            message.starts_with("FabricProfile \"h100\" is invalid: spec.rails[0].port"),
            "{message}"
        );
        assert!(message.contains("checks nothing"), "{message}");
        assert_eq!(
            UnusableProfile::none("none".into(), &[]).reason,
            "NoProfile"
        );
        assert_eq!(
            UnusableProfile::none("none".into(), &[bad]).reason,
            "InvalidProfile"
        );
    }
}
