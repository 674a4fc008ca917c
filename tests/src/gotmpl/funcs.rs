//! The functions templates may call: Go's builtins and the Sprig/Helm subset charts use.
//! `and`, `or` and `include` need the executor and live there.

use std::collections::BTreeMap;

use super::value::{go_float, Value};

const NAMES: &[&str] = &[
    // Go builtins
    "and",
    "or",
    "not",
    "len",
    "index",
    "print",
    "printf",
    "println",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    // Helm
    "include",
    "required",
    "toYaml",
    "toJson",
    "lookup",
    "fail",
    // Sprig
    "default",
    "empty",
    "coalesce",
    "ternary",
    "quote",
    "squote",
    "indent",
    "nindent",
    "b64enc",
    "b64dec",
    "trunc",
    "until",
    "trimSuffix",
    "trimPrefix",
    "trim",
    "replace",
    "lower",
    "upper",
    "contains",
    "hasPrefix",
    "hasSuffix",
    "join",
    "dict",
    "list",
    "hasKey",
    "get",
    "keys",
    "merge",
    "int",
    "int64",
    "float64",
    "toString",
    "add",
    "sub",
    "sha256sum",
    "randAlphaNum",
    "genCA",
    "genSignedCert",
    "kindIs",
    "kindOf",
    "splitList",
    "has",
    "append",
];

/// True when `name` is a function templates may call.
pub fn is_function(name: &str) -> bool {
    NAMES.contains(&name)
}

