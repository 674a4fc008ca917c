//! Template values: the dynamic data a Go template sees, with Go's printing and truthiness.

use std::collections::BTreeMap;

/// A value as a Go template sees it. Helm loads values through JSON, so every number that
/// comes from YAML is a `Float` (Go's float64); template literals such as `2` are `Int`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// No value at all (Go's invalid `reflect.Value`): a missing key under the default
    /// `missingkey` option. Prints as `<no value>`.
    Invalid,
    /// A nil interface: a key whose value is null, or a missing key under `missingkey=zero`.
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Value>),
    Map(BTreeMap<String, Value>),
    /// Helm's `.Capabilities.APIVersions`: has a `Has` method.
    ApiVersions(Vec<String>),
    /// Helm's `.Files`: has `Get` and `Glob`-less access by path.
    Files(BTreeMap<String, String>),
}

impl Value {
    /// Go's truth: false, 0, nil, empty string/list/map are false; everything else true.
    pub fn truthy(&self) -> bool {
        match self {
            Value::Invalid | Value::Nil => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Map(m) => !m.is_empty(),
            Value::ApiVersions(_) | Value::Files(_) => true,
        }
    }

    /// True for `Invalid` and `Nil`.
    pub fn is_nil(&self) -> bool {
        matches!(self, Value::Invalid | Value::Nil)
    }

    /// The Go type name, for error messages and `kindOf`.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Invalid => "invalid",
            Value::Nil => "<nil>",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float64",
            Value::Str(_) => "string",
            Value::List(_) => "slice",
            Value::Map(_) => "map",
            Value::ApiVersions(_) | Value::Files(_) => "struct",
        }
    }

    /// Formats like Go's `fmt.Sprint` (`%v`) as used by template output and `print`.
    pub fn to_go_string(&self) -> String {
        let mut out = String::new();
        self.write_go(&mut out, true);
        out
    }

    fn write_go(&self, out: &mut String, top: bool) {
        match self {
            // At top level text/template prints `<no value>`; nested inside a container
            // fmt prints `<nil>`.
            Value::Invalid | Value::Nil => out.push_str(if top { "<no value>" } else { "<nil>" }),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Int(i) => out.push_str(&i.to_string()),
            Value::Float(f) => out.push_str(&go_float(*f)),
            Value::Str(s) => out.push_str(s),
            Value::List(l) => {
                out.push('[');
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    v.write_go(out, false);
                }
                out.push(']');
            }
            Value::Map(m) => {
                out.push_str("map[");
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    out.push_str(k);
                    out.push(':');
                    v.write_go(out, false);
                }
                out.push(']');
            }
            Value::ApiVersions(v) => {
                out.push('[');
                out.push_str(&v.join(" "));
                out.push(']');
            }
            Value::Files(_) => out.push_str("{files}"),
        }
    }

    /// Converts parsed YAML into a value the way Helm loads values (numbers become float64).
    pub fn from_yaml(y: &serde_yaml_ng::Value) -> Value {
        match y {
            serde_yaml_ng::Value::Null => Value::Nil,
            serde_yaml_ng::Value::Bool(b) => Value::Bool(*b),
            serde_yaml_ng::Value::Number(n) => Value::Float(n.as_f64().unwrap_or(0.0)),
            serde_yaml_ng::Value::String(s) => Value::Str(s.clone()),
            serde_yaml_ng::Value::Sequence(s) => {
                Value::List(s.iter().map(Value::from_yaml).collect())
            }
            serde_yaml_ng::Value::Mapping(m) => Value::Map(
                m.iter()
                    .map(|(k, v)| (yaml_key(k), Value::from_yaml(v)))
                    .collect(),
            ),
            serde_yaml_ng::Value::Tagged(t) => Value::from_yaml(&t.value),
        }
    }

    /// Converts to YAML for `toYaml`: integral floats become integers, as Go's JSON
    /// round trip in `sigs.k8s.io/yaml` does.
    pub fn to_yaml(&self) -> serde_yaml_ng::Value {
        match self {
            Value::Invalid | Value::Nil => serde_yaml_ng::Value::Null,
            Value::Bool(b) => serde_yaml_ng::Value::Bool(*b),
            Value::Int(i) => serde_yaml_ng::Value::Number((*i).into()),
            Value::Float(f) => {
                if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
                    serde_yaml_ng::Value::Number((*f as i64).into())
                } else {
                    serde_yaml_ng::Value::Number((*f).into())
                }
            }
            Value::Str(s) => serde_yaml_ng::Value::String(s.clone()),
            Value::List(l) => {
                serde_yaml_ng::Value::Sequence(l.iter().map(Value::to_yaml).collect())
            }
            Value::Map(m) => serde_yaml_ng::Value::Mapping(
                m.iter()
                    .map(|(k, v)| (serde_yaml_ng::Value::String(k.clone()), v.to_yaml()))
                    .collect(),
            ),
            Value::ApiVersions(v) => serde_yaml_ng::Value::Sequence(
                v.iter()
                    .map(|s| serde_yaml_ng::Value::String(s.clone()))
                    .collect(),
            ),
            Value::Files(_) => serde_yaml_ng::Value::Mapping(Default::default()),
        }
    }

    /// Converts to JSON for `toJson` (same number rule as [`Value::to_yaml`]).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Invalid | Value::Nil => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::Float(f) => {
                if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
                    serde_json::Value::from(*f as i64)
                } else {
                    serde_json::Number::from_f64(*f)
                        .map(serde_json::Value::Number)
                        .unwrap_or(serde_json::Value::Null)
                }
            }
            Value::Str(s) => serde_json::Value::String(s.clone()),
            Value::List(l) => serde_json::Value::Array(l.iter().map(Value::to_json).collect()),
            Value::Map(m) => {
                let mut obj = serde_json::Map::new();
                for (k, v) in m {
                    obj.insert(k.clone(), v.to_json());
                }
                serde_json::Value::Object(obj)
            }
            Value::ApiVersions(v) => serde_json::Value::from(v.clone()),
            Value::Files(_) => serde_json::Value::Object(Default::default()),
        }
    }
}

fn yaml_key(k: &serde_yaml_ng::Value) -> String {
    match k {
        serde_yaml_ng::Value::String(s) => s.clone(),
        other => serde_yaml_ng::to_string(other)
            .map(|s| s.trim_end().to_string())
            .unwrap_or_default(),
    }
}

/// Go's `%v` for a float64 (`strconv.FormatFloat(f, 'g', -1, 64)`): shortest digits, and
/// exponent form when the decimal exponent is below -4 or at least 6 — the reason Helm
/// prints a value of 1000000 as `1e+06`.
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-tripping digits, like Go's shortest mode.
    let e = format!("{f:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        // Plain decimal with the shortest digits.
        format!("{f}")
    }
}
