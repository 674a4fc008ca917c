//! Typed JSON-patch operations. railguard only ever adds (or replaces a string annotation it
//! merged); it never removes and never overwrites an array the user wrote — it appends with
//! `/-` instead.

use jsonptr::PointerBuf;
use serde_json::Value;

/// One JSON-patch operation.
#[derive(Clone, Debug, PartialEq)]
pub enum PatchOp {
    /// Add a member or append to an array (`.../-`).
    Add { path: PointerBuf, value: Value },
    /// Replace an existing scalar (a merged annotation).
    Replace { path: PointerBuf, value: Value },
}

impl PatchOp {
    pub fn add(path: PointerBuf, value: Value) -> Self {
        PatchOp::Add { path, value }
    }

    pub fn path(&self) -> &PointerBuf {
        match self {
            PatchOp::Add { path, .. } | PatchOp::Replace { path, .. } => path,
        }
    }

    fn into_operation(self) -> json_patch::PatchOperation {
        match self {
            PatchOp::Add { path, value } => {
                json_patch::PatchOperation::Add(json_patch::AddOperation { path, value })
            }
            PatchOp::Replace { path, value } => {
                json_patch::PatchOperation::Replace(json_patch::ReplaceOperation { path, value })
            }
        }
    }
}

/// Builds a JSON pointer from unescaped tokens; `/` becomes `~1` and `~` becomes `~0`.
pub fn pointer<'a>(tokens: impl IntoIterator<Item = &'a str>) -> PointerBuf {
    PointerBuf::from_tokens(tokens)
}

/// A pointer below `base`.
pub fn child<'a>(base: &PointerBuf, tokens: impl IntoIterator<Item = &'a str>) -> PointerBuf {
    let mut p = base.clone();
    for t in tokens {
        p.push_back(t);
    }
    p
}

/// The operations as a `json_patch::Patch`.
pub fn to_patch(ops: Vec<PatchOp>) -> json_patch::Patch {
    json_patch::Patch(ops.into_iter().map(PatchOp::into_operation).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slashes_and_tildes_are_escaped() {
        let p = pointer(["metadata", "annotations", "railguard.io/profile"]);
        assert_eq!(p.as_str(), "/metadata/annotations/railguard.io~1profile");
        let q = child(&p, ["a~b"]);
        assert_eq!(
            q.as_str(),
            "/metadata/annotations/railguard.io~1profile/a~0b"
        );
    }

    #[test]
    fn ops_serialize_as_rfc6902() {
        let patch = to_patch(vec![
            PatchOp::add(
                pointer(["spec", "volumes", "-"]),
                serde_json::json!({"name": "x"}),
            ),
            PatchOp::Replace {
                path: pointer(["metadata", "annotations", "k8s.v1.cni.cncf.io/networks"]),
                value: serde_json::json!("a,b"),
            },
        ]);
        let v = serde_json::to_value(&patch).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                {"op": "add", "path": "/spec/volumes/-", "value": {"name": "x"}},
                {"op": "replace", "path": "/metadata/annotations/k8s.v1.cni.cncf.io~1networks", "value": "a,b"}
            ])
        );
    }
}
