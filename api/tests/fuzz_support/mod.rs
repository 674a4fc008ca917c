//! What every crate's `tests/fuzz.rs` shares (included there with `#[path]`): the case
//! count, inputs made by mutating real fixtures, raw inputs, and what a clear rejection is.
//!
//! The case count per property is the CI default given to [`config`] unless
//! `RAILGUARD_FUZZ_CASES` says otherwise (the benchmark-style runs of BENCHMARKS.md set it to
//! a million). proptest catches a panic in a property and fails the test with the (shrunk)
//! input, so "never panics" needs no more than calling the decoder.
#![allow(dead_code)]

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

/// Raises the case count of every fuzz property.
pub const CASES_ENV: &str = "RAILGUARD_FUZZ_CASES";

/// `ci_cases` cases, or `RAILGUARD_FUZZ_CASES`. No regression files: a failure prints its
/// input, which becomes a unit test of the decoder.
pub fn config(ci_cases: u32) -> ProptestConfig {
    config_heavy(ci_cases, 1)
}

/// For a property that costs much more than one decode (a whole simulated node per case):
/// `ci_cases`, or a `share` of `RAILGUARD_FUZZ_CASES`.
pub fn config_heavy(ci_cases: u32, share: u32) -> ProptestConfig {
    let cases = std::env::var(CASES_ENV)
        .ok()
        .and_then(|v| v.trim().replace('_', "").parse::<u32>().ok())
        .map_or(ci_cases, |n| (n / share.max(1)).max(1));
    ProptestConfig {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..ProptestConfig::default()
    }
}

/// Values that break number and word parsers: out of range, negative, not a number,
/// non-ASCII digits, control and format characters, injections, YAML and JSON specials.
pub const WEIRD: &[&str] = &[
    "",
    "0",
    "-0",
    "-1",
    "1e999",
    "-1e999",
    "1e-400",
    "NaN",
    "nan",
    "inf",
    "-inf",
    "Infinity",
    "4294967296",
    "18446744073709551616",
    "-9223372036854775809",
    "99999999999999999999999999999999999999",
    "1.7976931348623157e308",
    "4.9e-324",
    "0x7fffffff",
    "0xffffffffffffffff",
    "00000000000000000000001",
    "1_000",
    "+5",
    ".5",
    "5.",
    "1e",
    "--1",
    "\u{663}\u{664}",
    "\u{ff11}\u{ff12}",
    "\u{bd}",
    "\u{0}",
    "\u{7f}",
    "\u{feff}",
    "\u{202e}",
    "\u{1f600}",
    "\u{e9}",
    "\u{fffd}",
    "null",
    "true",
    "~",
    "[]",
    "{}",
    "\"",
    "\\",
    "\\u0000",
    "\\ud800",
    "\\uDFFF",
    "%s%n",
    "../../..",
    "\r\n",
    "\t",
    " ",
    ":",
    ",",
    "#",
];

/// JSON's punctuation and literals: the start of every JSON format's dictionary, through
/// [`json_dictionary`].
pub const JSON_SYNTAX: &[&str] = &["{", "}", "[", "]", ",", ":", "\"", "null", "true"];

/// A JSON format's dictionary: [`JSON_SYNTAX`], then the format's own `tokens`. `N` is the
/// length of both together (`{ JSON_SYNTAX.len() + TOKENS.len() }`); any other fails to compile.
pub const fn json_dictionary<const N: usize>(tokens: &[&'static str]) -> [&'static str; N] {
    assert!(
        N == JSON_SYNTAX.len() + tokens.len(),
        "N must be the joined length"
    );
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < JSON_SYNTAX.len() {
            JSON_SYNTAX[i]
        } else {
            tokens[i - JSON_SYNTAX.len()]
        };
        i += 1;
    }
    out
}

