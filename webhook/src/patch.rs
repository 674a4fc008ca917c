//! Typed JSON-patch operations. railguard only ever adds (or replaces a string annotation it
//! merged); it never removes and never overwrites an array the user wrote — it appends with
//! `/-` instead.

use base64::Engine as _;
use jsonptr::PointerBuf;

use crate::json_text::{self, JsonText};

/// One JSON-patch operation. The value is JSON text, written once by the step that decides
/// it and copied into the patch as it is.
#[derive(Clone, Debug, PartialEq)]
pub enum PatchOp {
    /// Add a member or append to an array (`.../-`).
    Add { path: PointerBuf, value: JsonText },
    /// Replace an existing scalar (a merged annotation).
    Replace { path: PointerBuf, value: JsonText },
}

impl PatchOp {
    pub fn add(path: PointerBuf, value: JsonText) -> Self {
        PatchOp::Add { path, value }
    }

    pub fn path(&self) -> &PointerBuf {
        match self {
            PatchOp::Add { path, .. } | PatchOp::Replace { path, .. } => path,
        }
    }

    #[cfg(test)]
    #[allow(clippy::unwrap_used)] // JsonText is valid JSON by construction
    fn into_operation(self) -> json_patch::PatchOperation {
        match self {
            PatchOp::Add { path, value } => {
                json_patch::PatchOperation::Add(json_patch::AddOperation {
                    path,
                    value: value.to_value().unwrap(),
                })
            }
            PatchOp::Replace { path, value } => {
                json_patch::PatchOperation::Replace(json_patch::ReplaceOperation {
                    path,
                    value: value.to_value().unwrap(),
                })
            }
        }
    }
}

/// Builds a JSON pointer from unescaped tokens; `/` becomes `~1` and `~` becomes `~0`.
pub fn pointer<'a>(tokens: impl IntoIterator<Item = &'a str> + Clone) -> PointerBuf {
    let mut text = String::with_capacity(POINTER_CAPACITY);
    encode_tokens(&mut text, tokens.clone());
    // One buffer written whole (`PointerBuf::push_back` grows its string token by token,
    // the largest cost of small patches); it is valid by construction, and should parsing
    // ever disagree the token-by-token form gives the same pointer.
    PointerBuf::parse(text).unwrap_or_else(|_| PointerBuf::from_tokens(tokens))
}

/// A pointer below `base`.
pub fn child<'a>(
    base: &PointerBuf,
    tokens: impl IntoIterator<Item = &'a str> + Clone,
) -> PointerBuf {
    let mut text = String::with_capacity(base.as_str().len() + POINTER_CAPACITY);
    text.push_str(base.as_str());
    encode_tokens(&mut text, tokens.clone());
    PointerBuf::parse(text).unwrap_or_else(|_| {
        let mut p = base.clone();
        for t in tokens {
            p.push_back(t);
        }
        p
    })
}

/// Room for the pointers railguard writes (`/spec/containers/0/securityContext/...`).
const POINTER_CAPACITY: usize = 64;

fn encode_tokens<'a>(out: &mut String, tokens: impl IntoIterator<Item = &'a str>) {
    for token in tokens {
        out.push('/');
        if token.contains(['~', '/']) {
            for c in token.chars() {
                match c {
                    '~' => out.push_str("~0"),
                    '/' => out.push_str("~1"),
                    c => out.push(c),
                }
            }
        } else {
            out.push_str(token);
        }
    }
}

/// The operations as a `json_patch::Patch` (the tests apply it with a real implementation).
#[cfg(test)]
pub(crate) fn to_patch(ops: Vec<PatchOp>) -> json_patch::Patch {
    json_patch::Patch(ops.into_iter().map(PatchOp::into_operation).collect())
}

