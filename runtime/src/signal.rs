//! The shutdown signal every long-running railguard process waits for.

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (the kubelet's stop). Where SIGTERM cannot be
/// watched (not unix, or the handler cannot be installed), SIGINT alone.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        // An error installing the Ctrl-C handler leaves SIGTERM as the only way out.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

#[cfg(all(test, unix))]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn sigterm_resolves_the_signal() {
        let waiter = tokio::spawn(shutdown_signal());
        // Let the handler install before the signal is raised.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        raise_sigterm();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
    }

    fn raise_sigterm() {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}
