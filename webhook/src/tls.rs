//! Serving certificate: load a PEM pair, and reload it when the files change — including the
//! Kubernetes Secret-volume rotation, where `tls.crt` is a symlink into `..data`, itself a
//! symlink that the kubelet swaps atomically to a new timestamped directory. A new pair that
//! does not load (half written, mismatched key) keeps the old one in service.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum_server::tls_rustls::RustlsConfig;
use rustls::ServerConfig;

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

/// What identifies one version of a file: where its symlinks lead, its size and mtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FileStamp {
    pub resolved: PathBuf,
    pub len: u64,
    pub modified: Option<SystemTime>,
}

impl FileStamp {
    pub fn of(path: &Path) -> std::io::Result<Self> {
        // canonicalize follows `tls.crt -> ..data/tls.crt` and `..data -> ..2024_...`, so
        // the Secret-volume swap changes `resolved` even when size and mtime do not.
        let resolved = fs::canonicalize(path)?;
        let meta = fs::metadata(&resolved)?;
        Ok(Self {
            resolved,
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// The stamps of a certificate/key pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PairStamp {
    pub cert: FileStamp,
    pub key: FileStamp,
}

impl PairStamp {
    pub fn of(cert: &Path, key: &Path) -> std::io::Result<Self> {
        Ok(Self {
            cert: FileStamp::of(cert)?,
            key: FileStamp::of(key)?,
        })
    }
}

/// Result of one reload poll.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReloadEvent {
    Unchanged,
    Reloaded,
    /// The files changed but the new pair was rejected; the old one stays in service.
    Rejected(String),
}

/// Polls a certificate/key pair and swaps it into a running server.
pub struct CertReloader {
    cert: PathBuf,
    key: PathBuf,
    config: RustlsConfig,
    /// The last stamp acted on (loaded or rejected), so a bad pair is reported once.
    seen: Option<PairStamp>,
}

impl CertReloader {
    /// Loads the pair once; failing here is fatal for the caller.
    pub fn new(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let seen = PairStamp::of(cert, key).ok();
        let server = load_server_config(cert, key)?;
        Ok(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            config: RustlsConfig::from_config(server),
            seen,
        })
    }

    /// The config to hand to `axum_server::bind_rustls`; reloads apply to it.
    pub fn rustls_config(&self) -> RustlsConfig {
        self.config.clone()
    }

    /// Checks the files once and reloads when they changed.
    pub fn poll(&mut self) -> ReloadEvent {
        let stamp = match PairStamp::of(&self.cert, &self.key) {
            Ok(s) => s,
            Err(e) => {
                // Mid-rotation a link may briefly dangle; report it once per state.
                let msg = format!("cannot stat certificate files: {e}");
                return if self.seen.take().is_some() {
                    ReloadEvent::Rejected(msg)
                } else {
                    ReloadEvent::Unchanged
                };
            }
        };
        if self.seen.as_ref() == Some(&stamp) {
            return ReloadEvent::Unchanged;
        }
        self.seen = Some(stamp);
        match load_server_config(&self.cert, &self.key) {
            Ok(server) => {
                self.config.reload_from_config(server);
                ReloadEvent::Reloaded
            }
            Err(e) => ReloadEvent::Rejected(railguard_api::error::error_chain(&e)),
        }
    }

    /// Polls every `interval` until `stop` resolves.
    pub async fn run(
        mut self,
        interval: Duration,
        metrics: Arc<crate::metrics::Metrics>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let label = |result: &str| crate::metrics::ResultLabels {
                result: result.to_string(),
            };
            match self.poll() {
                ReloadEvent::Unchanged => {}
                ReloadEvent::Reloaded => {
                    metrics.tls_reloads.get_or_create(&label("ok")).inc();
                    tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
                }
                ReloadEvent::Rejected(reason) => {
                    metrics.tls_reloads.get_or_create(&label("rejected")).inc();
                    tracing::warn!(
                        cert = %self.cert.display(),
                        key = %self.key.display(),
                        %reason,
                        "new certificate pair rejected; keeping the one in service"
                    );
                }
            }
        }
    }
}