/// Appends the operations as an RFC 6902 document: what serde_json writes for the same
/// operations as a `json_patch::Patch` (`op`, `path`, `value` in that order), each value
/// copied in as the step wrote it.
pub fn write_patch(ops: &[PatchOp], out: &mut String) {
    out.push('[');
    for (i, op) in ops.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let (head, path, value) = match op {
            PatchOp::Add { path, value } => (r#"{"op":"add","path":"#, path, value),
            PatchOp::Replace { path, value } => (r#"{"op":"replace","path":"#, path, value),
        };
        out.push_str(head);
        json_text::push_str(out, path.as_str());
        out.push_str(r#","value":"#);
        out.push_str(value.as_str());
        out.push('}');
    }
    out.push(']');
}

/// A JSON-patch document and its base64 form, written once: a cached decision answers many
/// reviews with the same patch. Dereferences to the JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedPatch {
    json: Vec<u8>,
    base64: String,
}

impl EncodedPatch {
    pub fn new(json: Vec<u8>) -> Self {
        let base64 = base64::engine::general_purpose::STANDARD.encode(&json);
        Self { json, base64 }
    }

    /// The patch as base64, the form the AdmissionReview carries.
    pub fn base64(&self) -> &str {
        &self.base64
    }
}

impl std::ops::Deref for EncodedPatch {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.json
    }
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
    fn pointers_equal_the_token_by_token_form() {
        let cases: [&[&str]; 6] = [
            &[],
            &[""],
            &["spec", "containers", "0", "env", "-"],
            &["~", "/", "~1", "/~0/", "a~b/c"],
            &["ünïcode/ключ", "~~//"],
            &["x"; 40],
        ];
        for tokens in cases {
            let expected = PointerBuf::from_tokens(tokens.iter().copied());
            assert_eq!(pointer(tokens.iter().copied()), expected, "{tokens:?}");
            let base = pointer(["metadata", "a/b"]);
            let mut below = base.clone();
            for t in tokens {
                below.push_back(*t);
            }
            assert_eq!(child(&base, tokens.iter().copied()), below, "{tokens:?}");
        }
    }

    fn sample_ops() -> Vec<PatchOp> {
        vec![
            PatchOp::add(
                pointer(["spec", "volumes", "-"]),
                JsonText::object(|o| {
                    o.str("name", "x");
                }),
            ),
            PatchOp::Replace {
                path: pointer(["metadata", "annotations", "k8s.v1.cni.cncf.io/networks"]),
                value: JsonText::string("a,b"),
            },
        ]
    }

    #[test]
    fn ops_serialize_as_rfc6902() {
        let v = serde_json::to_value(to_patch(sample_ops())).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                {"op": "add", "path": "/spec/volumes/-", "value": {"name": "x"}},
                {"op": "replace", "path": "/metadata/annotations/k8s.v1.cni.cncf.io~1networks", "value": "a,b"}
            ])
        );
    }

    #[test]
    fn the_written_patch_is_the_one_serde_json_writes() {
        let mut ops = sample_ops();
        ops.push(PatchOp::add(
            pointer(["metadata", "annotations", "a~b/c\"d\\e\u{1}"]),
            JsonText::of(&serde_json::json!({"k": ["x", 1, true, null, {"nested": "é\n"}]}))
                .unwrap(),
        ));
        ops.push(PatchOp::add(
            pointer(["spec", "containers", "0", "env", "-"]),
            JsonText::object(|o| {
                o.str("name", "NCCL_IB_HCA")
                    .str("value", "=mlx5_0:1,mlx5_1:1");
            }),
        ));
        for ops in [Vec::new(), ops] {
            let mut written = String::new();
            write_patch(&ops, &mut written);
            let reference = serde_json::to_string(&to_patch(ops.clone())).unwrap();
            assert_eq!(written, reference);
            let parsed: json_patch::Patch = serde_json::from_str(&written).unwrap();
            assert_eq!(parsed, to_patch(ops));
        }
        let mut written = String::new();
        write_patch(&sample_ops(), &mut written);
        assert!(
            written.contains(r#""path":"/metadata/annotations/k8s.v1.cni.cncf.io~1networks""#),
            "slashes in keys escaped as ~1: {written}"
        );
        let mut written = String::new();
        let tilde = PatchOp::add(pointer(["a~b", "c/d"]), JsonText::string("v"));
        write_patch(&[tilde], &mut written);
        assert_eq!(
            written, r#"[{"op":"add","path":"/a~0b/c~1d","value":"v"}]"#,
            "tildes escaped as ~0"
        );
    }
}