/// Calls function `name` with evaluated arguments.
pub(crate) fn call(name: &str, args: Vec<Value>) -> Result<Value, String> {
    let n = args.len();
    let want = |k: usize| -> Result<(), String> {
        if n == k {
            Ok(())
        } else {
            Err(format!("wrong number of args for {name}: want {k} got {n}"))
        }
    };
    let a = |i: usize| args.get(i).cloned().unwrap_or(Value::Nil);
    Ok(match name {
        "not" => {
            want(1)?;
            Value::Bool(!a(0).truthy())
        }
        "len" => {
            want(1)?;
            match a(0) {
                Value::Str(s) => Value::Int(s.len() as i64),
                Value::List(l) => Value::Int(l.len() as i64),
                Value::Map(m) => Value::Int(m.len() as i64),
                Value::Invalid | Value::Nil => return Err("len of nil pointer".into()),
                other => return Err(format!("len of type {}", other.kind())),
            }
        }
        "index" => {
            if n == 0 {
                return Err("wrong number of args for index: want at least 1 got 0".into());
            }
            let mut item = a(0);
            for idx in &args[1..] {
                item = match (item, idx) {
                    (Value::Map(mut m), Value::Str(k)) => m.remove(k).unwrap_or(Value::Nil),
                    (Value::Map(_), other) => {
                        return Err(format!("value has type {}; should be string", other.kind()))
                    }
                    (Value::List(l), Value::Int(i)) => {
                        if *i < 0 || *i as usize >= l.len() {
                            return Err(format!("index out of range: {i}"));
                        }
                        l[*i as usize].clone()
                    }
                    (Value::List(_), other) => {
                        return Err(format!(
                            "cannot index slice/array with type {}",
                            other.kind()
                        ))
                    }
                    (Value::Invalid | Value::Nil, _) => return Err("index of untyped nil".into()),
                    (other, _) => return Err(format!("can't index item of type {}", other.kind())),
                };
            }
            item
        }
        "print" => Value::Str(go_sprint(&args)),
        "println" => Value::Str(
            args.iter()
                .map(|v| v.to_go_string())
                .collect::<Vec<_>>()
                .join(" ")
                + "\n",
        ),
        "printf" => {
            let Some(Value::Str(fmt)) = args.first() else {
                return Err("printf wants a format string".into());
            };
            Value::Str(go_sprintf(fmt, &args[1..]))
        }
        "eq" => {
            if n < 2 {
                return Err("missing argument for comparison".into());
            }
            let mut truth = false;
            for b in &args[1..] {
                if go_eq(&args[0], b)? {
                    truth = true;
                    break;
                }
            }
            Value::Bool(truth)
        }
        "ne" => {
            want(2)?;
            Value::Bool(!go_eq(&args[0], &args[1])?)
        }
        "lt" | "le" | "gt" | "ge" => {
            want(2)?;
            let ord = go_cmp(&args[0], &args[1])?;
            Value::Bool(match name {
                "lt" => ord.is_lt(),
                "le" => ord.is_le(),
                "gt" => ord.is_gt(),
                _ => ord.is_ge(),
            })
        }
        "required" => {
            want(2)?;
            let msg = strval(&a(0));
            match a(1) {
                Value::Invalid | Value::Nil => return Err(msg),
                Value::Str(s) if s.is_empty() => return Err(msg),
                v => v,
            }
        }
        "fail" => {
            want(1)?;
            return Err(strval(&a(0)));
        }
        "toYaml" => {
            want(1)?;
            Value::Str(to_yaml(&a(0)))
        }
        "toJson" => {
            want(1)?;
            let s = serde_json::to_string(&a(0).to_json()).unwrap_or_default();
            // Go's encoding/json escapes HTML characters.
            Value::Str(
                s.replace('<', "\\u003c")
                    .replace('>', "\\u003e")
                    .replace('&', "\\u0026"),
            )
        }
        // `helm template` has no cluster: lookup yields an empty map.
        "lookup" => {
            want(4)?;
            Value::Map(BTreeMap::new())
        }
        "default" => {
            if n == 0 {
                return Err("wrong number of args for default: want at least 1 got 0".into());
            }
            match args.get(1) {
                Some(v) if !empty(v) => v.clone(),
                _ => a(0),
            }
        }
        "empty" => {
            want(1)?;
            Value::Bool(empty(&a(0)))
        }
        "coalesce" => args
            .iter()
            .find(|v| !empty(v))
            .cloned()
            .unwrap_or(Value::Nil),
        "ternary" => {
            want(3)?;
            if a(2).truthy() {
                a(0)
            } else {
                a(1)
            }
        }
        "quote" => Value::Str(
            args.iter()
                .filter(|v| !v.is_nil())
                .map(|v| go_quote(&strval(v)))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        "squote" => Value::Str(
            args.iter()
                .filter(|v| !v.is_nil())
                .map(|v| format!("'{}'", strval(v)))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        "indent" | "nindent" => {
            want(2)?;
            let width = to_int(&a(0))?;
            let pad = " ".repeat(width.max(0) as usize);
            let s = pad.clone() + &strval(&a(1)).replace('\n', &format!("\n{pad}"));
            Value::Str(if name == "nindent" {
                format!("\n{s}")
            } else {
                s
            })
        }
        "b64enc" => {
            want(1)?;
            Value::Str(base64(strval(&a(0)).as_bytes()))
        }
        "b64dec" => {
            want(1)?;
            Value::Str(unbase64(&strval(&a(0))))
        }
        "trunc" => {
            want(2)?;
            let c = to_int(&a(0))?;
            let s = strval(&a(1));
            let l = s.len() as i64;
            Value::Str(if c < 0 && l + c > 0 {
                byte_slice(&s, (l + c) as usize, s.len())
            } else if c >= 0 && l > c {
                byte_slice(&s, 0, c as usize)
            } else {
                s
            })
        }
        "until" => {
            // Sprig: [0, n) counting up, or (n, 0] counting down for a negative n.
            want(1)?;
            let n = to_int(&a(0))?;
            Value::List(if n >= 0 {
                (0..n).map(Value::Int).collect()
            } else {
                (n + 1..=0).rev().map(Value::Int).collect()
            })
        }
        "trimSuffix" => {
            want(2)?;
            let (suf, s) = (strval(&a(0)), strval(&a(1)));
            Value::Str(s.strip_suffix(suf.as_str()).unwrap_or(&s).to_string())
        }
        "trimPrefix" => {
            want(2)?;
            let (pre, s) = (strval(&a(0)), strval(&a(1)));
            Value::Str(s.strip_prefix(pre.as_str()).unwrap_or(&s).to_string())
        }
        "trim" => {
            want(1)?;
            Value::Str(strval(&a(0)).trim().to_string())
        }
        "replace" => {
            want(3)?;
            Value::Str(strval(&a(2)).replace(&strval(&a(0)), &strval(&a(1))))
        }
        "lower" => {
            want(1)?;
            Value::Str(strval(&a(0)).to_lowercase())
        }
        "upper" => {
            want(1)?;
            Value::Str(strval(&a(0)).to_uppercase())
        }
        "contains" => {
            want(2)?;
            Value::Bool(strval(&a(1)).contains(&strval(&a(0))))
        }
        "hasPrefix" => {
            want(2)?;
            Value::Bool(strval(&a(1)).starts_with(&strval(&a(0))))
        }
        "hasSuffix" => {
            want(2)?;
            Value::Bool(strval(&a(1)).ends_with(&strval(&a(0))))
        }
        "join" => {
            want(2)?;
            let items: Vec<String> = match a(1) {
                Value::List(l) => l.iter().filter(|v| !v.is_nil()).map(strval).collect(),
                Value::Invalid | Value::Nil => Vec::new(),
                v => vec![strval(&v)],
            };
            Value::Str(items.join(&strval(&a(0))))
        }
        "splitList" => {
            want(2)?;
            Value::List(
                strval(&a(1))
                    .split(strval(&a(0)).as_str())
                    .map(|s| Value::Str(s.to_string()))
                    .collect(),
            )
        }
        "dict" => {
            let mut m = BTreeMap::new();
            for pair in args.chunks(2) {
                let v = pair.get(1).cloned().unwrap_or(Value::Str(String::new()));
                m.insert(strval(&pair[0]), v);
            }
            Value::Map(m)
        }
        "list" => Value::List(args),
        "has" => {
            want(2)?;
            match a(1) {
                Value::List(l) => {
                    Value::Bool(l.iter().any(|x| go_eq(x, &args[0]).unwrap_or(false)))
                }
                Value::Invalid | Value::Nil => Value::Bool(false),
                other => return Err(format!("cannot find has on type {}", other.kind())),
            }
        }
        "append" => {
            want(2)?;
            match a(0) {
                Value::List(mut l) => {
                    l.push(a(1));
                    Value::List(l)
                }
                other => return Err(format!("cannot append to type {}", other.kind())),
            }
        }
        "hasKey" => {
            want(2)?;
            match a(0) {
                Value::Map(m) => Value::Bool(m.contains_key(&strval(&a(1)))),
                other => return Err(format!("hasKey wants a map, got {}", other.kind())),
            }
        }
        "get" => {
            want(2)?;
            match a(0) {
                Value::Map(mut m) => m
                    .remove(&strval(&a(1)))
                    .unwrap_or(Value::Str(String::new())),
                other => return Err(format!("get wants a map, got {}", other.kind())),
            }
        }
        "keys" => {
            let mut ks = Vec::new();
            for m in &args {
                if let Value::Map(m) = m {
                    ks.extend(m.keys().cloned().map(Value::Str));
                }
            }
            Value::List(ks)
        }
        "merge" => {
            if n == 0 {
                return Err("wrong number of args for merge: want at least 1 got 0".into());
            }
            let mut dst = match a(0) {
                Value::Map(m) => m,
                other => return Err(format!("merge wants maps, got {}", other.kind())),
            };
            for src in &args[1..] {
                match src {
                    Value::Map(s) => merge_missing(&mut dst, s),
                    Value::Invalid | Value::Nil => {}
                    other => return Err(format!("merge wants maps, got {}", other.kind())),
                }
            }
            Value::Map(dst)
        }
        "int" | "int64" => {
            want(1)?;
            Value::Int(to_int_lenient(&a(0)))
        }
        "float64" => {
            want(1)?;
            Value::Float(match a(0) {
                Value::Int(i) => i as f64,
                Value::Float(f) => f,
                Value::Str(s) => s.trim().parse().unwrap_or(0.0),
                Value::Bool(b) => f64::from(u8::from(b)),
                _ => 0.0,
            })
        }
        "toString" => {
            want(1)?;
            Value::Str(strval(&a(0)))
        }
        "add" => Value::Int(args.iter().map(to_int_lenient).sum()),
        "sub" => {
            want(2)?;
            Value::Int(to_int_lenient(&a(0)) - to_int_lenient(&a(1)))
        }
        "sha256sum" => {
            want(1)?;
            use sha2::Digest;
            let d = sha2::Sha256::digest(strval(&a(0)).as_bytes());
            Value::Str(d.iter().map(|b| format!("{b:02x}")).collect())
        }
        // Sprig's: a CA ({Cert, Key} PEM) and a certificate it signs for serverAuth and
        // clientAuth, as Helm renders them.
        "genCA" => {
            want(2)?;
            gen_ca(&strval(&a(0)), to_int(&a(1))?)?
        }
        "genSignedCert" => {
            want(5)?;
            let names = |v: Value| match v {
                Value::List(l) => l.iter().map(strval).collect::<Vec<_>>(),
                Value::Nil | Value::Invalid => Vec::new(),
                other => vec![strval(&other)],
            };
            gen_signed_cert(
                &strval(&a(0)),
                names(a(1)),
                names(a(2)),
                to_int(&a(3))?,
                &a(4),
            )?
        }
        "randAlphaNum" => {
            want(1)?;
            use rand::Rng;
            const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
            let count = to_int(&a(0))?.max(0) as usize;
            let mut rng = rand::thread_rng();
            Value::Str(
                (0..count)
                    .map(|_| CHARS[rng.gen_range(0..CHARS.len())] as char)
                    .collect(),
            )
        }
        "kindOf" => {
            want(1)?;
            Value::Str(kind_of(&a(0)).into())
        }
        "kindIs" => {
            want(2)?;
            Value::Bool(strval(&a(0)) == kind_of(&a(1)))
        }
        other => return Err(format!("function {other:?} not defined")),
    })
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Invalid | Value::Nil => "invalid",
        Value::Bool(_) => "bool",
        Value::Int(_) => "int",
        Value::Float(_) => "float64",
        Value::Str(_) => "string",
        Value::List(_) | Value::ApiVersions(_) => "slice",
        Value::Map(_) => "map",
        Value::Files(_) => "struct",
    }
}

fn merge_missing(dst: &mut BTreeMap<String, Value>, src: &BTreeMap<String, Value>) {
    for (k, v) in src {
        match (dst.get_mut(k), v) {
            (Some(Value::Map(d)), Value::Map(s)) => merge_missing(d, s),
            (Some(_), _) => {}
            (None, v) => {
                dst.insert(k.clone(), v.clone());
            }
        }
    }
}

fn byte_slice(s: &str, from: usize, to: usize) -> String {
    String::from_utf8_lossy(&s.as_bytes()[from..to]).into_owned()
}

/// Sprig's `empty`: nil, false, 0, and empty strings, lists and maps.
pub(crate) fn empty(v: &Value) -> bool {
    !v.truthy()
}

/// Sprig's `strval`: strings as they are, everything else as `%v` (nil is `<nil>`).
pub(crate) fn strval(v: &Value) -> String {
    match v {
        Value::Str(s) => s.clone(),
        Value::Invalid | Value::Nil => "<nil>".into(),
        other => other.to_go_string(),
    }
}

fn to_int(v: &Value) -> Result<i64, String> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::Float(f) => Ok(*f as i64),
        other => Err(format!("expected an integer, got {}", other.kind())),
    }
}

