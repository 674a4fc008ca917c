use std::collections::BTreeMap;

use time::macros::datetime;

use super::*;

fn spec() -> CertSpec {
    CertSpec::new("railguard-webhook", "railguard", 365, 30).expect("valid spec")
}

fn now() -> OffsetDateTime {
    datetime!(2025-06-01 12:00 UTC)
}

fn data_of(m: &CertMaterial) -> BTreeMap<String, Vec<u8>> {
    m.to_secret_data()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect()
}

fn renew_reason(d: SecretDecision) -> RenewReason {
    match d {
        SecretDecision::Renew { reason, .. } => reason,
        SecretDecision::Keep { .. } => panic!("expected renewal"),
    }
}

#[test]
fn spec_rejects_bad_settings() {
    let spec_error = |e: CertError| match e {
        CertError::Spec(e) => e,
        other => panic!("{other}"),
    };
    let e = |s, n, v, r| spec_error(CertSpec::new(s, n, v, r).unwrap_err());
    assert_eq!(e("", "ns", 365, 30), CertSpecError::EmptyService);
    assert_eq!(e("svc", " ", 365, 30), CertSpecError::EmptyNamespace);
    assert_eq!(e("svc", "ns", 0, 0), CertSpecError::NoValidity);
    let too_long = CertError::Spec(e("svc", "ns", 30, 30));
    assert_eq!(
        too_long.to_string(),
        "invalid self-signed certificate settings: rotate-before (30 days) must be shorter \
         than the validity (30 days), or every certificate would be renewed at once"
    );
    assert_eq!(
        spec().dns_names(),
        vec![
            "railguard-webhook.railguard.svc".to_string(),
            "railguard-webhook.railguard.svc.cluster.local".to_string()
        ]
    );
}

#[test]
fn missing_secret_and_empty_data_renew() {
    assert_eq!(
        renew_reason(assess_secret(None, &spec(), now())),
        RenewReason::Empty
    );
    let empty = BTreeMap::new();
    assert_eq!(
        renew_reason(assess_secret(Some(&empty), &spec(), now())),
        RenewReason::Empty
    );
}

#[test]
fn fresh_material_is_kept_until_the_rotation_window() {
    let m = issue(&spec(), now()).expect("issue");
    match assess_secret(Some(&data_of(&m)), &spec(), now()) {
        SecretDecision::Keep { material, renew_at } => {
            assert_eq!(material, m);
            // Serving cert ends at now+365d, the window opens 30 days before.
            assert_eq!(renew_at, now() + time::Duration::days(335));
        }
        other => panic!("expected keep, got {other:?}"),
    }
    // One day before the window: still kept.
    let later = now() + time::Duration::days(334);
    assert!(matches!(
        assess_secret(Some(&data_of(&m)), &spec(), later),
        SecretDecision::Keep { .. }
    ));
}

#[test]
fn near_expiry_renews_and_offers_the_old_ca() {
    let m = issue(&spec(), now()).expect("issue");
    let inside_window = now() + time::Duration::days(340);
    match assess_secret(Some(&data_of(&m)), &spec(), inside_window) {
        SecretDecision::Renew {
            reason: RenewReason::Expiring { key, not_after },
            previous_ca,
        } => {
            assert_eq!(key, TLS_CRT);
            assert_eq!(
                not_after.unix_timestamp(),
                (now() + time::Duration::days(365)).unix_timestamp()
            );
            assert_eq!(previous_ca.as_deref(), Some(m.ca_crt.as_str()));
        }
        other => panic!("expected expiring, got {other:?}"),
    }
}

#[test]
fn expired_material_renews_without_the_dead_ca() {
    let m = issue(&spec(), now()).expect("issue");
    let long_after = now() + time::Duration::days(400);
    match assess_secret(Some(&data_of(&m)), &spec(), long_after) {
        SecretDecision::Renew {
            reason: RenewReason::Expiring { .. },
            previous_ca,
        } => assert_eq!(previous_ca, None),
        other => panic!("expected expiring, got {other:?}"),
    }
}

#[test]
fn wrong_service_name_renews() {
    let other = CertSpec::new("other-svc", "railguard", 365, 30).expect("spec");
    let m = issue(&other, now()).expect("issue");
    assert_eq!(
        renew_reason(assess_secret(Some(&data_of(&m)), &spec(), now())),
        RenewReason::WrongName {
            name: "railguard-webhook.railguard.svc".into()
        }
    );
}

#[test]
fn garbage_pem_renews() {
    let m = issue(&spec(), now()).expect("issue");
    let mut data = data_of(&m);
    data.insert(
        TLS_CRT.into(),
        b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n".to_vec(),
    );
    assert!(matches!(
        renew_reason(assess_secret(Some(&data), &spec(), now())),
        RenewReason::Unparsable { key: TLS_CRT, .. }
    ));
    let mut data = data_of(&m);
    data.insert(CA_KEY.into(), b"garbage".to_vec());
    assert!(matches!(
        renew_reason(assess_secret(Some(&data), &spec(), now())),
        RenewReason::Unparsable { key: CA_KEY, .. }
    ));
    let mut data = data_of(&m);
    data.remove(TLS_KEY);
    assert_eq!(
        renew_reason(assess_secret(Some(&data), &spec(), now())),
        RenewReason::Missing { key: TLS_KEY }
    );
}

