//! The Kubernetes client from `--kubeconfig`, or inferred (`$KUBECONFIG`, `~/.kube/config`,
//! in-cluster), failing with a [`StartupError`] that names the file and the flag.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

use railguard_runtime::{error_chain, StartupError};

/// A client from `kubeconfig` (given with `flag`), else the inferred configuration.
/// `fix_without` is what to do when nothing can be inferred (e.g. `pass --kubeconfig, or use
/// --profiles`).
pub async fn kube_client(
    kubeconfig: Option<&Path>,
    flag: &str,
    fix_without: &str,
) -> Result<kube::Client, StartupError> {
    let (config, source) = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| read_error(path, flag, &e))?;
            let config =
                kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| {
                        StartupError::new(
                            format!("unusable kubeconfig {} ({flag})", path.display()),
                            error_chain(&e),
                            format!(
                                "it needs a current-context whose cluster and user are defined (`kubectl --kubeconfig {} config get-contexts`)",
                                path.display()
                            ),
                        )
                    })?;
            (config, format!("kubeconfig {} ({flag})", path.display()))
        }
        None => {
            let config = kube::Config::infer().await.map_err(|e| {
                StartupError::new("no Kubernetes configuration", error_chain(&e), fix_without)
            })?;
            (config, "the inferred Kubernetes configuration".to_string())
        }
    };
    kube::Client::try_from(config).map_err(|e| {
        StartupError::new(
            format!("cannot build a Kubernetes client from {source}"),
            error_chain(&e),
            "check its server URL and certificates",
        )
    })
}

fn read_error(path: &Path, flag: &str, e: &KubeconfigError) -> StartupError {
    match e {
        KubeconfigError::ReadConfig(io, _) => {
            StartupError::unreadable("kubeconfig", path, flag, io)
        }
        other => StartupError::invalid(
            "kubeconfig",
            path,
            flag,
            other,
            format!(
                "it must be kubeconfig YAML (`kubectl --kubeconfig {} config view` reads it)",
                path.display()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_kubeconfigs_name_the_file_and_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let e = kube_client(Some(&missing), "--kubeconfig", "-")
            .await
            .err()
            .unwrap();
        assert_eq!(
            e.problem,
            format!(
                "cannot read kubeconfig {} (--kubeconfig)",
                missing.display()
            )
        );
        assert_eq!(e.cause, "no such file or directory");

        let garbage = dir.path().join("garbage");
        std::fs::write(&garbage, "{{{ not yaml").unwrap();
        let e = kube_client(Some(&garbage), "--kubeconfig", "-")
            .await
            .err()
            .unwrap();
        assert_eq!(
            e.problem,
            format!("invalid kubeconfig {} (--kubeconfig)", garbage.display())
        );
        assert!(e.fix.contains("config view"), "{e}");

        let empty = dir.path().join("empty");
        std::fs::write(&empty, "apiVersion: v1\nkind: Config\n").unwrap();
        let e = kube_client(Some(&empty), "--kubeconfig", "-")
            .await
            .err()
            .unwrap();
        assert_eq!(
            e.problem,
            format!("unusable kubeconfig {} (--kubeconfig)", empty.display())
        );
        assert!(e.cause.contains("current context"), "{e}");
        assert!(!e.to_string().contains('\n'));
    }
}
