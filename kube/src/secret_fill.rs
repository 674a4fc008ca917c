//! Secrets whose material a component generates itself, once, instead of the chart
//! rendering it (random material in a template changes on every `helm template`): the
//! extender's CA and certificates, the campaign's peer token.
//!
//! The pure part, [`assess`] and [`merge`], decides from the Secret's data whether it is
//! complete (every key there, non-empty: use it as it is) or must be filled (generate the
//! whole set: the keys of a set belong together, such as a CA and the pairs it signed). The
//! shell, [`fill_secret`], reads the Secret, and when it is incomplete writes generated data
//! with an update that carries the resourceVersion it read: of replicas racing on one empty
//! Secret exactly one write succeeds, the others get 409 Conflict, read again and use what
//! the winner wrote. Nothing is ever replaced once complete; to rotate, delete the keys (or
//! the Secret) and restart the components that fill and read it.

use std::collections::BTreeMap;
use std::error::Error;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;

use crate::error::SecretFillError;

/// What a Secret that must hold a set of keys needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Every key is there with a value: use the Secret as it is.
    Complete,
    /// Generate the whole set; these keys are missing or empty (every key when there is no
    /// Secret or it has no data).
    Generate { missing: Vec<String> },
}

/// Decides whether `data` (None: no Secret) holds every one of `keys`.
pub fn assess(data: Option<&BTreeMap<String, Vec<u8>>>, keys: &[&str]) -> Fill {
    let missing: Vec<String> = keys
        .iter()
        .filter(|k| data.and_then(|d| d.get(**k)).is_none_or(|v| v.is_empty()))
        .map(|k| k.to_string())
        .collect();
    if missing.is_empty() {
        Fill::Complete
    } else {
        Fill::Generate { missing }
    }
}

/// The data to write: `existing` with every one of `keys` taken from `generated` (other
/// keys of the Secret, and generated keys not in `keys`, are left as they are). Err: the
/// keys `generated` lacks.
pub fn merge(
    existing: Option<&BTreeMap<String, Vec<u8>>>,
    generated: &BTreeMap<String, Vec<u8>>,
    keys: &[&str],
) -> Result<BTreeMap<String, Vec<u8>>, Vec<String>> {
    let lacking: Vec<String> = keys
        .iter()
        .filter(|k| generated.get(**k).is_none_or(|v| v.is_empty()))
        .map(|k| k.to_string())
        .collect();
    if !lacking.is_empty() {
        return Err(lacking);
    }
    let mut out = existing.cloned().unwrap_or_default();
    for k in keys {
        if let Some(v) = generated.get(*k) {
            out.insert(k.to_string(), v.clone());
        }
    }
    Ok(out)
}

/// How [`fill_secret`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FillAction {
    /// The Secret was complete.
    Kept,
    /// This process generated and wrote these missing keys (the whole set was written).
    Filled { missing: Vec<String> },
    /// Another writer filled it first (409 Conflict); its data is used.
    AdoptedWinner,
}

/// The Secret's data after [`fill_secret`], complete for the keys asked for.
#[derive(Clone, PartialEq, Eq)]
pub struct Filled {
    pub data: BTreeMap<String, Vec<u8>>,
    pub action: FillAction,
}

impl std::fmt::Debug for Filled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys, never the values (secrets).
        f.debug_struct("Filled")
            .field("keys", &self.data.keys().collect::<Vec<_>>())
            .field("action", &self.action)
            .finish()
    }
}

/// Which Secret to fill, with what, written under which field manager.
#[derive(Clone, Copy, Debug)]
pub struct SecretToFill<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// The keys that make the Secret complete; `generate` must produce each of them.
    pub keys: &'a [&'a str],
    pub field_manager: &'a str,
}

/// How many read-then-write rounds before giving up: each lost round means another writer
/// succeeded, so the next read normally finds the Secret complete.
const ROUNDS: usize = 5;

/// Reads the Secret and returns its data when complete; otherwise writes `generate()`'s
/// keys into it (an update carrying the read resourceVersion; a create when there is no
/// Secret) and, on 409 Conflict or AlreadyExists, reads again and uses the winner's data.
pub async fn fill_secret<G>(
    client: &Client,
    target: &SecretToFill<'_>,
    mut generate: G,
) -> Result<Filled, SecretFillError>
where
    G: FnMut() -> Result<BTreeMap<String, Vec<u8>>, Box<dyn Error + Send + Sync>>,
{
    let api: Api<Secret> = Api::namespaced(client.clone(), target.namespace);
    let api_error = |action: &'static str| {
        let (namespace, name) = (target.namespace.to_string(), target.name.to_string());
        move |source: kube::Error| SecretFillError::Api {
            action,
            namespace,
            name,
            source: Box::new(source),
        }
    };
    let pp = PostParams {
        field_manager: Some(target.field_manager.to_string()),
        ..PostParams::default()
    };
    for round in 0..ROUNDS {
        let current = api.get_opt(target.name).await.map_err(api_error("read"))?;
        let data = current.as_ref().map(secret_data);
        let missing = match assess(data.as_ref(), target.keys) {
            Fill::Complete => {
                let action = if round == 0 {
                    FillAction::Kept
                } else {
                    FillAction::AdoptedWinner
                };
                return Ok(Filled {
                    data: data.unwrap_or_default(),
                    action,
                });
            }
            Fill::Generate { missing } => missing,
        };
        let generated = generate().map_err(|source| SecretFillError::Generate {
            namespace: target.namespace.to_string(),
            name: target.name.to_string(),
            source,
        })?;
        let merged = merge(data.as_ref(), &generated, target.keys).map_err(|missing| {
            SecretFillError::Incomplete {
                namespace: target.namespace.to_string(),
                name: target.name.to_string(),
                missing,
            }
        })?;
        let as_bytes = merged
            .iter()
            .map(|(k, v)| (k.clone(), ByteString(v.clone())))
            .collect();
        // The object as read: its metadata.resourceVersion makes a concurrent writer's
        // update fail with 409 Conflict.
        let written = write_data(&api, &pp, target.namespace, target.name, current, as_bytes).await;
        match written {
            Ok(_) => {
                return Ok(Filled {
                    data: merged,
                    action: FillAction::Filled { missing },
                })
            }
            Err(kube::Error::Api(status)) if status.is_conflict() || status.is_already_exists() => {
                tracing::info!(
                    secret = %target.name,
                    namespace = %target.namespace,
                    "another writer changed the Secret first; reading it again"
                );
            }
            Err(e) => {
                let action = if data.is_none() { "create" } else { "update" };
                return Err(api_error(action)(e));
            }
        }
    }
    Err(SecretFillError::Contended {
        namespace: target.namespace.to_string(),
        name: target.name.to_string(),
        rounds: ROUNDS,
    })
}