#[test]
fn pair_from_another_ca_or_key_renews() {
    let a = issue(&spec(), now()).expect("issue");
    let b = issue(&spec(), now()).expect("issue");
    let mut data = data_of(&a);
    data.insert(CA_CRT.into(), b.ca_crt.clone().into_bytes());
    assert!(matches!(
        renew_reason(assess_secret(Some(&data), &spec(), now())),
        RenewReason::Untrusted { .. }
    ));
    let mut data = data_of(&a);
    data.insert(TLS_KEY.into(), b.tls_key.clone().into_bytes());
    assert!(matches!(
        renew_reason(assess_secret(Some(&data), &spec(), now())),
        RenewReason::KeyMismatch { .. }
    ));
}

#[test]
fn not_after_reads_the_validity() {
    let m = issue(&spec(), now()).expect("issue");
    let der = first_cert_der(&m.ca_crt).expect("der");
    assert_eq!(
        not_after(&der).map(|t| t.unix_timestamp()),
        Some((now() + time::Duration::days(366)).unix_timestamp())
    );
    assert_eq!(not_after(b"\x30\x03\x02\x01"), None);
    assert_eq!(not_after(&[]), None);
}

/// A certificate whose validity times are not ASCII digits (a tampered or corrupt Secret) is
/// an error, not a panic: the old hand parser sliced such a field by byte index.
#[test]
fn garbage_in_a_time_field_is_an_error_not_a_panic() {
    let m = issue(&spec(), now()).expect("issue");
    let der = first_cert_der(&m.tls_crt).expect("der").to_vec();
    // UTCTime, 13 bytes: notBefore then notAfter.
    let times: Vec<usize> = der
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w == &[0x17, 13])
        .map(|(i, _)| i + 2)
        .collect();
    assert_eq!(times.len(), 2, "two UTCTime fields");
    let garbage: [&[u8]; 4] = [
        "aéééééaZ".as_bytes(),
        "ÿÿÿÿÿÿZ".as_bytes(),
        b"\xff\xfe\x00\x01\x80\x81\xc3\x28\xe2\x82\x28\xf0Z",
        b"99999999999Z\x00",
    ];
    for (i, bytes) in garbage.iter().enumerate() {
        for &at in &times {
            let mut bad = der.clone();
            let field = &mut bad[at..at + 13];
            let n = bytes.len().min(13);
            field[..n].copy_from_slice(&bytes[..n]);
            assert_eq!(not_after(&bad), None, "case {i} at {at}");
            let mut data = m.to_secret_data();
            data.insert(TLS_CRT.to_string(), pem_block(&bad));
            let data: BTreeMap<String, Vec<u8>> =
                data.into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
            assert!(
                matches!(
                    renew_reason(assess_secret(Some(&data), &spec(), now())),
                    RenewReason::Unparsable { .. } | RenewReason::Untrusted { .. }
                ),
                "case {i} at {at}"
            );
        }
    }
}

#[test]
fn bundle_keeps_the_previous_ca_and_is_stable() {
    let old = issue(&spec(), now()).expect("issue");
    let new = issue(&spec(), now()).expect("issue");
    // Empty bundle: just the current CA.
    let first = ca_bundle_update(&old.ca_crt, None, b"", now()).expect("update");
    assert_eq!(all_cert_ders(&first), all_cert_ders(&old.ca_crt));
    // Already trusted: no change.
    assert_eq!(
        ca_bundle_update(&old.ca_crt, None, first.as_bytes(), now()),
        None
    );
    // Rotation: new CA first, then the previous.
    let rotated =
        ca_bundle_update(&new.ca_crt, Some(&old.ca_crt), first.as_bytes(), now()).expect("update");
    let ders = all_cert_ders(&rotated);
    assert_eq!(ders.len(), 2);
    assert_eq!(ders[0], first_cert_der(&new.ca_crt).expect("der"));
    assert_eq!(ders[1], first_cert_der(&old.ca_crt).expect("der"));
    // Without the old secret the previous CA comes from the existing bundle.
    let from_bundle = ca_bundle_update(&new.ca_crt, None, first.as_bytes(), now()).expect("update");
    assert_eq!(all_cert_ders(&from_bundle), ders);
    // An expired previous CA is dropped.
    let late = now() + time::Duration::days(400);
    let pruned =
        ca_bundle_update(&new.ca_crt, Some(&old.ca_crt), first.as_bytes(), late).expect("update");
    assert_eq!(all_cert_ders(&pruned).len(), 1);
}

#[test]
fn files_stale_compares_bytes() {
    let m = issue(&spec(), now()).expect("issue");
    assert!(files_stale(None, None, &m));
    assert!(files_stale(Some(m.tls_crt.as_bytes()), Some(b"x"), &m));
    assert!(!files_stale(
        Some(m.tls_crt.as_bytes()),
        Some(m.tls_key.as_bytes()),
        &m
    ));
}
