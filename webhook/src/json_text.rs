//! JSON written straight as text: the patch's values ([`JsonText`], built once by the step
//! that decides them, with no value tree in between) and the answer's envelope. Writing to
//! memory cannot fail, so there is no error to carry but where a serde type is written.

use std::fmt;

use serde::Serialize;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `s` as a JSON string, escaped exactly as serde_json escapes it (`"`, `\`, and the
/// control characters below U+0020), so an answer reads the same byte for byte.
pub(crate) fn push_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    // Names, paths and values rarely hold anything to escape: copy those whole.
    let Some(first) = first_to_escape(s.as_bytes()) else {
        out.push_str(s);
        out.push('"');
        return;
    };
    let mut clean_from = 0;
    for (i, b) in s.bytes().enumerate().skip(first) {
        let hex;
        let escaped = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            b'\t' => "\\t",
            b'\n' => "\\n",
            0x0c => "\\f",
            b'\r' => "\\r",
            0x00..=0x1f => {
                hex = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 0xf)],
                ];
                std::str::from_utf8(&hex).unwrap_or("\\u0000")
            }
            _ => continue,
        };
        // An ASCII byte is always a char boundary, so both slices are whole characters.
        out.push_str(&s[clean_from..i]);
        out.push_str(escaped);
        clean_from = i + 1;
    }
    out.push_str(&s[clean_from..]);
    out.push('"');
}

fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Where the first byte to escape is, eight bytes at a time: a byte of a word is below 0x20,
/// `"` or `\` exactly where the classic "has a zero byte" test finds one.
fn first_to_escape(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGHS;
    let mut chunks = bytes.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        if below(x, 0x20) | below(x ^ (ONES * 0x22), 1) | below(x ^ (ONES * 0x5c), 1) != 0 {
            // Some byte here needs escaping (the test has no false negatives); find it.
            return chunk.iter().position(|&b| needs_escape(b)).map(|i| at + i);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| needs_escape(b))
        .map(|i| at + i)
}

/// Appends the strings as a JSON array.
pub(crate) fn push_str_array(out: &mut String, items: &[String]) {
    out.push('[');
    for (i, s) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_str(out, s);
    }
    out.push(']');
}

/// A JSON value, already written out. Made only by the builders here (or by serde_json from
/// a serde type), so it is always one valid JSON value.
#[derive(Clone, PartialEq, Eq)]
pub struct JsonText(String);

impl JsonText {
    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A string.
    pub fn string(s: &str) -> Self {
        let mut out = String::with_capacity(s.len() + 2);
        push_str(&mut out, s);
        Self(out)
    }

    /// An object whose members `build` writes, in order.
    pub fn object(build: impl FnOnce(&mut Object<'_>)) -> Self {
        let mut out = String::with_capacity(64);
        Object::write(&mut out, build);
        Self(out)
    }

    /// An array whose items `build` writes, in order.
    pub fn array(build: impl FnOnce(&mut Array<'_>)) -> Self {
        let mut out = String::with_capacity(64);
        Array::write(&mut out, build);
        Self(out)
    }

    /// A serde type as serde_json writes it.
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::to_string(value).map(Self)
    }

    /// The value parsed (for tests and tools that want a tree).
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(&self.0)
    }
}

impl fmt::Debug for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The members of an object being written.
pub struct Object<'a> {
    out: &'a mut String,
    empty: bool,
}

impl Object<'_> {
    fn write(out: &mut String, build: impl FnOnce(&mut Object<'_>)) {
        out.push('{');
        build(&mut Object { out, empty: true });
        out.push('}');
    }

    fn key(&mut self, key: &str) -> &mut String {
        if !std::mem::replace(&mut self.empty, false) {
            self.out.push(',');
        }
        push_str(self.out, key);
        self.out.push(':');
        self.out
    }

    /// A string member.
    pub fn str(&mut self, key: &str, value: &str) -> &mut Self {
        push_str(self.key(key), value);
        self
    }

    /// A boolean member.
    pub fn bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.key(key).push_str(if value { "true" } else { "false" });
        self
    }

    /// A member written already.
    pub fn json(&mut self, key: &str, value: &JsonText) -> &mut Self {
        self.key(key).push_str(value.as_str());
        self
    }

    /// An object member.
    pub fn object(&mut self, key: &str, build: impl FnOnce(&mut Object<'_>)) -> &mut Self {
        Object::write(self.key(key), build);
        self
    }

    /// An array member.
    pub fn array(&mut self, key: &str, build: impl FnOnce(&mut Array<'_>)) -> &mut Self {
        Array::write(self.key(key), build);
        self
    }
}

/// The items of an array being written.
pub struct Array<'a> {
    out: &'a mut String,
    empty: bool,
}

