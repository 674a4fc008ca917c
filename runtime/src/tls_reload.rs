//! A TLS listener's files, watched and reloaded while it serves — including the Kubernetes
//! Secret-volume rotation, where `tls.crt` is a symlink into `..data`, itself a symlink that
//! the kubelet swaps atomically to a new timestamped directory. A new set of files that does
//! not load (half written, mismatched key, a junk CA) keeps the config in service.
//!
//! Each new connection takes the config in service at its accept ([`TlsReloader::source`]),
//! so a reload applies to the next handshake and never cuts an open connection.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use rustls::ServerConfig;

use crate::serve::TlsConfigSource;

/// What identifies one version of a file: where its symlinks lead, its size and mtime.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileStamp {
    resolved: PathBuf,
    len: u64,
    modified: Option<SystemTime>,
}

impl FileStamp {
    fn of(path: &Path) -> std::io::Result<Self> {
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

    fn all(paths: &[PathBuf]) -> std::io::Result<Vec<FileStamp>> {
        paths.iter().map(|p| FileStamp::of(p)).collect()
    }
}

/// Result of one reload poll.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReloadEvent {
    Unchanged,
    Reloaded,
    /// The files changed but the new config was rejected (the reason, its causes joined);
    /// the old one stays in service.
    Rejected(String),
}

type Loader = Box<dyn Fn() -> Result<Arc<ServerConfig>, String> + Send>;

/// Watches the files a [`ServerConfig`] is built from and swaps a new config in when they
/// change and load.
pub struct TlsReloader {
    files: Vec<PathBuf>,
    load: Loader,
    current: Arc<RwLock<Arc<ServerConfig>>>,
    /// The last stamps acted on (loaded or rejected), so a bad set is reported once.
    seen: Option<Vec<FileStamp>>,
}

impl TlsReloader {
    /// Builds the config once from `files` with `load`; failing here is fatal for the caller
    /// (its error is returned as is), later failures are [`ReloadEvent::Rejected`].
    pub fn new<E>(
        files: Vec<PathBuf>,
        load: impl Fn() -> Result<Arc<ServerConfig>, E> + Send + 'static,
    ) -> Result<Self, E>
    where
        E: std::error::Error + 'static,
    {
        let seen = FileStamp::all(&files).ok();
        let config = load()?;
        Ok(Self {
            files,
            load: Box::new(move || load().map_err(|e| crate::error_chain(&e))),
            current: Arc::new(RwLock::new(config)),
            seen,
        })
    }

    /// The config source to serve with; reloads apply to every connection accepted after.
    pub fn source(&self) -> TlsConfigSource {
        let current = self.current.clone();
        Arc::new(move || {
            current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        })
    }

    /// The files watched (for logs).
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Checks the files once and reloads when they changed.
    pub fn poll(&mut self) -> ReloadEvent {
        let stamps = match FileStamp::all(&self.files) {
            Ok(s) => s,
            Err(e) => {
                // Mid-rotation a link may briefly dangle; report it once per state.
                let msg = format!("cannot stat the TLS files: {e}");
                return if self.seen.take().is_some() {
                    ReloadEvent::Rejected(msg)
                } else {
                    ReloadEvent::Unchanged
                };
            }
        };
        if self.seen.as_ref() == Some(&stamps) {
            return ReloadEvent::Unchanged;
        }
        self.seen = Some(stamps);
        match (self.load)() {
            Ok(config) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = config;
                ReloadEvent::Reloaded
            }
            Err(reason) => ReloadEvent::Rejected(reason),
        }
    }

    /// Polls every `interval` until `stop` completes; logs each change as `listener`'s and
    /// hands its [`ReloadEvent::result`] to `count` (a metric).
    pub async fn run(
        mut self,
        interval: Duration,
        stop: impl std::future::Future<Output = ()>,
        listener: &'static str,
        count: impl Fn(&'static str),
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = &mut stop => return,
            }
            let event = self.poll();
            if event != ReloadEvent::Unchanged {
                log_reload(listener, &event, &self.files);
                count(event.result());
            }
        }
    }
}

impl ReloadEvent {
    /// The metric label: `ok`, `rejected` or `unchanged`.
    pub fn result(&self) -> &'static str {
        match self {
            ReloadEvent::Unchanged => "unchanged",
            ReloadEvent::Reloaded => "ok",
            ReloadEvent::Rejected(_) => "rejected",
        }
    }
}

