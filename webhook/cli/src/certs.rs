//! Self-managed serving certificates, the pure part: does the Secret's material still serve
//! `<svc>.<ns>.svc` well beyond the rotation window, what to issue when it does not, and which
//! `caBundle` the MutatingWebhookConfiguration needs. No IO here; [`crate::cert_sync`] adapts
//! the Secret, the files and the webhook configuration around these functions.

use std::collections::BTreeMap;

use railguard_kube::pki::{Authority, CaPathLen, Leaf, Usage, Validity};
use rcgen::KeyPair;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use time::OffsetDateTime;

use crate::error::{CertError, CertSpecError};

/// The time crate the API here speaks, for callers that do not depend on it.
pub use time;

/// Secret keys (the layout cert-manager and the chart use).
pub const CA_CRT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";

/// What to issue and when to renew it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertSpec {
    pub service: String,
    pub namespace: String,
    pub validity: time::Duration,
    pub rotate_before: time::Duration,
}

impl CertSpec {
    pub fn new(
        service: &str,
        namespace: &str,
        validity_days: u32,
        rotate_before_days: u32,
    ) -> Result<Self, CertError> {
        if service.trim().is_empty() {
            return Err(CertError::Spec(CertSpecError::EmptyService));
        }
        if namespace.trim().is_empty() {
            return Err(CertError::Spec(CertSpecError::EmptyNamespace));
        }
        if validity_days == 0 {
            return Err(CertError::Spec(CertSpecError::NoValidity));
        }
        if rotate_before_days >= validity_days {
            return Err(CertError::Spec(CertSpecError::RotateBeforeTooLong {
                rotate_before_days,
                validity_days,
            }));
        }
        Ok(Self {
            service: service.trim().to_string(),
            namespace: namespace.trim().to_string(),
            validity: time::Duration::days(i64::from(validity_days)),
            rotate_before: time::Duration::days(i64::from(rotate_before_days)),
        })
    }

    /// The names the API server dials: `<svc>.<ns>.svc` and its cluster-local form.
    pub fn dns_names(&self) -> Vec<String> {
        let base = format!("{}.{}.svc", self.service, self.namespace);
        vec![base.clone(), format!("{base}.cluster.local")]
    }
}

/// A CA and a serving pair, PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertMaterial {
    pub ca_crt: String,
    pub ca_key: String,
    pub tls_crt: String,
    pub tls_key: String,
}

impl CertMaterial {
    pub fn to_secret_data(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (CA_CRT.to_string(), self.ca_crt.clone()),
            (CA_KEY.to_string(), self.ca_key.clone()),
            (TLS_CRT.to_string(), self.tls_crt.clone()),
            (TLS_KEY.to_string(), self.tls_key.clone()),
        ])
    }
}

/// Why the Secret's material must be replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewReason {
    /// No Secret, or one without data.
    Empty,
    Missing {
        key: &'static str,
    },
    Unparsable {
        key: &'static str,
        detail: String,
    },
    /// The serving certificate does not cover this name.
    WrongName {
        name: String,
    },
    /// The serving certificate does not chain to `ca.crt` (or is not for server auth).
    Untrusted {
        detail: String,
    },
    /// `tls.key` does not belong to `tls.crt`.
    KeyMismatch {
        detail: String,
    },
    /// A certificate expires inside the rotate-before window (or already has).
    Expiring {
        key: &'static str,
        not_after: OffsetDateTime,
    },
}

impl std::fmt::Display for RenewReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenewReason::Empty => write!(f, "secret is missing or empty"),
            RenewReason::Missing { key } => write!(f, "secret has no {key}"),
            RenewReason::Unparsable { key, detail } => write!(f, "{key} is not valid: {detail}"),
            RenewReason::WrongName { name } => {
                write!(f, "serving certificate does not cover {name}")
            }
            RenewReason::Untrusted { detail } => {
                write!(f, "serving certificate does not chain to ca.crt: {detail}")
            }
            RenewReason::KeyMismatch { detail } => {
                write!(f, "tls.key does not match tls.crt: {detail}")
            }
            RenewReason::Expiring { key, not_after } => {
                write!(
                    f,
                    "{key} expires at {not_after}, inside the rotation window"
                )
            }
        }
    }
}

