//! Issuing the small private PKIs railguard runs on: a CA, and serving or client pairs it
//! signs, all PEM. The webhook's self-managed certificates and the extender's mTLS material
//! (`railguard-extender tls-bootstrap`) are issued here. No IO: the caller stores the PEM.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

use crate::error::PkiError;

/// The time crate the API here speaks, for callers that do not depend on it.
pub use time;

/// A certificate and its private key, PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PemPair {
    pub cert: String,
    pub key: String,
}

/// The validity period of a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// From five minutes before `now` (clock skew between the issuing pod and its peers) to
    /// `days` after it.
    pub fn days_from(now: OffsetDateTime, days: u32) -> Validity {
        Validity {
            not_before: now - time::Duration::minutes(5),
            not_after: now + time::Duration::days(i64::from(days)),
        }
    }
}

/// What a CA may sign below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaPathLen {
    /// Only end-entity certificates (pathLenConstraint 0).
    EndEntitiesOnly,
    Unconstrained,
}

/// A CA that can sign: its certificate and key, kept in memory only while issuing.
pub struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
    pair: PemPair,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Authority")
            .field("cert", &self.pair.cert)
            .finish_non_exhaustive()
    }
}

impl Authority {
    /// A new self-signed CA named `common_name` (a fresh ECDSA P-256 key).
    pub fn new(
        common_name: &str,
        path_len: CaPathLen,
        validity: Validity,
    ) -> Result<Authority, PkiError> {
        let key = KeyPair::generate().map_err(PkiError::generate("the CA key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name);
        params.is_ca = IsCa::Ca(match path_len {
            CaPathLen::EndEntitiesOnly => BasicConstraints::Constrained(0),
            CaPathLen::Unconstrained => BasicConstraints::Unconstrained,
        });
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        let cert = params
            .self_signed(&key)
            .map_err(PkiError::generate("the CA certificate"))?;
        let pair = PemPair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        };
        Ok(Authority { cert, key, pair })
    }

    /// The CA's certificate and key, PEM.
    pub fn pem(&self) -> &PemPair {
        &self.pair
    }

    /// Signs a new end-entity pair for `leaf` (a fresh ECDSA P-256 key).
    pub fn issue(&self, leaf: &Leaf) -> Result<PemPair, PkiError> {
        let key = KeyPair::generate().map_err(PkiError::generate("a certificate key"))?;
        let mut params = CertificateParams::new(leaf.dns_names.clone())
            .map_err(PkiError::generate("a certificate's DNS names"))?;
        params
            .subject_alt_names
            .extend(leaf.ip_addresses.iter().map(|ip| SanType::IpAddress(*ip)));
        params.distinguished_name = name(&leaf.common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match leaf.usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        params.not_before = leaf.validity.not_before;
        params.not_after = leaf.validity.not_after;
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(PkiError::generate("a certificate"))?;
        Ok(PemPair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// What an end-entity certificate is for (its extended key usage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// A TLS server: the names and addresses clients dial are its subject alternative names.
    Server,
    /// A TLS client authenticating with it (mTLS): its common name is who it is.
    Client,
}

/// An end-entity certificate to issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    pub common_name: String,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub usage: Usage,
    pub validity: Validity,
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use rustls::pki_types::ServerName;

    use super::*;

    fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    struct Issued {
        ca: PemPair,
        server: PemPair,
        client: PemPair,
    }

    fn issue_set(days: u32) -> Issued {
        let validity = Validity::days_from(now(), days);
        let ca = Authority::new("test-ca", CaPathLen::EndEntitiesOnly, validity).unwrap();
        let server = ca
            .issue(&Leaf {
                common_name: "svc".into(),
                dns_names: vec!["localhost".into(), "svc.ns.svc".into()],
                ip_addresses: vec!["127.0.0.1".parse().unwrap()],
                usage: Usage::Server,
                validity,
            })
            .unwrap();
        let client = ca
            .issue(&Leaf {
                common_name: "scheduler".into(),
                dns_names: vec![],
                ip_addresses: vec![],
                usage: Usage::Client,
                validity,
            })
            .unwrap();
        Issued {
            ca: ca.pem().clone(),
            server,
            client,
        }
    }

    /// The server config the binaries build from the files (`server_tls`, client CA given).
    fn server_config(set: &Issued, dir: &std::path::Path) -> Arc<rustls::ServerConfig> {
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let (cert, key, ca) = (
            write("tls.crt", &set.server.cert),
            write("tls.key", &set.server.key),
            write("ca.crt", &set.ca.cert),
        );
        railguard_runtime::server_tls(railguard_runtime::TlsFiles {
            cert: &cert,
            key: &key,
            client_ca: Some(&ca),
        })
        .unwrap()
    }

    /// A client trusting `ca` and presenting `identity`, dialing `name`.
    fn handshake(
        server: Arc<rustls::ServerConfig>,
        ca: &str,
        identity: Option<&PemPair>,
        name: &str,
    ) -> Result<(), rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pemfile::certs(&mut ca.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match identity {
            Some(pair) => builder
                .with_client_auth_cert(
                    rustls_pemfile::certs(&mut pair.cert.as_bytes())
                        .collect::<Result<_, _>>()
                        .unwrap(),
                    rustls_pemfile::private_key(&mut pair.key.as_bytes())
                        .unwrap()
                        .unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        let mut client = rustls::ClientConnection::new(
            Arc::new(config),
            ServerName::try_from(name.to_string()).unwrap(),
        )
        .unwrap();
        let mut server = rustls::ServerConnection::new(server).unwrap();
        // Shuttle the handshake bytes between the two ends in memory.
        for _ in 0..10 {
            let mut buf = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut buf).unwrap();
            }
            if !buf.is_empty() {
                server.read_tls(&mut &buf[..]).unwrap();
                server.process_new_packets()?;
            }
            let mut buf = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut buf).unwrap();
            }
            if !buf.is_empty() {
                client.read_tls(&mut &buf[..]).unwrap();
                client.process_new_packets()?;
            }
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        Err(rustls::Error::General("handshake did not finish".into()))
    }

    #[test]
    fn the_server_and_client_pairs_do_mutual_tls_under_their_ca() {
        let set = issue_set(30);
        let dir = tempfile::tempdir().unwrap();
        let server = server_config(&set, dir.path());
        // The serving pair covers the loopback address and each DNS name; the client pair
        // is accepted by a server that requires certificates from the CA.
        for name in ["127.0.0.1", "localhost", "svc.ns.svc"] {
            handshake(server.clone(), &set.ca.cert, Some(&set.client), name)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        // A name not in the certificate, no client certificate, the serving pair used as a
        // client certificate (server usage only), or another CA's client: refused.
        assert!(handshake(server.clone(), &set.ca.cert, Some(&set.client), "other.svc").is_err());
        assert!(handshake(server.clone(), &set.ca.cert, None, "localhost").is_err());
        assert!(handshake(server.clone(), &set.ca.cert, Some(&set.server), "localhost").is_err());
        let other = issue_set(30);
        assert!(handshake(
            server.clone(),
            &set.ca.cert,
            Some(&other.client),
            "localhost"
        )
        .is_err());
        // A client that trusts another CA refuses the server.
        assert!(handshake(server, &other.ca.cert, Some(&set.client), "localhost").is_err());
    }

    #[test]
    fn every_issue_is_new_key_material_and_debug_hides_the_ca_key() {
        let (a, b) = (issue_set(1), issue_set(1));
        assert_ne!(a.ca.key, b.ca.key);
        assert_ne!(a.server.key, a.client.key);
        let ca =
            Authority::new("x", CaPathLen::Unconstrained, Validity::days_from(now(), 1)).unwrap();
        assert!(ca.pem().key.contains("PRIVATE KEY"));
        assert!(!format!("{ca:?}").contains("PRIVATE KEY"));
    }
}
