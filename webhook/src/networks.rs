//! The Multus `k8s.v1.cni.cncf.io/networks` annotation. It comes in two forms: a comma list
//! (`net-a, other-ns/net-b@eth1`) and a JSON list of objects
//! (`[{"name":"net-a","namespace":"other-ns","interface":"eth1"}]`). Merging keeps the form
//! and every entry the user wrote, and appends only networks not yet listed.

use serde_json::{Map, Value};

use crate::error::NetworksError;

/// A network reference `[namespace/]name[@interface]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkRef {
    pub namespace: Option<String>,
    pub name: String,
    pub interface: Option<String>,
}

impl NetworkRef {
    /// Parses the comma-list element form.
    pub fn parse(text: &str) -> Result<Self, NetworksError> {
        let text = text.trim();
        let (rest, interface) = match text.split_once('@') {
            Some((r, i)) if !i.is_empty() => (r, Some(i.to_string())),
            Some(_) => return Err(NetworksError::EmptyInterface { text: text.into() }),
            None => (text, None),
        };
        let (namespace, name) = match rest.split_once('/') {
            Some((ns, n)) if !ns.is_empty() => (Some(ns.to_string()), n),
            Some(_) => return Err(NetworksError::EmptyNamespace { text: text.into() }),
            None => (None, rest),
        };
        if name.is_empty() || name.contains('/') {
            return Err(NetworksError::NoName { text: text.into() });
        }
        Ok(Self {
            namespace,
            name: name.to_string(),
            interface,
        })
    }

    /// Identity for de-duplication: namespace (defaulting to the pod's) and name. The
    /// interface does not count: the same network twice is a conflict, not a wish.
    fn key<'a>(&'a self, pod_namespace: &'a str) -> (&'a str, &'a str) {
        (
            self.namespace.as_deref().unwrap_or(pod_namespace),
            self.name.as_str(),
        )
    }

    fn to_list_element(&self) -> String {
        let mut s = String::new();
        if let Some(ns) = &self.namespace {
            s.push_str(ns);
            s.push('/');
        }
        s.push_str(&self.name);
        if let Some(i) = &self.interface {
            s.push('@');
            s.push_str(i);
        }
        s
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("name".into(), Value::String(self.name.clone()));
        if let Some(ns) = &self.namespace {
            m.insert("namespace".into(), Value::String(ns.clone()));
        }
        if let Some(i) = &self.interface {
            m.insert("interface".into(), Value::String(i.clone()));
        }
        Value::Object(m)
    }
}

/// The parsed annotation, in the form the user wrote it.
#[derive(Clone, Debug, PartialEq)]
pub enum NetworksAnnotation {
    List(Vec<NetworkRef>),
    Json(Vec<Value>),
}

impl NetworksAnnotation {
    pub fn parse(text: &str) -> Result<Self, NetworksError> {
        let t = text.trim();
        if t.starts_with('[') {
            let items: Vec<Value> =
                serde_json::from_str(t).map_err(|source| NetworksError::Json { source })?;
            for item in &items {
                match item.get("name") {
                    Some(Value::String(n)) if !n.is_empty() => {}
                    _ => return Err(NetworksError::UnnamedEntry),
                }
            }
            Ok(NetworksAnnotation::Json(items))
        } else {
            let refs = t
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(NetworkRef::parse)
                .collect::<Result<Vec<_>, _>>()?;
            Ok(NetworksAnnotation::List(refs))
        }
    }

    fn contains(&self, wanted: &NetworkRef, pod_namespace: &str) -> bool {
        let key = wanted.key(pod_namespace);
        match self {
            NetworksAnnotation::List(refs) => refs.iter().any(|r| r.key(pod_namespace) == key),
            NetworksAnnotation::Json(items) => items.iter().any(|item| {
                let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
                let ns = item
                    .get("namespace")
                    .and_then(Value::as_str)
                    .unwrap_or(pod_namespace);
                (ns, name) == key
            }),
        }
    }
}