/// Sprig's `int` (via `cast.ToInt`): unparsable input is 0.
fn to_int_lenient(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        Value::Float(f) => *f as i64,
        Value::Bool(b) => i64::from(*b),
        Value::Str(s) => s.trim().parse().unwrap_or(0),
        _ => 0,
    }
}

#[derive(PartialEq)]
enum BasicKind {
    Invalid,
    Bool,
    Int,
    Float,
    Str,
    Other,
}

fn basic_kind(v: &Value) -> BasicKind {
    match v {
        Value::Invalid | Value::Nil => BasicKind::Invalid,
        Value::Bool(_) => BasicKind::Bool,
        Value::Int(_) => BasicKind::Int,
        Value::Float(_) => BasicKind::Float,
        Value::Str(_) => BasicKind::Str,
        _ => BasicKind::Other,
    }
}

/// Go's template `eq` for two values: same basic kind compares; different kinds are an
/// error unless one side is nil (then false); lists and maps are not comparable.
fn go_eq(a: &Value, b: &Value) -> Result<bool, String> {
    let (ka, kb) = (basic_kind(a), basic_kind(b));
    if ka != kb {
        if ka == BasicKind::Invalid || kb == BasicKind::Invalid {
            return Ok(false);
        }
        return Err("incompatible types for comparison".into());
    }
    Ok(match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Float(x), Value::Float(y)) => x == y,
        (Value::Str(x), Value::Str(y)) => x == y,
        _ if ka == BasicKind::Invalid => true,
        _ => return Err(format!("non-comparable type {}", a.kind())),
    })
}

