//! Start-up failures as one line: what could not be used (naming the flag, address or file),
//! why, and what to do about it.

use std::error::Error;
use std::io;

/// A start-up failure. Displays as `{problem}: {cause} — {fix}`, one line, and has no
/// `source` (the cause is already in the message), so printing its chain adds nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{problem}: {cause} — {fix}")]
pub struct StartupError {
    /// What could not be done, naming the thing: `cannot listen on 0.0.0.0:9090 for metrics
    /// (--metrics-listen)`.
    pub problem: String,
    /// Why, briefly: `address already in use`.
    pub cause: String,
    /// What the operator does about it: `free the port or choose another`.
    pub fix: String,
}

impl StartupError {
    pub fn new(
        problem: impl Into<String>,
        cause: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        StartupError {
            problem: one_line(&problem.into()),
            cause: one_line(&cause.into()),
            fix: one_line(&fix.into()),
        }
    }

    /// A file named by `flag` could not be read: `cannot read {what} {path} ({flag})`.
    pub fn unreadable(what: &str, path: &std::path::Path, flag: &str, e: &io::Error) -> Self {
        let fix = match e.kind() {
            io::ErrorKind::PermissionDenied => {
                "make it readable by this process's user, or point the flag at a readable copy"
            }
            _ => "check the path (mounted? spelled right?)",
        };
        StartupError::new(
            format!("cannot read {what} {} ({flag})", path.display()),
            describe_io(e),
            fix,
        )
    }

    /// A file named by `flag` was read but is not usable: `invalid {what} {path} ({flag})`.
    pub fn invalid(
        what: &str,
        path: &std::path::Path,
        flag: &str,
        e: &(dyn Error + 'static),
        fix: impl Into<String>,
    ) -> Self {
        StartupError::new(
            format!("invalid {what} {} ({flag})", path.display()),
            error_chain(e),
            fix,
        )
    }
}

/// An I/O error the way an operator reads it: `address already in use`, not
/// `Address already in use (os error 98)`.
pub fn describe_io(e: &io::Error) -> String {
    use io::ErrorKind::*;
    let known = match e.kind() {
        AddrInUse => "address already in use",
        AddrNotAvailable => "address not available on this host",
        PermissionDenied => "permission denied",
        NotFound => "no such file or directory",
        IsADirectory => "is a directory",
        NotADirectory => "a path component is not a directory",
        _ => "",
    };
    if !known.is_empty() {
        return known.to_string();
    }
    let text = e.to_string();
    let text = match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_string(),
        _ => text,
    };
    lowercase_first(&text)
}

pub use railguard_api::error::error_chain;

/// The line a binary prints for an error that ends it: a [`StartupError`] anywhere in the
/// chain is the whole story (its context is already in it); anything else is the chain.
pub fn error_line(e: &(dyn Error + 'static)) -> String {
    let mut cur: Option<&(dyn Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(s) = c.downcast_ref::<StartupError>() {
            return s.to_string();
        }
        cur = c.source();
    }
    error_chain(e)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn lowercase_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        // Keep acronyms (`TLS`, `YAML`) as they are.
        Some(c) if c.is_uppercase() && !chars.clone().next().is_some_and(char::is_uppercase) => {
            c.to_lowercase().chain(chars).collect()
        }
        _ => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner: {0}")]
    struct Inner(#[source] io::Error);

    #[test]
    fn chains_are_one_line_without_repeats() {
        let e = Outer(Inner(io::Error::other("boom\nmore")));
        // Inner formats its source itself: it is not printed twice.
        assert_eq!(error_chain(&e), "outer: inner: boom more");
    }

    #[test]
    fn io_errors_read_like_sentences() {
        assert_eq!(
            describe_io(&io::Error::from(io::ErrorKind::AddrInUse)),
            "address already in use"
        );
        assert_eq!(
            describe_io(&io::Error::from_raw_os_error(2)),
            "no such file or directory"
        );
        assert_eq!(
            describe_io(&io::Error::other("Something odd (os error 77)")),
            "something odd"
        );
        assert_eq!(describe_io(&io::Error::other("TLS broke")), "TLS broke");
    }

    #[test]
    fn a_startup_error_in_a_chain_is_the_line() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot start the server")]
        struct Wrap(#[source] StartupError);
        let s = StartupError::new(
            "cannot listen on 0.0.0.0:9090 for metrics (--metrics-listen)",
            "address already in use",
            "free the port or choose another",
        );
        assert_eq!(
            s.to_string(),
            "cannot listen on 0.0.0.0:9090 for metrics (--metrics-listen): address already in use — free the port or choose another"
        );
        assert_eq!(error_line(&Wrap(s.clone())), s.to_string());
        let plain = Outer(Inner(io::Error::other("x")));
        assert_eq!(error_line(&plain), "outer: inner: x");
    }

    #[test]
    fn unreadable_and_invalid_files_name_the_flag() {
        let e = StartupError::unreadable(
            "the TLS certificate",
            std::path::Path::new("/etc/tls.crt"),
            "--tls-cert",
            &io::Error::from_raw_os_error(2),
        );
        assert_eq!(
            e.to_string(),
            "cannot read the TLS certificate /etc/tls.crt (--tls-cert): no such file or directory — check the path (mounted? spelled right?)"
        );
        let e = StartupError::invalid(
            "FabricProfile file",
            std::path::Path::new("p.yaml"),
            "--profiles",
            &Inner(io::Error::other("bad")),
            "fix it",
        );
        assert_eq!(
            e.to_string(),
            "invalid FabricProfile file p.yaml (--profiles): inner: bad — fix it"
        );
    }
}
