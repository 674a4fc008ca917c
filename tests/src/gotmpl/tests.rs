//! Go `text/template` semantics, checked against what Go itself prints for the same input.

use std::collections::BTreeMap;

use super::*;

fn data(yaml: &str) -> Value {
    Value::from_yaml(&serde_yaml_ng::from_str(yaml).unwrap())
}

fn render_with(src: &str, dot: &Value, missing: MissingKey) -> Result<String, TemplateError> {
    let mut set = TemplateSet::new();
    set.missing_key = missing;
    set.add("t", src)?;
    set.execute("t", dot)
}

fn render(src: &str, yaml: &str) -> String {
    render_with(src, &data(yaml), MissingKey::Default).unwrap_or_else(|e| panic!("{src}: {e}"))
}

fn render_err(src: &str, yaml: &str) -> String {
    match render_with(src, &data(yaml), MissingKey::Default) {
        Ok(out) => panic!("{src} rendered {out:?}, expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn text_and_fields() {
    assert_eq!(render("a {{ .x }} b", "x: hi"), "a hi b");
    assert_eq!(render("{{ .a.b.c }}", "a: {b: {c: deep}}"), "deep");
    assert_eq!(render("{{.}}", "7"), "7");
    assert_eq!(render("{{ $ }}", "s"), "s");
}

#[test]
fn trim_markers_remove_all_adjacent_whitespace() {
    assert_eq!(render("a  \n\t {{- .x -}} \n\n b", "x: X"), "aXb");
    assert_eq!(render("a {{- .x }} b", "x: X"), "aX b");
    assert_eq!(render("a {{ .x -}} b", "x: X"), "a Xb");
    // `{{-3}}` is the number -3, not a trim marker; `{{- 3}}` trims.
    assert_eq!(render("a {{-3}} b", "{}"), "a -3 b");
    assert_eq!(render("a {{- 3}} b", "{}"), "a3 b");
}

#[test]
fn comments_are_dropped_and_may_trim() {
    assert_eq!(render("a {{/* note */}} b", "{}"), "a  b");
    assert_eq!(render("a {{- /* note */ -}} b", "{}"), "ab");
    assert!(render_err("{{/* open", "{}").contains("unclosed comment"));
}

#[test]
fn truthiness_follows_go() {
    let cases = [
        ("false", "F"),
        ("true", "T"),
        ("0", "F"),
        ("1", "T"),
        ("0.0", "F"),
        ("''", "F"),
        ("'x'", "T"),
        ("[]", "F"),
        ("[0]", "T"),
        ("{}", "F"),
        ("{a: 1}", "T"),
        ("null", "F"),
    ];
    for (v, want) in cases {
        assert_eq!(
            render("{{ if .v }}T{{ else }}F{{ end }}", &format!("v: {v}")),
            want,
            "value {v}"
        );
    }
    assert_eq!(render("{{ if .missing }}T{{ else }}F{{ end }}", "{}"), "F");
}

#[test]
fn missing_keys_per_option() {
    let d = data("a: {}\nn: null");
    // Default: no value, and a field of no value is no value too.
    assert_eq!(
        render_with("{{ .nope }}|{{ .nope.deeper }}", &d, MissingKey::Default).unwrap(),
        "<no value>|<no value>"
    );
    // Helm's missingkey=zero: printing gives <no value>, but a field of it is an error.
    assert_eq!(
        render_with("{{ .a.nope }}", &d, MissingKey::Zero).unwrap(),
        "<no value>"
    );
    let e = render_with("{{ .nope.deeper }}", &d, MissingKey::Zero)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nil pointer evaluating interface {}.deeper"),
        "{e}"
    );
    // A present null behaves like a nil interface in every mode.
    let e = render_with("{{ .n.x }}", &d, MissingKey::Default)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nil pointer evaluating interface {}.x"), "{e}");
    let e = render_with("{{ .nope }}", &d, MissingKey::Error)
        .unwrap_err()
        .to_string();
    assert!(e.contains("map has no entry for key \"nope\""), "{e}");
    // Fields of scalars are an error.
    assert!(render_err("{{ .s.x }}", "s: str").contains("can't evaluate field x in type string"));
}

#[test]
fn if_else_if_chains() {
    let src = "{{ if eq .n 1.0 }}one{{ else if eq .n 2.0 }}two{{ else }}many{{ end }}";
    assert_eq!(render(src, "n: 1"), "one");
    assert_eq!(render(src, "n: 2"), "two");
    assert_eq!(render(src, "n: 3"), "many");
}

#[test]
fn with_sets_dot_and_else_with() {
    assert_eq!(render("{{ with .a }}{{ .b }}{{ end }}", "a: {b: B}"), "B");
    assert_eq!(
        render("{{ with .a }}x{{ else }}none{{ end }}", "a: ''"),
        "none"
    );
    assert_eq!(
        render("{{ with .a }}a{{ else with .b }}{{ . }}{{ end }}", "b: bee"),
        "bee"
    );
}

#[test]
fn range_lists_maps_in_sorted_order_with_variables() {
    assert_eq!(
        render("{{ range .l }}[{{ . }}]{{ end }}", "l: [a, b]"),
        "[a][b]"
    );
    assert_eq!(
        render(
            "{{ range $i, $v := .l }}{{ $i }}={{ $v }} {{ end }}",
            "l: [a, b]"
        ),
        "0=a 1=b "
    );
    assert_eq!(
        render(
            "{{ range $k, $v := .m }}{{ $k }}:{{ $v }},{{ end }}",
            "m: {z: 1, a: 2, m: 3}"
        ),
        "a:2,m:3,z:1,"
    );
    assert_eq!(
        render("{{ range .l }}x{{ else }}empty{{ end }}", "l: []"),
        "empty"
    );
    assert_eq!(
        render("{{ range .missing }}x{{ else }}empty{{ end }}", "{}"),
        "empty"
    );
    assert_eq!(
        render("{{ range .l }}{{ if eq . \"b\" }}{{ continue }}{{ end }}{{ if eq . \"d\" }}{{ break }}{{ end }}{{ . }}{{ end }}", "l: [a, b, c, d, e]"),
        "ac"
    );
    // $ stays the root inside range.
    assert_eq!(
        render(
            "{{ range .l }}{{ $.p }}{{ . }} {{ end }}",
            "p: '>'\nl: [1, 2]"
        ),
        ">1 >2 "
    );
    assert!(
        render_err("{{ range .s }}{{ end }}", "s: str").contains("range can't iterate over str")
    );
}

#[test]
fn variables_scope_to_their_block_and_can_be_assigned() {
    assert_eq!(
        render(
            "{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ end }}{{ $x }}",
            "{}"
        ),
        "2"
    );
    assert!(
        render_err("{{ if true }}{{ $y := 1 }}{{ end }}{{ $y }}", "{}")
            .contains("undefined variable: $y")
    );
    assert_eq!(render("{{ $v := .a }}{{ $v.b }}", "a: {b: c}"), "c");
}

#[test]
fn pipelines_pass_the_value_as_last_argument() {
    assert_eq!(render("{{ .s | printf \"%s-%s\" \"a\" }}", "s: b"), "a-b");
    assert_eq!(render("{{ \"x\" | quote | upper }}", "{}"), "\"X\"");
    assert_eq!(render("{{ (printf \"%s\" .s) | len }}", "s: abc"), "3");
    assert!(render_err("{{ 3 | 4 }}", "{}").contains("can't give argument to non-function 4"));
}

#[test]
fn and_or_short_circuit_and_return_operands() {
    assert_eq!(render("{{ or .a .b }}", "a: ''\nb: bee"), "bee");
    assert_eq!(render("{{ and .a .b }}", "a: x\nb: 0"), "0");
    assert_eq!(render("{{ and .a .b }}", "a: 0\nb: 1"), "0");
    // `or` stops before the erroring second operand.
    assert_eq!(
        render("{{ or .a (fail \"not evaluated\") }}", "a: yes"),
        "yes"
    );
}

#[test]
fn eq_follows_go_kinds() {
    assert_eq!(render("{{ eq .s \"a\" \"b\" }}", "s: b"), "true");
    assert_eq!(render("{{ eq .missing \"a\" }}", "{}"), "false");
    assert_eq!(render("{{ ne .x 2.0 }}", "x: 2"), "false");
    // A value from YAML is float64; an int literal is int: Go refuses the comparison.
    assert!(render_err("{{ eq .x 2 }}", "x: 2").contains("incompatible types for comparison"));
    assert_eq!(render("{{ eq (int .x) 2 }}", "x: 2"), "true");
    assert_eq!(
        render("{{ lt 1 2 }} {{ ge \"b\" \"a\" }}", "{}"),
        "true true"
    );
}

#[test]
fn numbers_print_like_go() {
    assert_eq!(
        render(
            "{{ .a }} {{ .b }} {{ .c }} {{ .d }}",
            "a: 2\nb: 0.5\nc: 1000000\nd: 123456"
        ),
        "2 0.5 1e+06 123456"
    );
    assert_eq!(go_float(1.5e-5), "1.5e-05");
    assert_eq!(render("{{ 0x1F }} {{ 'a' }} {{ 1.5 }}", "{}"), "31 97 1.5");
}

#[test]
fn printf_verbs_and_mismatches() {
    assert_eq!(
        render(
            r#"{{ printf "%s:%d:%q:%v:%t" "a" 3 "q" .l true }}"#,
            "l: [1, x]"
        ),
        r#"a:3:"q":[1 x]:true"#
    );
    // Values are float64, so %d is wrong for them, exactly as in Helm.
    assert_eq!(render(r#"{{ printf "%d" .n }}"#, "n: 2"), "%!d(float64=2)");
    assert_eq!(
        render(r#"{{ printf "%05d|%-3s|%.2f" 42 "a" 3.14159 }}"#, "{}"),
        "00042|a  |3.14"
    );
    assert_eq!(
        render(r#"{{ printf "%s %s" "a" }}"#, "{}"),
        "a %!s(MISSING)"
    );
}

#[test]
fn define_template_and_include() {
    let src = r#"{{ define "greet" }}hello {{ . }}{{ end }}{{ template "greet" .n }}|{{ include "greet" "x" | upper }}"#;
    assert_eq!(render(src, "n: bob"), "hello bob|HELLO X");
    assert!(render_err(r#"{{ include "nope" . }}"#, "{}").contains("no template \"nope\""));
    // Recursion is bounded, not a stack overflow.
    let e = render_err(
        r#"{{ define "loop" }}{{ include "loop" . }}{{ end }}{{ include "loop" . }}"#,
        "{}",
    );
    assert!(e.contains("max template depth"), "{e}");
}

#[test]
fn indent_nindent_and_toyaml() {
    assert_eq!(
        render("x:{{ .m | toYaml | nindent 2 }}", "m: {b: 1, a: [x, y]}"),
        "x:\n  a:\n  - x\n  - y\n  b: 1"
    );
    assert_eq!(render("{{ \"a\\nb\" | indent 3 }}", "{}"), "   a\n   b");
    assert_eq!(
        render("{{ toYaml .e }}|{{ toYaml .l }}", "e: {}\nl: []"),
        "{}|[]"
    );
    assert_eq!(
        render("{{ toJson .m }}", "m: {b: '<x>', a: 1.5, c: 3}"),
        r#"{"a":1.5,"b":"\u003cx\u003e","c":3}"#
    );
}

#[test]
fn sprig_string_and_dict_functions() {
    assert_eq!(
        render(
            "{{ quote .a }} {{ squote .a }} {{ quote .n }}",
            "a: 'x\"y'\nn: 8"
        ),
        r#""x\"y" 'x"y' "8""#
    );
    assert_eq!(
        render(
            "{{ default \"d\" .missing }} {{ default \"d\" .e }} {{ default \"d\" .v }}",
            "e: ''\nv: val"
        ),
        "d d val"
    );
    assert_eq!(
        render(
            "{{ trunc 3 \"abcdef\" }} {{ trunc -2 \"abcdef\" }} {{ trimSuffix \"-\" \"a-\" }}",
            "{}"
        ),
        "abc ef a"
    );
    assert_eq!(
        render("{{ replace \".\" \"-\" \"a.b.c\" | lower }}", "{}"),
        "a-b-c"
    );
    assert_eq!(
        render("{{ b64enc \"hello\" }} {{ b64dec \"aGVsbG8=\" }}", "{}"),
        "aGVsbG8= hello"
    );
    assert_eq!(render("{{ $d := dict \"a\" 1 \"b\" .x }}{{ hasKey $d \"b\" }} {{ $d.b }} {{ hasKey $d \"z\" }}", "x: X"), "true X false");
    assert_eq!(
        render(
            "{{ list 1 \"a\" | toJson }} {{ join \",\" .l }}",
            "l: [a, b, c]"
        ),
        "[1,\"a\"] a,b,c"
    );
    assert_eq!(
        render(
            "{{ index .m \"k.x\" }} {{ index .l 1 }}",
            "m: {k.x: v}\nl: [a, b]"
        ),
        "v b"
    );
    assert!(render_err("{{ index .l 5 }}", "l: [a]").contains("index out of range: 5"));
    assert_eq!(
        render(
            "{{ ternary \"y\" \"n\" .b }} {{ len (randAlphaNum 32) }}",
            "b: true"
        ),
        "y 32"
    );
    assert_eq!(
        render("{{ sha256sum \"abc\" | trunc 8 }}", "{}"),
        "ba7816bf"
    );
    assert_eq!(
        render("{{ merge (dict \"a\" 1) .m | toJson }}", "m: {a: 2, b: 3}"),
        r#"{"a":1,"b":3}"#
    );
}

#[test]
fn required_and_fail_stop_rendering_with_the_message() {
    assert!(render_err("{{ required \"set .x\" .x }}", "{}").contains("set .x"));
    assert!(render_err("{{ required \"set .x\" .x }}", "x: ''").contains("set .x"));
    assert_eq!(render("{{ required \"set .x\" .x }}", "x: 0"), "0");
    assert!(render_err("{{ fail \"boom\" }}", "{}").contains("boom"));
}

#[test]
fn parse_errors_are_reported_with_line() {
    let e = render_err("a\n{{ nosuchfunc 1 }}", "{}");
    assert!(
        e.contains("t:2") && e.contains("function \"nosuchfunc\" not defined"),
        "{e}"
    );
    assert!(render_err("{{ if true }}x", "{}").contains("unexpected EOF"));
    assert!(render_err("{{ end }}", "{}").contains("unexpected {{end}}"));
    assert!(render_err("{{ .x", "{}").contains("unclosed action"));
    assert!(render_err("{{ \"abc }}", "{}").contains("unterminated quoted string"));
    assert!(render_err("{{ break }}", "{}").contains("outside"));
}

#[test]
fn methods_on_helm_objects() {
    let mut m = BTreeMap::new();
    m.insert(
        "APIVersions".to_string(),
        Value::ApiVersions(vec!["policy/v1beta1".into()]),
    );
    let mut files = BTreeMap::new();
    files.insert("files/a.txt".to_string(), "content".to_string());
    m.insert("Files".to_string(), Value::Files(files));
    let dot = Value::Map(m);
    let out = render_with(
        r#"{{ .APIVersions.Has "policy/v1" }} {{ .APIVersions.Has "policy/v1beta1" }} {{ .Files.Get "files/a.txt" }}"#,
        &dot,
        MissingKey::Zero,
    )
    .unwrap();
    assert_eq!(out, "false true content");
}

#[test]
fn values_coalesce_and_null_deletes() {
    let mut base = match data("a: {b: 1, c: 2}\nd: [1]\ne: x") {
        Value::Map(m) => m,
        _ => unreachable!(),
    };
    let over = match data("a: {c: 3, n: 4}\nd: [9, 8]\ne: null") {
        Value::Map(m) => m,
        _ => unreachable!(),
    };
    chart::coalesce(&mut base, &over);
    assert_eq!(Value::Map(base), data("a: {b: 1, c: 3, n: 4}\nd: [9, 8]"));
    // As Helm: a null with no default to delete stays, in a new map too.
    let mut base = match data("a: {b: 1}") {
        Value::Map(m) => m,
        _ => unreachable!(),
    };
    let over = match data("a: {z: null}\nf: null\ng: {h: null, i: 1}") {
        Value::Map(m) => m,
        _ => unreachable!(),
    };
    chart::coalesce(&mut base, &over);
    assert_eq!(
        Value::Map(base),
        data("a: {b: 1, z: null}\nf: null\ng: {h: null, i: 1}")
    );
}

#[test]
fn schema_validation_reports_paths() {
    let schema = serde_json::json!({
        "type": "object",
        "required": ["mode"],
        "additionalProperties": false,
        "properties": {
            "mode": { "enum": ["a", "b"] },
            "n": { "type": "integer", "minimum": 1 },
            "l": { "type": "array", "items": { "type": "string" } }
        }
    });
    let ok = validate_schema(
        &schema,
        &serde_json::json!({"mode": "a", "n": 2.0, "l": ["x"]}),
    )
    .unwrap();
    assert!(ok.is_empty(), "{ok:?}");
    let errs =
        validate_schema(&schema, &serde_json::json!({"n": 0, "l": [1], "zzz": true})).unwrap();
    assert_eq!(errs.len(), 4, "{errs:?}");
    assert!(errs.iter().any(|e| e == "(root): mode is required"));
    assert!(errs
        .iter()
        .any(|e| e.starts_with("n: must be greater than or equal to 1")));
    assert!(errs
        .iter()
        .any(|e| e.starts_with("l[0]: invalid type, expected string")));
    assert!(errs
        .iter()
        .any(|e| e.contains("additional property \"zzz\"")));
    let unsupported = serde_json::json!({"type": "string", "pattern": "^a"});
    assert!(validate_schema(&unsupported, &serde_json::json!("a"))
        .unwrap_err()
        .contains("unsupported schema keyword \"pattern\""));
}

#[test]
fn until_counts_as_sprig_does() {
    assert_eq!(
        render("{{ range until 3 }}[{{ . }}]{{ end }}", "{}"),
        "[0][1][2]"
    );
    assert_eq!(
        render("{{ range until (int .n) }}{{ . }}{{ end }}", "n: 2"),
        "01"
    );
    assert_eq!(render("{{ len (until 0) }}", "{}"), "0");
    assert_eq!(
        render("{{ range until -2 }}[{{ . }}]{{ end }}", "{}"),
        "[0][-1]"
    );
}