/// One edit of an input. Indices are taken modulo the input's length at that point.
#[derive(Clone, Debug)]
pub enum Mutation {
    Truncate(Index),
    FlipBit(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    /// A token of the format's dictionary or a [`WEIRD`] value.
    InsertToken(Index, &'static str),
    /// The i-th number (digit run) replaced by a weird value.
    ReplaceNumber(Index, &'static str),
    /// The i-th word (run of letters, digits, `_`, `.`, `-`, `/`) replaced.
    ReplaceWord(Index, &'static str),
    /// The i-th word replaced by a very long run of one character.
    LongWord(Index, char, usize),
    /// `depth` openers (and closers when `closed`) of a bracket kind.
    Nest(Index, u8, usize, bool),
    /// A chunk of the input copied elsewhere (duplicate keys, repeated lines or rows).
    Splice(Index, Index, usize),
}

fn mutation(dictionary: &'static [&'static str]) -> impl Strategy<Value = Mutation> {
    let token = prop_oneof![
        prop::sample::select(WEIRD),
        prop::sample::select(if dictionary.is_empty() {
            WEIRD
        } else {
            dictionary
        }),
    ];
    prop_oneof![
        2 => any::<Index>().prop_map(Mutation::Truncate),
        3 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        2 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        2 => (any::<Index>(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        3 => (any::<Index>(), token.clone()).prop_map(|(i, t)| Mutation::InsertToken(i, t)),
        4 => (any::<Index>(), prop::sample::select(WEIRD))
            .prop_map(|(i, t)| Mutation::ReplaceNumber(i, t)),
        3 => (any::<Index>(), token).prop_map(|(i, t)| Mutation::ReplaceWord(i, t)),
        1 => (
            any::<Index>(),
            prop::sample::select(vec!['a', '9', '\u{e9}', '\u{1f600}', ' ', '"', '\\']),
            1usize..20_000
        )
            .prop_map(|(i, c, n)| Mutation::LongWord(i, c, n)),
        1 => (any::<Index>(), 0u8..4, 1usize..3000, any::<bool>())
            .prop_map(|(i, k, d, c)| Mutation::Nest(i, k, d, c)),
        2 => (any::<Index>(), any::<Index>(), 1usize..400)
            .prop_map(|(a, b, n)| Mutation::Splice(a, b, n)),
    ]
}

/// Spans `[start, end)` of the runs of bytes for which `inside` holds.
fn runs(input: &[u8], inside: impl Fn(u8) -> bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, &b) in input.iter().enumerate() {
        match (inside(b), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, input.len()));
    }
    out
}

fn replace_run(input: &mut Vec<u8>, spans: &[(usize, usize)], which: &Index, with: &[u8]) {
    if spans.is_empty() {
        return;
    }
    let (s, e) = spans[which.index(spans.len())];
    input.splice(s..e, with.iter().copied());
}

fn at(input: &[u8], i: &Index) -> usize {
    i.index(input.len() + 1)
}

/// Applies one edit.
pub fn apply(input: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::Truncate(i) => {
            let n = at(input, i);
            input.truncate(n);
        }
        Mutation::FlipBit(i, bit) => {
            if !input.is_empty() {
                let n = i.index(input.len());
                input[n] ^= 1 << bit;
            }
        }
        Mutation::Insert(i, bytes) => {
            let n = at(input, i);
            input.splice(n..n, bytes.iter().copied());
        }
        Mutation::Delete(i, len) => {
            let n = at(input, i);
            let end = (n + len).min(input.len());
            input.drain(n..end);
        }
        Mutation::InsertToken(i, t) => {
            let n = at(input, i);
            input.splice(n..n, t.bytes());
        }
        Mutation::ReplaceNumber(i, t) => {
            let spans = runs(input, |b| b.is_ascii_digit());
            replace_run(input, &spans, i, t.as_bytes());
        }
        Mutation::ReplaceWord(i, t) => {
            let spans = runs(input, is_word_byte);
            replace_run(input, &spans, i, t.as_bytes());
        }
        Mutation::LongWord(i, c, n) => {
            let spans = runs(input, is_word_byte);
            replace_run(input, &spans, i, c.to_string().repeat(*n).as_bytes());
        }
        Mutation::Nest(i, kind, depth, closed) => {
            let (open, close): (&str, &str) = match kind {
                0 => ("[", "]"),
                1 => ("{\"a\":", "}"),
                2 => ("- ", ""),
                _ => ("(", ")"),
            };
            let mut s = open.repeat(*depth);
            s.push('1');
            if *closed {
                s.push_str(&close.repeat(*depth));
            }
            let n = at(input, i);
            input.splice(n..n, s.into_bytes());
        }
        Mutation::Splice(from, to, len) => {
            if input.is_empty() {
                return;
            }
            let s = from.index(input.len());
            let e = (s + len).min(input.len());
            let chunk = input[s..e].to_vec();
            let n = at(input, to);
            input.splice(n..n, chunk);
        }
    }
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/' | b'+')
}

/// A seed with up to `max_edits` edits applied (sometimes none: the seed itself).
pub fn mutated(
    seeds: Vec<Vec<u8>>,
    dictionary: &'static [&'static str],
    max_edits: usize,
) -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(seeds),
        prop::collection::vec(mutation(dictionary), 0..=max_edits),
    )
        .prop_map(|(mut input, edits)| {
            for m in &edits {
                apply(&mut input, m);
            }
            input
        })
}

