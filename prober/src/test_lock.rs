//! One node, one kind of test at a time: a node's own invasive certification and the
//! campaign's pair tests on its rails exclude each other (two tests halve each other's
//! bandwidth: a false regression, or a false blame on the peer).
//!
//! The daemon and the peer endpoint are two processes (two containers of the prober pod), so
//! the lock is `flock(2)` on one file both see (the chart puts it in an `emptyDir` shared by
//! the two containers): the invasive run holds it exclusively, each pair test holds it
//! shared. Neither waits: a run finding pair tests defers, a pair test finding a run is
//! refused as busy (inconclusive, never a failed rail). The kernel drops a lock with its
//! holder, so a process killed mid-test never leaves the node locked.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

/// Errors of the node's test lock.
#[derive(Debug, thiserror::Error)]
pub enum TestLockError {
    #[error("cannot open the node's test lock {path}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot lock the node's test lock {path}")]
    Lock {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// The lock file (`--test-lock-file`).
#[derive(Debug, Clone)]
pub struct NodeTestLock {
    path: PathBuf,
}

/// A held lock, released when dropped (the file is closed).
#[derive(Debug)]
pub struct TestLockHold {
    _file: File,
}

impl NodeTestLock {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        NodeTestLock { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// For an invasive run: the lock alone, or `None` while a pair test holds it.
    pub fn try_exclusive(&self) -> Result<Option<TestLockHold>, TestLockError> {
        self.try_with(File::try_lock)
    }

    /// For a pair test: the lock beside other pair tests, or `None` while an invasive run
    /// holds it.
    pub fn try_shared(&self) -> Result<Option<TestLockHold>, TestLockError> {
        self.try_with(File::try_lock_shared)
    }

    fn try_with(
        &self,
        lock: fn(&File) -> Result<(), TryLockError>,
    ) -> Result<Option<TestLockHold>, TestLockError> {
        let path = self.path.display().to_string();
        // A file of each holder's own: flock locks belong to the open file, so two holders
        // in one process exclude each other as two processes do.
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.path)
            .map_err(|source| TestLockError::Open {
                path: path.clone(),
                source,
            })?;
        match lock(&file) {
            Ok(()) => Ok(Some(TestLockHold { _file: file })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(source)) => Err(TestLockError::Lock { path, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_invasive_run_and_pair_tests_exclude_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let lock = NodeTestLock::new(dir.path().join("rails.lock"));
        // Pair tests share it; a run waits for the last of them.
        let a = lock.try_shared().unwrap().unwrap();
        let b = lock.try_shared().unwrap().unwrap();
        assert!(lock.try_exclusive().unwrap().is_none());
        drop(a);
        assert!(lock.try_exclusive().unwrap().is_none());
        drop(b);
        // A run holds it alone: no pair test, no second run.
        let run = lock.try_exclusive().unwrap().unwrap();
        assert!(lock.try_shared().unwrap().is_none());
        assert!(lock.try_exclusive().unwrap().is_none());
        drop(run);
        assert!(lock.try_shared().unwrap().is_some());
    }

    #[test]
    fn a_lock_that_cannot_be_opened_is_an_error_never_free() {
        let lock = NodeTestLock::new("/nonexistent-dir/railguard/rails.lock");
        let e = lock.try_exclusive().unwrap_err();
        assert!(
            e.to_string().contains("cannot open the node's test lock"),
            "{e}"
        );
    }
}