impl Array<'_> {
    fn write(out: &mut String, build: impl FnOnce(&mut Array<'_>)) {
        out.push('[');
        build(&mut Array { out, empty: true });
        out.push(']');
    }

    fn item(&mut self) -> &mut String {
        if !std::mem::replace(&mut self.empty, false) {
            self.out.push(',');
        }
        self.out
    }

    /// A string item.
    pub fn str(&mut self, value: &str) -> &mut Self {
        push_str(self.item(), value);
        self
    }

    /// An item written already.
    pub fn json(&mut self, value: &JsonText) -> &mut Self {
        self.item().push_str(value.as_str());
        self
    }

    /// An object item.
    pub fn object(&mut self, build: impl FnOnce(&mut Object<'_>)) -> &mut Self {
        Object::write(self.item(), build);
        self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    fn text(s: &str) -> String {
        let mut out = String::new();
        push_str(&mut out, s);
        out
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let every_ascii: String = (0u8..0x80).map(char::from).collect();
        for s in [
            "",
            "plain",
            every_ascii.as_str(),
            "quote \" backslash \\ slash / tilde ~",
            "\u{7f}\u{80}\u{2028}\u{2029} é 漢字 🚀",
            "railguard.io/profile~1",
        ] {
            assert_eq!(text(s), serde_json::to_string(s).unwrap(), "{s:?}");
            assert_eq!(JsonText::string(s).to_value().unwrap(), json!(s));
        }
    }

    #[test]
    fn the_word_scan_finds_every_byte_to_escape_at_every_offset() {
        for special in (0u8..0x20).chain([b'"', b'\\']) {
            for len in 0..20 {
                for at in 0..=len {
                    let mut bytes = vec![b'a'; len];
                    // Bytes just above and below the classes: 0x20, 0x21, 0x23, 0x5b, 0x5d, 0xff.
                    for (i, b) in bytes.iter_mut().enumerate() {
                        *b = [0x20, 0x21, 0x23, 0x5b, 0x5d, 0xff, b'z'][i % 7];
                    }
                    let expected = (at < len).then(|| {
                        bytes[at] = special;
                        at
                    });
                    assert_eq!(
                        first_to_escape(&bytes),
                        expected,
                        "{special:#x} at {at} of {len}"
                    );
                }
            }
        }
    }

    #[test]
    fn string_arrays_are_written_as_serde_json_writes_them() {
        for items in [
            vec![],
            vec!["a".to_string()],
            vec!["a\n".into(), "\"b\"".into()],
        ] {
            let mut out = String::new();
            push_str_array(&mut out, &items);
            assert_eq!(out, serde_json::to_string(&items).unwrap());
        }
    }

    #[test]
    fn built_values_are_the_json_they_describe() {
        let inner = JsonText::object(|o| {
            o.str("key", "railguard.io/fabric").str("operator", "In");
        });
        let v = JsonText::object(|o| {
            o.str("name", "x\"y")
                .json("term", &inner)
                .object("empty", |_| {})
                .array("items", |a| {
                    a.str("a").json(&inner).object(|o| {
                        o.array("none", |_| {});
                    });
                });
        });
        assert_eq!(
            v.to_value().unwrap(),
            json!({"name": "x\"y", "term": {"key": "railguard.io/fabric", "operator": "In"},
                "empty": {}, "items": ["a", {"key": "railguard.io/fabric", "operator": "In"},
                {"none": []}]})
        );
        // Members in the order written, as serde_json writes a struct.
        assert_eq!(
            inner.as_str(),
            r#"{"key":"railguard.io/fabric","operator":"In"}"#
        );
        assert_eq!(JsonText::array(|_| {}).as_str(), "[]");
        assert_eq!(
            JsonText::of(&json!({"a": [1, null]})).unwrap().as_str(),
            r#"{"a":[1,null]}"#
        );
    }
}
