//! One sysfs attribute, read the way discovery reads them all: absent, junk or a value,
//! never a silent default. The PCI tree, the IB ports and the platform checks share it.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One sysfs attribute as read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Attr<T> {
    /// No such file (or the kernel says the value is not available): unknown.
    #[default]
    Absent,
    /// The file is there but holds something we do not understand (the text, or why it
    /// could not be read).
    Junk(String),
    Value(T),
}

impl<T> Attr<T> {
    pub fn value(&self) -> Option<&T> {
        match self {
            Attr::Value(v) => Some(v),
            _ => None,
        }
    }
}

impl Attr<String> {
    /// Parses a text value; text that does not parse is junk.
    pub(crate) fn parse<T>(self, parse: impl FnOnce(&str) -> Option<T>) -> Attr<T> {
        match self {
            Attr::Absent => Attr::Absent,
            Attr::Junk(j) => Attr::Junk(j),
            Attr::Value(text) => match parse(&text) {
                Some(v) => Attr::Value(v),
                None => Attr::Junk(text),
            },
        }
    }
}

/// Reads a small sysfs attribute, trimmed: `Absent` when there is no such file, `Junk` when
/// it cannot be read, is larger than a page or is not UTF-8 (with the text, lossily, or why),
/// else the text. One `open` + one `read` + `close`: attributes fit in a page and a short
/// read is the whole value (no size probe, no EOF read).
pub(crate) fn read_attr(path: &Path) -> Attr<String> {
    use std::io::Read;
    let mut f = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Attr::Absent,
        Err(e) => return Attr::Junk(format!("<unreadable: {e}>")),
    };
    let mut buf = [0u8; 4096];
    let mut len = 0;
    loop {
        let n = match f.read(&mut buf[len..]) {
            Ok(n) => n,
            Err(e) => return Attr::Junk(format!("<unreadable: {e}>")),
        };
        len += n;
        if n == 0 || len < buf.len() {
            break;
        }
        if len == buf.len() {
            // Larger than an attribute: not something we understand.
            return Attr::Junk("<more than 4095 bytes>".into());
        }
    }
    match std::str::from_utf8(&buf[..len]) {
        Ok(text) => Attr::Value(text.trim().to_string()),
        Err(_) => Attr::Junk(String::from_utf8_lossy(&buf[..len]).trim().to_string()),
    }
}

/// [`read_attr`]'s text, `None` when absent or junk (for attributes nothing is decided on).
pub(crate) fn read_trimmed(path: &Path) -> Option<String> {
    read_attr(path).value().cloned()
}
