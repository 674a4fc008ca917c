//! A TLS server config from PEM files named by flags (`--tls-cert`, `--tls-key`, and
//! `--tls-client-ca` to require client certificates), each failure naming its file and flag.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use crate::error::StartupError;

/// The files of a TLS listener.
#[derive(Clone, Copy, Debug)]
pub struct TlsFiles<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    /// CA bundle that client certificates must chain to; none: no client authentication.
    pub client_ca: Option<&'a Path>,
}

/// TLS 1.2/1.3 (ring), ALPN `http/1.1` (what [`crate::serve`] speaks), and a verifier that
/// requires a client certificate issued by `client_ca` when one is given.
pub fn server_tls(files: TlsFiles<'_>) -> Result<Arc<ServerConfig>, StartupError> {
    let certs = read_certs(files.cert, "the TLS certificate", "--tls-cert")?;
    let key = read_key(files.key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| pair_error(files, &e))?;
    let builder = match files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca, "the client CA", "--tls-client-ca")? {
                roots.add(cert).map_err(|e| client_ca_error(ca, &e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| client_ca_error(ca, &e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    // Also checks that the key belongs to the certificate.
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| pair_error(files, &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn read_certs(
    path: &Path,
    what: &str,
    flag: &str,
) -> Result<Vec<CertificateDer<'static>>, StartupError> {
    let pem = std::fs::read(path).map_err(|e| StartupError::unreadable(what, path, flag, &e))?;
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StartupError::invalid(what, path, flag, &e, "give a PEM certificate file"))?;
    if certs.is_empty() {
        return Err(StartupError::new(
            format!("invalid {what} {} ({flag})", path.display()),
            "no PEM certificate in it",
            "give a PEM certificate file",
        ));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, StartupError> {
    let (what, flag) = ("the TLS key", "--tls-key");
    let pem = std::fs::read(path).map_err(|e| StartupError::unreadable(what, path, flag, &e))?;
    rustls_pemfile::private_key(&mut &pem[..])
        .map_err(|e| StartupError::invalid(what, path, flag, &e, "give a PEM private key"))?
        .ok_or_else(|| {
            StartupError::new(
                format!("invalid {what} {} ({flag})", path.display()),
                "no PEM private key in it",
                "give a PEM private key",
            )
        })
}

fn pair_error(files: TlsFiles<'_>, e: &rustls::Error) -> StartupError {
    StartupError::new(
        format!(
            "cannot use the TLS certificate {} (--tls-cert) with the key {} (--tls-key)",
            files.cert.display(),
            files.key.display()
        ),
        e.to_string(),
        "give a PEM certificate chain and the PEM private key that belongs to it",
    )
}

/// The client CA (`--tls-client-ca`) cannot be used.
fn client_ca_error(ca: &std::path::Path, e: &(dyn std::error::Error + 'static)) -> StartupError {
    StartupError::invalid(
        "client CA",
        ca,
        "--tls-client-ca",
        e,
        "give the PEM certificate of the CA that issues the clients' certificates",
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn files_become_a_config_and_failures_name_their_flag() {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["ca".to_string()]).unwrap();
        let leaf = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let cert = write("tls.crt", &leaf.cert.pem());
        let key = write("tls.key", &leaf.key_pair.serialize_pem());
        let client_ca = write("ca.crt", &ca.cert.pem());
        let other_key = write("other.key", &ca.key_pair.serialize_pem());
        let files = TlsFiles {
            cert: &cert,
            key: &key,
            client_ca: Some(&client_ca),
        };
        let config = server_tls(files).unwrap();
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
        let missing = dir.path().join("missing.crt");
        let e = server_tls(TlsFiles {
            client_ca: Some(&missing),
            ..files
        })
        .unwrap_err();
        assert!(e.to_string().contains("--tls-client-ca"), "{e}");
        let e = server_tls(TlsFiles {
            key: &other_key,
            ..files
        })
        .unwrap_err();
        assert!(e.to_string().contains("(--tls-key)"), "{e}");
        let e = server_tls(TlsFiles {
            cert: &key,
            ..files
        })
        .unwrap_err();
        assert!(e.to_string().contains("--tls-cert"), "{e}");
    }
}