fn go_cmp(a: &Value, b: &Value) -> Result<std::cmp::Ordering, String> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(x.cmp(y)),
        (Value::Float(x), Value::Float(y)) => x
            .partial_cmp(y)
            .ok_or_else(|| "invalid type for comparison".to_string()),
        (Value::Str(x), Value::Str(y)) => Ok(x.cmp(y)),
        _ if basic_kind(a) != basic_kind(b) => Err("incompatible types for comparison".into()),
        _ => Err("invalid type for comparison".into()),
    }
}

/// Go's `fmt.Sprint`: a space between operands when neither is a string.
fn go_sprint(args: &[Value]) -> String {
    let mut out = String::new();
    for (i, v) in args.iter().enumerate() {
        if i > 0 && !matches!(v, Value::Str(_)) && !matches!(args[i - 1], Value::Str(_)) {
            out.push(' ');
        }
        out.push_str(&fmt_v(v));
    }
    out
}

/// `%v` inside fmt (nil is `<nil>`, unlike the template's own `<no value>`).
fn fmt_v(v: &Value) -> String {
    match v {
        Value::Invalid | Value::Nil => "<nil>".into(),
        other => other.to_go_string(),
    }
}

fn go_type(v: &Value) -> &'static str {
    match v {
        Value::List(_) => "[]interface {}",
        Value::Map(_) => "map[string]interface {}",
        other => other.kind(),
    }
}

