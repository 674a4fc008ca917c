//! Serving certificate: load a PEM pair, and reload it when the files change — including the
//! Kubernetes Secret-volume rotation, where `tls.crt` is a symlink into `..data`, itself a
//! symlink that the kubelet swaps atomically to a new timestamped directory. A new pair that
//! does not load (half written, mismatched key) keeps the old one in service.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use railguard_runtime::{TlsConfigSource, TlsReloader};
use rustls::ServerConfig;

pub use railguard_runtime::ReloadEvent;

use crate::error::TlsError;

/// Builds a TLS 1.2/1.3 server config (ring provider) from PEM files.
pub fn load_server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let cert_pem = fs::read(cert).map_err(|source| TlsError::Read {
        path: cert.to_path_buf(),
        source,
    })?;
    let key_pem = fs::read(key).map_err(|source| TlsError::Read {
        path: key.to_path_buf(),
        source,
    })?;
    server_config_from_pem(&cert_pem, cert, &key_pem, key)
}

fn server_config_from_pem(
    cert_pem: &[u8],
    cert_path: &Path,
    key_pem: &[u8],
    key_path: &Path,
) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: cert_path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_path_buf(),
        });
    }
    let key = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|source| TlsError::Pem {
            path: key_path.to_path_buf(),
            source,
        })?
        .ok_or_else(|| TlsError::NoKey {
            path: key_path.to_path_buf(),
        })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|source| TlsError::Pair { source })?
        .with_no_client_auth()
        // Also verifies that the key belongs to the certificate.
        .with_single_cert(certs, key)
        .map_err(|source| TlsError::Pair { source })?;
    // HTTP/1.1 only: what railguard_runtime::serve speaks (with its header-read timeout).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Checks that a PEM certificate chain and key form a usable serving pair.
pub(crate) fn check_pair(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsError> {
    server_config_from_pem(
        cert_pem,
        Path::new("tls.crt"),
        key_pem,
        Path::new("tls.key"),
    )
    .map(|_| ())
}

/// Polls the serving pair and swaps it into the running server (the webhook's
/// [`TlsReloader`], counted in `tls_reloads` and logged).
pub struct CertReloader {
    inner: TlsReloader,
}

impl CertReloader {
    /// Loads the pair once; failing here is fatal for the caller.
    pub fn new(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let (c, k) = (cert.to_path_buf(), key.to_path_buf());
        let files = vec![c.clone(), k.clone()];
        let inner = TlsReloader::new(files, move || load_server_config(&c, &k))?;
        Ok(Self { inner })
    }

    /// The config source to serve with; reloads apply to every connection accepted after.
    pub fn source(&self) -> TlsConfigSource {
        self.inner.source()
    }

    /// Checks the files once and reloads when they changed.
    pub fn poll(&mut self) -> ReloadEvent {
        self.inner.poll()
    }

    /// Polls every `interval` until `stop` changes.
    pub async fn run(
        self,
        interval: Duration,
        metrics: Arc<crate::metrics::Metrics>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let stopped = async move {
            let _ = stop.changed().await;
        };
        let count = |result: &str| {
            metrics
                .tls_reloads
                .get_or_create(&crate::metrics::ResultLabels {
                    result: result.to_string(),
                })
                .inc();
        };
        self.inner.run(interval, stopped, "webhook", count).await;
    }
}