/// The verdict on a Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretDecision {
    /// Keep serving this material; look again before `renew_at`.
    Keep {
        material: CertMaterial,
        renew_at: OffsetDateTime,
    },
    /// Issue new material. `previous_ca` is the old CA when it still works, to keep in the
    /// caBundle while servers switch over.
    Renew {
        reason: RenewReason,
        previous_ca: Option<String>,
    },
}

/// Decides whether the Secret's `data` (None: no Secret) still serves `spec` at `now`.
pub fn assess_secret(
    data: Option<&BTreeMap<String, Vec<u8>>>,
    spec: &CertSpec,
    now: OffsetDateTime,
) -> SecretDecision {
    let previous_ca = data
        .and_then(|d| d.get(CA_CRT))
        .and_then(|b| std::str::from_utf8(b).ok())
        .filter(|pem| {
            first_cert_der(pem)
                .and_then(|der| not_after(&der))
                .is_some_and(|t| t > now)
        })
        .map(|s| s.to_string());
    match check_material(data, spec, now) {
        Ok((material, renew_at)) => SecretDecision::Keep { material, renew_at },
        Err(reason) => SecretDecision::Renew {
            reason,
            previous_ca,
        },
    }
}

fn check_material(
    data: Option<&BTreeMap<String, Vec<u8>>>,
    spec: &CertSpec,
    now: OffsetDateTime,
) -> Result<(CertMaterial, OffsetDateTime), RenewReason> {
    let data = match data {
        Some(d) if !d.values().all(|v| v.is_empty()) => d,
        _ => return Err(RenewReason::Empty),
    };
    let text = |key: &'static str| -> Result<String, RenewReason> {
        let bytes = data
            .get(key)
            .filter(|b| !b.is_empty())
            .ok_or(RenewReason::Missing { key })?;
        String::from_utf8(bytes.clone()).map_err(|_| RenewReason::Unparsable {
            key,
            detail: "not UTF-8 PEM".into(),
        })
    };
    let material = CertMaterial {
        ca_crt: text(CA_CRT)?,
        ca_key: text(CA_KEY)?,
        tls_crt: text(TLS_CRT)?,
        tls_key: text(TLS_KEY)?,
    };
    let unparsable = |key: &'static str, detail: &str| RenewReason::Unparsable {
        key,
        detail: detail.to_string(),
    };
    let ca_der =
        first_cert_der(&material.ca_crt).ok_or_else(|| unparsable(CA_CRT, "no PEM certificate"))?;
    let tls_der = first_cert_der(&material.tls_crt)
        .ok_or_else(|| unparsable(TLS_CRT, "no PEM certificate"))?;
    KeyPair::from_pem(&material.ca_key).map_err(|e| unparsable(CA_KEY, &e.to_string()))?;
    let ca_end = not_after(&ca_der).ok_or_else(|| unparsable(CA_CRT, "no validity period"))?;
    let tls_end = not_after(&tls_der).ok_or_else(|| unparsable(TLS_CRT, "no validity period"))?;

    let anchor = webpki::anchor_from_trusted_cert(&ca_der)
        .map_err(|e| unparsable(CA_CRT, &format!("{e:?}")))?;
    let ee = webpki::EndEntityCert::try_from(&tls_der)
        .map_err(|e| unparsable(TLS_CRT, &format!("{e:?}")))?;
    for name in spec.dns_names() {
        let server_name = ServerName::try_from(name.as_str())
            .map_err(|_| RenewReason::WrongName { name: name.clone() })?;
        ee.verify_is_valid_for_subject_name(&server_name)
            .map_err(|_| RenewReason::WrongName { name: name.clone() })?;
    }
    // The trust anchor's own validity is not checked by webpki, hence not_after above.
    let algs = rustls::crypto::ring::default_provider()
        .signature_verification_algorithms
        .all;
    ee.verify_for_usage(
        algs,
        &[anchor],
        &[],
        unix_time(now),
        webpki::KeyUsage::server_auth(),
        None,
        None,
    )
    .map_err(|e| match e {
        webpki::Error::CertExpired { .. } => RenewReason::Expiring {
            key: TLS_CRT,
            not_after: tls_end,
        },
        other => RenewReason::Untrusted {
            detail: format!("{other:?}"),
        },
    })?;
    crate::tls::check_pair(material.tls_crt.as_bytes(), material.tls_key.as_bytes()).map_err(
        |e| RenewReason::KeyMismatch {
            detail: railguard_api::error::error_chain(&e),
        },
    )?;

    let (key, end) = if ca_end < tls_end {
        (CA_CRT, ca_end)
    } else {
        (TLS_CRT, tls_end)
    };
    let renew_at = end - spec.rotate_before;
    if renew_at <= now {
        return Err(RenewReason::Expiring {
            key,
            not_after: end,
        });
    }
    Ok((material, renew_at))
}

