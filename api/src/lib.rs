//! railguard's shared model: the `FabricProfile` CRD, the Node label/annotation/condition
//! contract, the `Certificate` record, the rail-layout signature and the interpretation of a
//! Node's fabric state. Pure data and functions, no IO.
#![forbid(unsafe_code)]

pub mod campaign_findings;
pub mod certificate;
pub mod crd;
pub mod dra;
pub mod error;
pub mod finding;
pub mod fleet;
pub mod invasive;
pub mod keys;
pub mod node;
pub mod pod;
pub mod profile;
pub mod profile_list;
pub mod quantity;
pub mod selector;
pub mod signature;
pub mod upkeep;

pub use certificate::{
    Certificate, GpuAffinity, NcclResult, PathType, RailFault, RailResult, RailVerdict, RenewedBy,
    TrafficRenewal, Transport, Verdict,
};
pub use crd::{crd_upgrade_step, crd_yaml, fabric_profile_crd, CrdUpgradeStep};
pub use error::{CertificateError, CrdVersionError, ProfileError, QuantityError};
pub use finding::{Finding, FindingKind, Severity};
pub use node::{FabricState, NodeFabric};
pub use profile::{FabricProfile, FabricProfileSpec, LinkLayer, RailSpec};
pub use profile_list::{decode_profile, InvalidProfile, ProfileObject, ValidCondition};
pub use signature::{certified_signature, layout_signature, RailLayout};

/// Parses a YAML stream of FabricProfile documents (e.g. `--profiles FILE`), skipping empty
/// documents. Each profile is validated.
pub fn profiles_from_yaml(text: &str) -> Result<Vec<FabricProfile>, ProfileError> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let value = serde_yaml_ng::Value::deserialize(doc)
            .map_err(|source| ProfileError::Yaml { source })?;
        if value.is_null() {
            continue;
        }
        let profile: FabricProfile =
            serde_yaml_ng::from_value(value).map_err(|source| ProfileError::Yaml { source })?;
        profile.validate()?;
        out.push(profile);
    }
    Ok(out)
}