/// A log line per change (`listener` names which one).
fn log_reload(listener: &str, event: &ReloadEvent, files: &[PathBuf]) {
    let files: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    match event {
        ReloadEvent::Unchanged => {}
        ReloadEvent::Reloaded => {
            tracing::info!(listener, files = ?files, "TLS certificate reloaded");
        }
        ReloadEvent::Rejected(reason) => tracing::warn!(
            listener,
            files = ?files,
            %reason,
            "new TLS files rejected; keeping the ones in service"
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{server_tls, TlsFiles};

    struct Pair {
        cert: String,
        key: String,
    }

    fn pair(name: &str) -> Pair {
        let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        Pair {
            cert: c.cert.pem(),
            key: c.key_pair.serialize_pem(),
        }
    }

    /// A Secret volume: `<dir>/tls.crt -> ..data/tls.crt`, `..data -> <version>`.
    fn secret_volume(dir: &Path, version: &str, files: &[(&str, &str)]) {
        let v = dir.join(version);
        fs::create_dir_all(&v).unwrap();
        for (name, text) in files {
            fs::write(v.join(name), text).unwrap();
            let link = dir.join(name);
            if !link.exists() {
                std::os::unix::fs::symlink(Path::new("..data").join(name), link).unwrap();
            }
        }
        let tmp = dir.join("..data_tmp");
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(version, &tmp).unwrap();
        fs::rename(&tmp, dir.join("..data")).unwrap();
    }

    #[test]
    fn secret_volume_swaps_reload_once_and_bad_sets_keep_the_old_config() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (one, two, ca) = (pair("one"), pair("two"), pair("ca"));
        secret_volume(
            d,
            "..v1",
            &[
                ("tls.crt", &one.cert),
                ("tls.key", &one.key),
                ("ca.crt", &ca.cert),
            ],
        );
        let (cert, key, client_ca) = (d.join("tls.crt"), d.join("tls.key"), d.join("ca.crt"));
        let files = vec![cert.clone(), key.clone(), client_ca.clone()];
        let (c, k, a) = (cert.clone(), key.clone(), client_ca.clone());
        let mut r = TlsReloader::new(files, move || {
            server_tls(TlsFiles {
                cert: &c,
                key: &k,
                client_ca: Some(&a),
            })
        })
        .unwrap();
        let source = r.source();
        let first = source();
        assert_eq!(r.poll(), ReloadEvent::Unchanged);

        // A mismatched pair (two's certificate, one's key): rejected once, old config kept.
        secret_volume(
            d,
            "..v2",
            &[
                ("tls.crt", &two.cert),
                ("tls.key", &one.key),
                ("ca.crt", &ca.cert),
            ],
        );
        let ReloadEvent::Rejected(reason) = r.poll() else {
            panic!("a mismatched pair must be rejected");
        };
        assert!(reason.contains("--tls-key"), "{reason}");
        assert_eq!(r.poll(), ReloadEvent::Unchanged, "reported once");
        assert!(Arc::ptr_eq(&source(), &first), "old config kept");

        // A junk client CA is rejected too.
        secret_volume(
            d,
            "..v3",
            &[
                ("tls.crt", &two.cert),
                ("tls.key", &two.key),
                ("ca.crt", "junk"),
            ],
        );
        assert!(matches!(r.poll(), ReloadEvent::Rejected(_)));
        assert!(Arc::ptr_eq(&source(), &first), "old config kept");

        // The whole new set: reloaded, and the source hands it out.
        secret_volume(
            d,
            "..v4",
            &[
                ("tls.crt", &two.cert),
                ("tls.key", &two.key),
                ("ca.crt", &ca.cert),
            ],
        );
        assert_eq!(r.poll(), ReloadEvent::Reloaded);
        let second = source();
        assert!(
            !Arc::ptr_eq(&second, &first),
            "the new config is handed out"
        );
        assert_eq!(r.poll(), ReloadEvent::Unchanged);

        // A dangling link mid-rotation is reported once, then the next good set loads.
        fs::remove_file(d.join("..data")).unwrap();
        assert!(matches!(r.poll(), ReloadEvent::Rejected(_)));
        assert_eq!(r.poll(), ReloadEvent::Unchanged);
        std::os::unix::fs::symlink("..v4", d.join("..data")).unwrap();
        assert_eq!(r.poll(), ReloadEvent::Reloaded);
        assert!(!Arc::ptr_eq(&source(), &second), "reloaded again");
    }
}