/// Go's `fmt.Sprintf` for the verbs charts use: `%s %v %d %q %t %x %f %%`, flags `-+0`,
/// width and precision; wrong types render as Go does (`%!d(float64=2)`).
pub(crate) fn go_sprintf(fmt: &str, args: &[Value]) -> String {
    let mut out = String::new();
    let mut it = fmt.chars().peekable();
    let mut argi = 0;
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut minus = false;
        let mut zero = false;
        let mut plus = false;
        while let Some(&f) = it.peek() {
            match f {
                '-' => minus = true,
                '0' => zero = true,
                '+' => plus = true,
                _ => break,
            }
            it.next();
        }
        let mut width = String::new();
        while let Some(&d) = it.peek().filter(|d| d.is_ascii_digit()) {
            width.push(d);
            it.next();
        }
        let mut prec: Option<usize> = None;
        if it.peek() == Some(&'.') {
            it.next();
            let mut p = String::new();
            while let Some(&d) = it.peek().filter(|d| d.is_ascii_digit()) {
                p.push(d);
                it.next();
            }
            prec = Some(p.parse().unwrap_or(0));
        }
        let Some(verb) = it.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        let Some(arg) = args.get(argi) else {
            out.push_str(&format!("%!{verb}(MISSING)"));
            continue;
        };
        argi += 1;
        let bad = || format!("%!{verb}({}={})", go_type(arg), fmt_v(arg));
        let s = match (verb, arg) {
            ('v', _) => fmt_v(arg),
            ('s', Value::Str(s)) => match prec {
                Some(p) => s.chars().take(p).collect(),
                None => s.clone(),
            },
            ('s', Value::List(_) | Value::Map(_)) => fmt_v(arg),
            ('d', Value::Int(i)) => {
                if plus && *i >= 0 {
                    format!("+{i}")
                } else {
                    i.to_string()
                }
            }
            ('q', Value::Str(s)) => go_quote(s),
            ('t', Value::Bool(b)) => b.to_string(),
            ('x', Value::Int(i)) => format!("{i:x}"),
            ('x', Value::Str(s)) => s.bytes().map(|b| format!("{b:02x}")).collect(),
            ('f', Value::Float(f)) => format!("{:.*}", prec.unwrap_or(6), f),
            ('f', Value::Int(_)) => bad(),
            ('g', Value::Float(f)) => go_float(*f),
            _ => bad(),
        };
        let w: usize = width.parse().unwrap_or(0);
        let len = s.chars().count();
        if len < w {
            let pad = w - len;
            if minus {
                out.push_str(&s);
                out.push_str(&" ".repeat(pad));
            } else if zero && matches!(verb, 'd' | 'f' | 'x') {
                let (sign, digits) = match s.strip_prefix('-') {
                    Some(d) => ("-", d.to_string()),
                    None => ("", s.clone()),
                };
                out.push_str(sign);
                out.push_str(&"0".repeat(pad));
                out.push_str(&digits);
            } else {
                out.push_str(&" ".repeat(pad));
                out.push_str(&s);
            }
        } else {
            out.push_str(&s);
        }
    }
    if argi < args.len() {
        let extra: Vec<String> = args[argi..]
            .iter()
            .map(|a| format!("{}={}", go_type(a), fmt_v(a)))
            .collect();
        out.push_str(&format!("%!(EXTRA {})", extra.join(", ")));
    }
    out
}