/// [`mutated`] as text (invalid UTF-8 becomes U+FFFD, one more non-ASCII value).
pub fn mutated_text(
    seeds: &[&str],
    dictionary: &'static [&'static str],
    max_edits: usize,
) -> impl Strategy<Value = String> {
    let seeds = seeds.iter().map(|s| s.as_bytes().to_vec()).collect();
    mutated(seeds, dictionary, max_edits).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Raw bytes.
pub fn raw_bytes(max_len: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max_len)
}

/// Raw text: arbitrary characters, or a soup of the format's tokens, [`WEIRD`] values,
/// separators and newlines (closer to the grammar than random characters get).
pub fn raw_text(dictionary: &'static [&'static str]) -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        prop::sample::select(WEIRD).prop_map(str::to_string),
        prop::sample::select(if dictionary.is_empty() {
            WEIRD
        } else {
            dictionary
        })
        .prop_map(str::to_string),
        prop::sample::select(vec![" ", "\n", "  ", ": ", ", ", "\t", "|"]).prop_map(str::to_string),
        "[a-zA-Z0-9_./:-]{1,12}",
        any::<u32>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| f.to_string()),
    ];
    prop_oneof![
        any::<String>(),
        prop::collection::vec(piece, 0..80).prop_map(|v| v.concat()),
    ]
}

/// A rejection must say what is wrong: a non-empty one-line-or-more message, starting in
/// lower case (the workspace's convention) unless it starts with an identifier or acronym
/// (`AdmissionReview`, `ExtenderArgs`, `NCCL`), and a non-empty cause chain.
pub fn check_error(e: &(dyn std::error::Error + 'static)) -> Result<(), TestCaseError> {
    let text = e.to_string();
    check_message(&text)?;
    let chain = railguard_api::error::error_chain(e);
    prop_assert!(chain.starts_with(text.split_whitespace().next().unwrap_or_default()));
    Ok(())
}

/// [`check_error`] for errors that are plain strings.
pub fn check_message(text: &str) -> Result<(), TestCaseError> {
    prop_assert!(!text.trim().is_empty(), "empty error message");
    let first_word: String = text
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    let starts_upper = text.chars().next().is_some_and(char::is_uppercase);
    let identifier = first_word
        .chars()
        .skip(1)
        .any(|c| c.is_uppercase() || c == '_');
    prop_assert!(
        !starts_upper || identifier,
        "error message starts with a capital: {text:?}"
    );
    Ok(())
}
