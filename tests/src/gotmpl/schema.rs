//! A JSON Schema validator for the keywords `values.schema.json` files use: `type`,
//! `properties`, `required`, `additionalProperties`, `items`, `enum`, `const`, `minimum`,
//! `maximum`, `minLength`, `maxLength`, `minItems`, `anyOf`, `oneOf`. Any other
//! validation keyword is an error rather than silently ignored.

use serde_json::Value as Json;

const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "title",
    "description",
    "default",
    "examples",
    "$comment",
];

/// Validates `value` against `schema`; returns one message per violation
/// (`webhook.failurePolicy: must be one of ["Fail","Ignore"]`).
pub fn validate(schema: &Json, value: &Json) -> Result<Vec<String>, String> {
    let mut errs = Vec::new();
    check(schema, value, "", &mut errs)?;
    Ok(errs)
}

fn path_or_root(path: &str) -> &str {
    if path.is_empty() {
        "(root)"
    } else {
        path
    }
}

fn type_ok(t: &str, v: &Json) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

fn type_name(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(n) if n.is_f64() => "number",
        Json::Number(_) => "integer",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

fn check(schema: &Json, v: &Json, path: &str, errs: &mut Vec<String>) -> Result<(), String> {
    let Some(s) = schema.as_object() else {
        return match schema {
            Json::Bool(true) => Ok(()),
            Json::Bool(false) => {
                errs.push(format!("{}: not allowed", path_or_root(path)));
                Ok(())
            }
            _ => Err(format!("schema at {} is not an object", path_or_root(path))),
        };
    };
    let p = path_or_root(path);
    for (k, kv) in s {
        match k.as_str() {
            k if ANNOTATIONS.contains(&k) => {}
            "type" => {
                let types: Vec<&str> = match kv {
                    Json::String(t) => vec![t.as_str()],
                    Json::Array(ts) => ts.iter().filter_map(Json::as_str).collect(),
                    _ => return Err(format!("bad type keyword at {p}")),
                };
                if !types.iter().any(|t| type_ok(t, v)) {
                    errs.push(format!(
                        "{p}: invalid type, expected {}, given {}",
                        types.join(" or "),
                        type_name(v)
                    ));
                    // Further keywords would only repeat the problem.
                    return Ok(());
                }
            }
            "properties" => {
                let (Some(props), Some(obj)) = (kv.as_object(), v.as_object()) else {
                    continue;
                };
                for (name, sub) in props {
                    if let Some(x) = obj.get(name) {
                        check(sub, x, &join(path, name), errs)?;
                    }
                }
            }
            "additionalProperties" => {
                let Some(obj) = v.as_object() else { continue };
                let known = s.get("properties").and_then(Json::as_object);
                for (name, x) in obj {
                    if known.is_some_and(|k| k.contains_key(name)) {
                        continue;
                    }
                    match kv {
                        Json::Bool(false) => errs.push(format!(
                            "{}: additional property {name:?} is not allowed",
                            p
                        )),
                        Json::Bool(true) => {}
                        sub => check(sub, x, &join(path, name), errs)?,
                    }
                }
            }
            "required" => {
                let Some(obj) = v.as_object() else { continue };
                for r in kv.as_array().into_iter().flatten().filter_map(Json::as_str) {
                    if !obj.contains_key(r) {
                        errs.push(format!("{p}: {r} is required"));
                    }
                }
            }
            "items" => {
                let Some(arr) = v.as_array() else { continue };
                for (i, x) in arr.iter().enumerate() {
                    check(kv, x, &format!("{path}[{i}]"), errs)?;
                }
            }
            "enum" => {
                let options = kv.as_array().ok_or_else(|| format!("bad enum at {p}"))?;
                if !options.contains(v) {
                    errs.push(format!(
                        "{p}: must be one of {}",
                        serde_json::to_string(options).unwrap_or_default()
                    ));
                }
            }
            "const" => {
                if kv != v {
                    errs.push(format!("{p}: must be {kv}"));
                }
            }
            "minimum" | "maximum" => {
                let (Some(limit), Some(x)) = (kv.as_f64(), v.as_f64()) else {
                    continue;
                };
                if (k == "minimum" && x < limit) || (k == "maximum" && x > limit) {
                    let word = if k == "minimum" {
                        "greater than or equal to"
                    } else {
                        "less than or equal to"
                    };
                    errs.push(format!("{p}: must be {word} {kv}"));
                }
            }
            "minLength" | "maxLength" => {
                let (Some(limit), Some(x)) = (kv.as_u64(), v.as_str()) else {
                    continue;
                };
                let len = x.chars().count() as u64;
                if (k == "minLength" && len < limit) || (k == "maxLength" && len > limit) {
                    errs.push(format!(
                        "{p}: length must be {} {limit}",
                        if k == "minLength" {
                            "at least"
                        } else {
                            "at most"
                        }
                    ));
                }
            }
            "minItems" => {
                let (Some(limit), Some(x)) = (kv.as_u64(), v.as_array()) else {
                    continue;
                };
                if (x.len() as u64) < limit {
                    errs.push(format!("{p}: must have at least {limit} items"));
                }
            }
            "anyOf" | "oneOf" => {
                let options = kv.as_array().ok_or_else(|| format!("bad {k} at {p}"))?;
                let mut passing = 0;
                for o in options {
                    let mut sub = Vec::new();
                    check(o, v, path, &mut sub)?;
                    if sub.is_empty() {
                        passing += 1;
                    }
                }
                if passing == 0 || (k == "oneOf" && passing > 1) {
                    errs.push(format!(
                        "{p}: must match {} of the {k} schemas (matched {passing})",
                        if k == "oneOf" {
                            "exactly one"
                        } else {
                            "at least one"
                        }
                    ));
                }
            }
            other => return Err(format!("unsupported schema keyword {other:?} at {p}")),
        }
    }
    Ok(())
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}
