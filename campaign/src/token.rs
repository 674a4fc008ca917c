//! The shared token of the campaign coordinator and the peer endpoints.

use std::path::Path;

use super::CampaignError;
use railguard_prober::rdma::peer::MIN_TOKEN_BYTES;

/// The key of the token in the chart's Secret (and the file name the pods read).
pub const TOKEN_KEY: &str = "token";

/// Length of a generated token: 48 alphanumerics, about 285 bits.
pub const GENERATED_TOKEN_LEN: usize = 48;

/// A new shared token: [`GENERATED_TOKEN_LEN`] characters drawn uniformly from `[A-Za-z0-9]`
/// by the operating system's CSPRNG.
pub fn generate_token() -> String {
    use rand::Rng as _;
    rand::rngs::OsRng
        .sample_iter(&rand::distributions::Alphanumeric)
        .take(GENERATED_TOKEN_LEN)
        .map(char::from)
        .collect()
}

/// Where the token comes from: a file (a mounted Secret) or the value itself.
#[derive(Clone, Copy, Debug)]
pub enum TokenSource<'a> {
    File(&'a Path),
    Value(&'a str),
}

/// Reads the token; one trailing newline (of a file) is not part of it.
pub fn load_token(source: TokenSource<'_>) -> Result<Vec<u8>, CampaignError> {
    let raw = match source {
        TokenSource::File(path) => {
            std::fs::read(path).map_err(|source| CampaignError::TokenRead {
                path: path.display().to_string(),
                source,
            })?
        }
        TokenSource::Value(t) => t.as_bytes().to_vec(),
    };
    let token = raw.strip_suffix(b"\n").unwrap_or(&raw).to_vec();
    if token.len() < MIN_TOKEN_BYTES {
        return Err(CampaignError::Token {
            reason: format!(
                "{} bytes, at least {MIN_TOKEN_BYTES} are required",
                token.len()
            ),
        });
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn generated_tokens_are_48_alphanumerics_accepted_by_the_loader_and_differ() {
        let a = generate_token();
        let b = generate_token();
        assert_eq!(a.len(), GENERATED_TOKEN_LEN);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()), "{a}");
        assert_ne!(a, b);
        assert_eq!(load_token(TokenSource::Value(&a)).unwrap(), a.as_bytes());
        // Drawn from all 62 characters: 100 tokens (4800 draws) see nearly all of them.
        let seen: std::collections::BTreeSet<char> = (0..100)
            .flat_map(|_| generate_token().chars().collect::<Vec<_>>())
            .collect();
        assert!(seen.len() >= 60, "{}", seen.len());
    }

    #[test]
    fn a_short_token_is_refused_and_a_trailing_newline_dropped() {
        let e = load_token(TokenSource::Value("short")).unwrap_err();
        assert!(e.to_string().contains("5 bytes, at least 16"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "0123456789abcdef\n").unwrap();
        assert_eq!(
            load_token(TokenSource::File(&p)).unwrap(),
            b"0123456789abcdef"
        );
        let e = load_token(TokenSource::File(&dir.path().join("absent"))).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot read the shared token from "),
            "{e}"
        );
    }
}