/// Issues a new CA and a serving certificate for `spec`'s names, valid from `now`.
pub fn issue(spec: &CertSpec, now: OffsetDateTime) -> Result<CertMaterial, CertError> {
    // A little backdating absorbs clock skew between this pod and the API server.
    let not_before = now - time::Duration::minutes(5);
    let gen = |source| CertError::Generate { source };
    let ca = Authority::new(
        &format!("railguard-webhook-ca {}.{}", spec.service, spec.namespace),
        CaPathLen::EndEntitiesOnly,
        Validity {
            not_before,
            // The CA outlives the serving pair a little so the pair never outlives its issuer.
            not_after: now + spec.validity + time::Duration::days(1),
        },
    )
    .map_err(gen)?;
    let names = spec.dns_names();
    let tls = ca
        .issue(&Leaf {
            common_name: names[0].clone(),
            dns_names: names,
            ip_addresses: Vec::new(),
            usage: Usage::Server,
            validity: Validity {
                not_before,
                not_after: now + spec.validity,
            },
        })
        .map_err(gen)?;
    Ok(CertMaterial {
        ca_crt: ca.pem().cert.clone(),
        ca_key: ca.pem().key.clone(),
        tls_crt: tls.cert,
        tls_key: tls.key,
    })
}

/// The caBundle one webhook entry should carry, or None when `existing` already trusts
/// `current_ca`. The new bundle is the current CA plus one still-valid previous CA
/// (`previous_ca`, else the first other valid CA of `existing`), so API servers keep
/// trusting replicas that still serve the old pair until they switch.
pub fn ca_bundle_update(
    current_ca: &str,
    previous_ca: Option<&str>,
    existing: &[u8],
    now: OffsetDateTime,
) -> Option<String> {
    let current = first_cert_der(current_ca)?;
    let existing_pem = std::str::from_utf8(existing).unwrap_or("");
    let existing_certs = all_cert_ders(existing_pem);
    if existing_certs.iter().any(|c| c == &current) {
        return None;
    }
    let mut bundle = pem_block(&current);
    let candidates = previous_ca
        .into_iter()
        .flat_map(all_cert_ders)
        .chain(existing_certs);
    for der in candidates {
        if der != current && not_after(&der).is_some_and(|t| t > now) {
            bundle.push_str(&pem_block(&der));
            break;
        }
    }
    Some(bundle)
}

/// Whether the files on disk differ from what should be served.
pub fn files_stale(
    cert_on_disk: Option<&[u8]>,
    key_on_disk: Option<&[u8]>,
    m: &CertMaterial,
) -> bool {
    cert_on_disk != Some(m.tls_crt.as_bytes()) || key_on_disk != Some(m.tls_key.as_bytes())
}

fn unix_time(t: OffsetDateTime) -> UnixTime {
    let secs = u64::try_from(t.unix_timestamp()).unwrap_or(0);
    UnixTime::since_unix_epoch(std::time::Duration::from_secs(secs))
}

/// The certificates of a PEM bundle, in order; unparsable blocks are skipped.
pub fn certificates_in(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    rustls_pemfile::certs(&mut &pem[..])
        .filter_map(Result::ok)
        .collect()
}

fn all_cert_ders(pem: &str) -> Vec<CertificateDer<'static>> {
    rustls_pemfile::certs(&mut pem.as_bytes())
        .filter_map(Result::ok)
        .collect()
}

fn first_cert_der(pem: &str) -> Option<CertificateDer<'static>> {
    all_cert_ders(pem).into_iter().next()
}

fn pem_block(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or(""));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// The notAfter of a DER X.509 certificate; None when it is not one (x509-parser reads it:
/// the Secret's bytes are untrusted input, a malformed time is an error, never a panic).
pub fn not_after(der: &[u8]) -> Option<OffsetDateTime> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    OffsetDateTime::from_unix_timestamp(cert.validity().not_after.timestamp()).ok()
}

#[cfg(test)]
#[path = "certs_tests.rs"]
mod tests;
