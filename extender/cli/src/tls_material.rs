//! The extender's mTLS material, what `railguard-extender tls-bootstrap` keeps in the
//! chart's Secret: a CA (`ca.crt`), the extender's serving pair (`tls.crt`, `tls.key`) and
//! kube-scheduler's client pair (`client.crt`, `client.key`), all signed by that CA. The
//! CA's key is not kept: the set is issued once, together, and replaced as a whole (see
//! [`railguard_kube::secret_fill`]). No IO here.

use std::collections::BTreeMap;
use std::net::IpAddr;

use railguard_kube::pki::time::OffsetDateTime;
use railguard_kube::pki::{Authority, CaPathLen, Leaf, Usage, Validity};
use railguard_kube::PkiError;

/// The Secret's keys, each also the file name the pods read (the scheduler's tlsConfig and
/// the extender's `--tls-*` flags).
pub const CA_CRT: &str = "ca.crt";
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CLIENT_CRT: &str = "client.crt";
pub const CLIENT_KEY: &str = "client.key";

/// Every key of a complete set.
pub const KEYS: [&str; 5] = [CA_CRT, TLS_CRT, TLS_KEY, CLIENT_CRT, CLIENT_KEY];

/// Whether a key holds a private key (written readable by the owner and group only, like
/// everything else, but never logged).
pub fn is_private(key: &str) -> bool {
    key == TLS_KEY || key == CLIENT_KEY
}

/// What to issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsMaterialSpec {
    /// Common name of the CA (the chart: `<extender>-ca`).
    pub ca_common_name: String,
    /// Common name of the serving certificate (the chart: the extender's name).
    pub server_common_name: String,
    /// Addresses kube-scheduler dials (the chart: `127.0.0.1`, the sidecar's).
    pub server_ips: Vec<IpAddr>,
    /// Names kube-scheduler dials (the chart: `localhost` and the Service's names).
    pub server_dns: Vec<String>,
    /// Common name of kube-scheduler's client certificate (the chart: the scheduler's name).
    pub client_common_name: String,
    pub validity_days: u32,
}

/// Issues a complete set valid from `now` for `validity_days`: the Secret's data.
pub fn issue(
    spec: &TlsMaterialSpec,
    now: OffsetDateTime,
) -> Result<BTreeMap<String, Vec<u8>>, PkiError> {
    let validity = Validity::days_from(now, spec.validity_days);
    let ca = Authority::new(&spec.ca_common_name, CaPathLen::EndEntitiesOnly, validity)?;
    let server = ca.issue(&Leaf {
        common_name: spec.server_common_name.clone(),
        dns_names: spec.server_dns.clone(),
        ip_addresses: spec.server_ips.clone(),
        usage: Usage::Server,
        validity,
    })?;
    let client = ca.issue(&Leaf {
        common_name: spec.client_common_name.clone(),
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        usage: Usage::Client,
        validity,
    })?;
    Ok(BTreeMap::from([
        (CA_CRT.to_string(), ca.pem().cert.clone().into_bytes()),
        (TLS_CRT.to_string(), server.cert.into_bytes()),
        (TLS_KEY.to_string(), server.key.into_bytes()),
        (CLIENT_CRT.to_string(), client.cert.into_bytes()),
        (CLIENT_KEY.to_string(), client.key.into_bytes()),
    ]))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use railguard_kube::secret_fill::{assess, Fill};

    use super::*;

    fn spec() -> TlsMaterialSpec {
        TlsMaterialSpec {
            ca_common_name: "railguard-extender-ca".into(),
            server_common_name: "railguard-extender".into(),
            server_ips: vec!["127.0.0.1".parse().unwrap()],
            server_dns: vec![
                "localhost".into(),
                "railguard-extender.railguard.svc".into(),
                "railguard-extender.railguard.svc.cluster.local".into(),
            ],
            client_common_name: "railguard-scheduler".into(),
            validity_days: 3650,
        }
    }

    #[test]
    fn a_set_is_complete_for_the_secret_and_new_each_time() {
        let a = issue(&spec(), OffsetDateTime::now_utc()).unwrap();
        assert_eq!(assess(Some(&a), &KEYS), Fill::Complete);
        assert_eq!(a.keys().map(String::as_str).collect::<Vec<_>>(), {
            let mut k = KEYS.to_vec();
            k.sort_unstable();
            k
        });
        let b = issue(&spec(), OffsetDateTime::now_utc()).unwrap();
        for key in KEYS {
            assert_ne!(a[key], b[key], "{key}");
        }
        for key in [TLS_KEY, CLIENT_KEY] {
            assert!(is_private(key));
            assert!(String::from_utf8_lossy(&a[key]).contains("PRIVATE KEY"));
        }
        assert!(!is_private(CA_CRT));
    }
}