/// Go's `strconv.Quote`.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Helm's `toYaml`: YAML without the trailing newline.
pub(crate) fn to_yaml(v: &Value) -> String {
    match serde_yaml_ng::to_string(&v.to_yaml()) {
        Ok(s) => s.strip_suffix('\n').unwrap_or(&s).to_string(),
        Err(_) => String::new(),
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard padded base64 (RFC 4648), as Helm's `b64enc` writes it; also used for kubeconfig and
/// scheduler-config `*Data` fields.
pub fn base64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(B64[(n >> 18) as usize & 63] as char);
        out.push(B64[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            B64[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            B64[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

/// Sprig's `b64dec`: invalid input gives the decoder's error text, as Sprig does.
fn unbase64(s: &str) -> String {
    let mut bits: u32 = 0;
    let mut nbits = 0;
    let mut out = Vec::new();
    for c in s.bytes() {
        if c == b'=' {
            break;
        }
        let Some(v) = B64.iter().position(|&x| x == c) else {
            return format!(
                "illegal base64 data at input byte {}",
                s.find(c as char).unwrap_or(0)
            );
        };
        bits = (bits << 6) | v as u32;
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            out.push((bits >> nbits) as u8);
            bits &= (1 << nbits) - 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn cert_value(cert: &rcgen::Certificate, key: &rcgen::KeyPair) -> Value {
    Value::Map(BTreeMap::from([
        ("Cert".to_string(), Value::Str(cert.pem())),
        ("Key".to_string(), Value::Str(key.serialize_pem())),
    ]))
}

fn cert_params(cn: &str, days: i64) -> Result<rcgen::CertificateParams, String> {
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let start = time::OffsetDateTime::now_utc();
    params.not_before = start;
    params.not_after = start + time::Duration::days(days.max(1));
    Ok(params)
}

fn gen_ca(cn: &str, days: i64) -> Result<Value, String> {
    let mut params = cert_params(cn, days)?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    Ok(cert_value(&cert, &key))
}

fn gen_signed_cert(
    cn: &str,
    ips: Vec<String>,
    dns: Vec<String>,
    days: i64,
    ca: &Value,
) -> Result<Value, String> {
    let field = |k: &str| match ca {
        Value::Map(m) => m.get(k).map(strval),
        _ => None,
    };
    let (ca_cert, ca_key) = match (field("Cert"), field("Key")) {
        (Some(c), Some(k)) => (c, k),
        _ => return Err("genSignedCert: the CA is not a genCA result".into()),
    };
    let ca_key = rcgen::KeyPair::from_pem(&ca_key).map_err(|e| e.to_string())?;
    let issuer = rcgen::CertificateParams::from_ca_cert_pem(&ca_cert)
        .and_then(|p| p.self_signed(&ca_key))
        .map_err(|e| e.to_string())?;
    let mut params = cert_params(cn, days)?;
    for ip in ips {
        let ip = ip
            .parse()
            .map_err(|e| format!("genSignedCert: ip {ip}: {e}"))?;
        params.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
    }
    for name in dns {
        let name = name.try_into().map_err(|e| format!("genSignedCert: {e}"))?;
        params.subject_alt_names.push(rcgen::SanType::DnsName(name));
    }
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let cert = params
        .signed_by(&key, &issuer, &ca_key)
        .map_err(|e| e.to_string())?;
    Ok(cert_value(&cert, &key))
}
