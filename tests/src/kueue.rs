//! The real Kueue controller manager (v0.17.0, built from the Go module proxy by
//! `tests/scripts/kueue.sh`) beside a 1.37 [`ControlPlane`]: its own CustomResourceDefinitions
//! applied, one `kueue` process under the admin kubeconfig, as Kueue's Deployment runs it
//! except where a Deployment gives it what a loopback control plane has no way to (below).
//!
//! What is not as in a cluster, and why (read from Kueue's `cmd/kueue/main.go` and
//! `pkg/util/cert/cert.go`, v0.17.0):
//! - Kueue's own admission webhooks are not registered. Kueue serves them, but the API server
//!   of the harness reaches no Service, and Kueue's internal certificate manager (which would
//!   inject its CA into those registrations and into conversion webhooks of its CRDs) needs
//!   both. So `internalCertManagement.enable: false`, and the tests create their Jobs as
//!   Kueue's Job webhook would leave them: `spec.suspend: true` with the queue-name label.
//! - Without internal certificate management, `main.go` reads the metrics server's pair from
//!   the fixed path `/etc/kueue/metrics/certs` (a Secret volume in Kueue's Deployment) and
//!   exits when it is missing. The process gets that path in a private mount namespace: an
//!   overlay over `/etc` whose writes land in the control plane's directory, so the machine's
//!   `/etc` is never written (the mount needs root, as the whole test suite does).
//! - The visibility API server (`VisibilityOnDemand`) is off: it is an aggregated API server
//!   registered through an APIService and a Service the harness cannot route to.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::{binaries_from, ControlPlane, ServingCertificate, HARNESS_FIELD_MANAGER};

/// The Kueue release `tests/scripts/kueue.sh` builds.
pub const KUEUE_VERSION: &str = "v0.17.0";

/// Kueue's API group and the version its controllers serve and store.
pub const KUEUE_API: &str = "kueue.x-k8s.io/v1beta2";

/// The feature gates the tests run Kueue with (names from `pkg/features/kube_features.go`,
/// v0.17.0). Topology-aware scheduling, the replacement of a failed node and the
/// replacement of a node tainted under a running workload are all beta and on by default in
/// v0.17; they are named here so that a release that turns one off cannot pass unnoticed.
pub const KUEUE_FEATURE_GATES: &str = "TopologyAwareScheduling=true,\
TASFailedNodeReplacement=true,TASReplaceNodeOnNodeTaints=true,VisibilityOnDemand=false";

/// How long Kueue may take to serve its health port: the CRD informers sync first.
const KUEUE_START_TIMEOUT: Duration = Duration::from_secs(120);

/// The directory holding `kueue` and `crds/` (`tests/scripts/kueue.sh`, built on first use;
/// `RAILGUARD_KUEUE_DIR` overrides the location).
pub fn kueue_dir() -> Result<PathBuf> {
    binaries_from("RAILGUARD_KUEUE_DIR", "tests/scripts/kueue.sh", &["kueue"])
}

impl ControlPlane {
    /// Applies Kueue's CRDs, creates `kueue-system` and starts the Kueue controller manager
    /// with the `batch/job` integration and [`KUEUE_FEATURE_GATES`], ready when its health
    /// port answers. Its log is `kueue.log` in [`ControlPlane::log_dir`].
    pub async fn start_kueue(&mut self) -> Result<()> {
        let dir = kueue_dir()?;
        self.apply_kueue_crds(&dir.join("crds")).await?;
        self.create_namespace("kueue-system", &crate::labels(&[]))
            .await?;

        let d = self.log_dir().join("kueue");
        let certs = d.join("certs");
        std::fs::create_dir_all(&certs)?;
        // The webhook server's pair (served, never called) and the metrics server's.
        let tls = ServingCertificate::loopback("kueue-test-ca")?;
        std::fs::write(certs.join("tls.crt"), &tls.cert_pem)?;
        std::fs::write(certs.join("tls.key"), &tls.key_pem)?;
        let (upper, work) = (d.join("etc-upper"), d.join("etc-work"));
        std::fs::create_dir_all(&upper)?;
        std::fs::create_dir_all(&work)?;
        let config_path = d.join("config.yaml");
        let kueue = dir.join("kueue");
        let kubeconfig = self.kubeconfig_path().to_path_buf();
        let mut config_error = None;
        self.spawn_on_ports("kueue", 2, KUEUE_START_TIMEOUT, |p| {
            // config.kueue.x-k8s.io/v1beta2 Configuration (apis/config/v1beta2).
            let config = json!({
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "namespace": "kueue-system",
                "health": {"healthProbeBindAddress": format!("127.0.0.1:{}", p[0])},
                "metrics": {"bindAddress": "0"},
                "webhook": {"host": "127.0.0.1", "port": p[1], "certDir": certs.display().to_string()},
                "leaderElection": {"leaderElect": false},
                "internalCertManagement": {"enable": false},
                "manageJobsWithoutQueueName": false,
                "integrations": {"frameworks": ["batch/job"]},
            });
            if let Err(e) = std::fs::write(&config_path, config.to_string()) {
                config_error.get_or_insert(e);
            }
            let mut cmd = Command::new("unshare");
            cmd.args(["--mount", "--propagation", "private", "--", "sh", "-ec"])
                .arg(
                    r#"mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc
mkdir -p /etc/kueue/metrics/certs
cp "$3/tls.crt" "$3/tls.key" /etc/kueue/metrics/certs/
shift 3
exec "$@""#,
                )
                .arg("kueue-in-its-mount-namespace")
                .arg(&upper)
                .arg(&work)
                .arg(&certs)
                .arg(&kueue)
                .arg(format!("--config={}", config_path.display()))
                .arg(format!("--feature-gates={KUEUE_FEATURE_GATES}"))
                .arg("--zap-log-level=3")
                .env("KUBECONFIG", &kubeconfig);
            cmd
        })
        .await
        .map_err(|e| match config_error.take() {
            Some(c) => anyhow::Error::from(c).context("writing Kueue's configuration"),
            None => e.context(
                "starting Kueue (its mount namespace needs root and overlayfs; see kueue.log)",
            ),
        })?;
        self.check_alive()
    }

    /// Server-side applies every CRD in `dir` (the Workload CRD is 1.4 MB of YAML, too big
    /// for a client-side apply's last-applied annotation, which is why Kueue's install uses
    /// `--server-side`) and waits until each is Established.
    async fn apply_kueue_crds(&self, dir: &std::path::Path) -> Result<()> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        let mut names = Vec::new();
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .collect::<std::io::Result<Vec<_>>>()?
            .into_iter()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        paths.sort();
        if paths.is_empty() {
            bail!("no CRDs in {}", dir.display());
        }
        for path in paths {
            let text = std::fs::read_to_string(&path)?;
            let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text)
                .with_context(|| format!("parsing {}", path.display()))?;
            let name = crd.metadata.name.clone().context("a CRD without a name")?;
            api.patch(
                &name,
                &PatchParams::apply(HARNESS_FIELD_MANAGER).force(),
                &Patch::Apply(&crd),
            )
            .await
            .with_context(|| format!("applying {}", path.display()))?;
            names.push(name);
        }
        for name in names {
            self.wait_crd_established(&name, Duration::from_secs(60))
                .await?;
        }
        Ok(())
    }
}
