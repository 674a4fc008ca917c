//! The shared token of the campaign coordinator and the peer endpoints.

use std::path::Path;

use super::CampaignError;
use crate::rdma::peer::MIN_TOKEN_BYTES;

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