/// A Secret's data as bytes (`stringData`, which the API server folds into `data` on
/// write, is read too for objects built locally).
pub fn secret_data(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in secret.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone().into_bytes());
    }
    out
}

/// Writes `data` as the whole data of Secret `namespace/name`: a create when `current` (the
/// Secret as read) is None, else a replace of `current`, which carries its
/// metadata.resourceVersion so that a concurrent writer's change fails it with 409 Conflict
/// (a concurrent create, with 409 AlreadyExists).
pub async fn write_data(
    api: &Api<Secret>,
    pp: &PostParams,
    namespace: &str,
    name: &str,
    current: Option<Secret>,
    data: BTreeMap<String, ByteString>,
) -> Result<Secret, kube::Error> {
    match current {
        None => {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(namespace.to_string()),
                    ..ObjectMeta::default()
                },
                type_: Some("Opaque".to_string()),
                data: Some(data),
                ..Secret::default()
            };
            api.create(pp, &secret).await
        }
        Some(mut secret) => {
            secret.data = Some(data);
            secret.string_data = None;
            api.replace(name, pp, &secret).await
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const KEYS: [&str; 3] = ["ca.crt", "tls.crt", "tls.key"];

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn no_secret_or_no_data_needs_every_key() {
        let all = Fill::Generate {
            missing: KEYS.iter().map(|k| k.to_string()).collect(),
        };
        assert_eq!(assess(None, &KEYS), all);
        assert_eq!(assess(Some(&BTreeMap::new()), &KEYS), all);
    }

    #[test]
    fn every_key_with_a_value_is_complete_whatever_else_is_there() {
        let d = data(&[
            ("ca.crt", "a"),
            ("tls.crt", "b"),
            ("tls.key", "c"),
            ("x", ""),
        ]);
        assert_eq!(assess(Some(&d), &KEYS), Fill::Complete);
        assert_eq!(assess(Some(&d), &[]), Fill::Complete);
    }

    #[test]
    fn a_missing_or_empty_key_is_named() {
        let d = data(&[("ca.crt", "a"), ("tls.crt", "")]);
        assert_eq!(
            assess(Some(&d), &KEYS),
            Fill::Generate {
                missing: vec!["tls.crt".into(), "tls.key".into()]
            }
        );
    }

    #[test]
    fn merging_replaces_the_whole_set_and_keeps_other_keys() {
        // A partial set (say a CA whose pairs were deleted) is replaced as a whole: the
        // generated CA signed the generated pairs, the old one did not.
        let existing = data(&[("ca.crt", "old"), ("note", "kept")]);
        let generated = data(&[
            ("ca.crt", "A"),
            ("tls.crt", "B"),
            ("tls.key", "C"),
            ("extra", "x"),
        ]);
        let merged = merge(Some(&existing), &generated, &KEYS).unwrap();
        assert_eq!(
            merged,
            data(&[
                ("ca.crt", "A"),
                ("tls.crt", "B"),
                ("tls.key", "C"),
                ("note", "kept")
            ])
        );
        assert_eq!(assess(Some(&merged), &KEYS), Fill::Complete);
        assert_eq!(
            merge(None, &data(&[("ca.crt", "A"), ("tls.key", "")]), &KEYS),
            Err(vec!["tls.crt".to_string(), "tls.key".to_string()])
        );
    }

    #[test]
    fn string_data_is_read_and_debug_shows_no_values() {
        let secret = Secret {
            data: Some(BTreeMap::from([(
                "a".to_string(),
                ByteString(b"1".to_vec()),
            )])),
            string_data: Some(BTreeMap::from([("b".to_string(), "2".to_string())])),
            ..Secret::default()
        };
        let d = secret_data(&secret);
        assert_eq!(d, data(&[("a", "1"), ("b", "2")]));
        let filled = Filled {
            data: data(&[("token", "s3cret-value")]),
            action: FillAction::Kept,
        };
        let shown = format!("{filled:?}");
        assert!(
            shown.contains("token") && !shown.contains("s3cret"),
            "{shown}"
        );
    }
}