/// Merges the profile's networks into the annotation. `Ok(None)` when nothing is missing.
pub fn merge(
    existing: Option<&str>,
    wanted: &[String],
    pod_namespace: &str,
) -> Result<Option<String>, NetworksError> {
    let parsed = match existing {
        Some(text) if !text.trim().is_empty() => NetworksAnnotation::parse(text)?,
        _ => NetworksAnnotation::List(Vec::new()),
    };
    let mut missing = Vec::new();
    for w in wanted {
        let r = NetworkRef::parse(w)?;
        let already = parsed.contains(&r, pod_namespace)
            || missing
                .iter()
                .any(|m: &NetworkRef| m.key(pod_namespace) == r.key(pod_namespace));
        if !already {
            missing.push(r);
        }
    }
    if missing.is_empty() {
        return Ok(None);
    }
    match parsed {
        NetworksAnnotation::List(_) => {
            // Append to the user's text as written rather than re-rendering it.
            let user = existing.map(str::trim).unwrap_or_default();
            let added: Vec<String> = missing.iter().map(NetworkRef::to_list_element).collect();
            Ok(Some(if user.is_empty() {
                added.join(",")
            } else {
                format!("{user},{}", added.join(","))
            }))
        }
        NetworksAnnotation::Json(mut items) => {
            items.extend(missing.iter().map(NetworkRef::to_json));
            serde_json::to_string(&items)
                .map(Some)
                .map_err(|source| NetworksError::Render { source })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted() -> Vec<String> {
        vec![
            "gpu-rdma/sriov-rdma-0".into(),
            "gpu-rdma/sriov-rdma-1".into(),
        ]
    }

    #[test]
    fn empty_annotation_gets_the_comma_form() {
        assert_eq!(
            merge(None, &wanted(), "ml").unwrap().as_deref(),
            Some("gpu-rdma/sriov-rdma-0,gpu-rdma/sriov-rdma-1")
        );
    }

    #[test]
    fn comma_list_keeps_user_entries_and_skips_present_ones() {
        let out = merge(
            Some("storage-net, gpu-rdma/sriov-rdma-0@net1"),
            &wanted(),
            "ml",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            out,
            "storage-net, gpu-rdma/sriov-rdma-0@net1,gpu-rdma/sriov-rdma-1"
        );
        assert_eq!(merge(Some(&out), &wanted(), "ml").unwrap(), None);
    }

    #[test]
    fn json_list_stays_json_and_keeps_user_objects() {
        let user = r#"[{"name":"storage-net","interface":"st0","ips":["10.0.0.5/24"]}]"#;
        let out = merge(Some(user), &wanted(), "ml").unwrap().unwrap();
        let v: Vec<Value> = serde_json::from_str(&out).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0]["ips"][0], "10.0.0.5/24");
        assert_eq!(v[1]["namespace"], "gpu-rdma");
        assert_eq!(v[2]["name"], "sriov-rdma-1");
        assert_eq!(merge(Some(&out), &wanted(), "ml").unwrap(), None);
    }

    #[test]
    fn unqualified_names_default_to_the_pod_namespace() {
        let out = merge(Some("sriov-rdma-0"), &wanted(), "gpu-rdma").unwrap();
        assert_eq!(out.as_deref(), Some("sriov-rdma-0,gpu-rdma/sriov-rdma-1"));
    }

    #[test]
    fn malformed_annotations_are_errors() {
        let e = merge(Some("[{\"name\": "), &wanted(), "ml").unwrap_err();
        assert!(matches!(e, NetworksError::Json { .. }), "{e}");
        assert!(
            railguard_api::error::error_chain(&e).starts_with("JSON network list does not parse: ")
        );
        let e = merge(Some("[{\"interface\": \"x\"}]"), &wanted(), "ml").unwrap_err();
        assert!(e.to_string().contains("without a name"));
        assert!(merge(Some("/bad"), &wanted(), "ml").is_err());
    }
}
