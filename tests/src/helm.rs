//! The real Helm and kubectl (`tests/scripts/helm.sh`: helm v4 and the 1.37 kubectl, built
//! from the Go module proxy and cached), run on `charts/railguard` with the tests' values sets.
//! The binaries come from `RAILGUARD_HELM_BIN_DIR`, else from running the script; a test that
//! needs them fails when neither gives them, it never skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use serde_json::Value as Json;

use crate::{helm_binaries, workspace_root};

/// The API group/versions a Kubernetes 1.20 API server serves (what `kubectl api-versions`
/// prints there), plus the `group/version/Kind` entries the chart tests for: `policy/v1beta1`
/// but no `policy/v1`, CronJob only in `batch/v1beta1`. Given to `helm template` as
/// `--api-versions`, which adds them to Helm's built-in list; that list holds group/versions
/// only, so the chart's `group/version/Kind` checks see exactly these.
pub const KUBE_1_20_API_VERSIONS: &[&str] = &[
    "policy/v1beta1/PodDisruptionBudget",
    "batch/v1beta1/CronJob",
    "batch/v1/Job",
    "apps/v1/Deployment",
    "apps/v1/DaemonSet",
    "admissionregistration.k8s.io/v1",
    "admissionregistration.k8s.io/v1beta1",
    "apiextensions.k8s.io/v1",
    "apiextensions.k8s.io/v1beta1",
    "apiregistration.k8s.io/v1",
    "apiregistration.k8s.io/v1beta1",
    "apps/v1",
    "authentication.k8s.io/v1",
    "authentication.k8s.io/v1beta1",
    "authorization.k8s.io/v1",
    "authorization.k8s.io/v1beta1",
    "autoscaling/v1",
    "autoscaling/v2beta1",
    "autoscaling/v2beta2",
    "batch/v1",
    "batch/v1beta1",
    "certificates.k8s.io/v1",
    "certificates.k8s.io/v1beta1",
    "coordination.k8s.io/v1",
    "coordination.k8s.io/v1beta1",
    "discovery.k8s.io/v1beta1",
    "events.k8s.io/v1",
    "events.k8s.io/v1beta1",
    "extensions/v1beta1",
    "networking.k8s.io/v1",
    "networking.k8s.io/v1beta1",
    "node.k8s.io/v1",
    "node.k8s.io/v1beta1",
    "policy/v1beta1",
    "rbac.authorization.k8s.io/v1",
    "rbac.authorization.k8s.io/v1beta1",
    "scheduling.k8s.io/v1",
    "scheduling.k8s.io/v1beta1",
    "storage.k8s.io/v1",
    "storage.k8s.io/v1beta1",
    "v1",
];

/// The 1.20 server's version, as `--kube-version` takes it.
pub const KUBE_1_20_VERSION: &str = "v1.20.2";

/// [`KUBE_1_20_API_VERSIONS`] as owned strings.
pub fn kube_1_20_api_versions() -> Vec<String> {
    KUBE_1_20_API_VERSIONS
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// One object of `helm template`'s output and the template it came from (its `# Source:`).
#[derive(Debug, Clone)]
pub struct HelmDoc {
    pub source: String,
    pub obj: Json,
}

/// Where `helm` and `kubectl` are, and a scratch dir for values files.
pub struct Helm {
    dir: PathBuf,
    scratch: tempfile::TempDir,
}

/// The process's [`Helm`]; a test that calls this without the binaries panics, saying how to
/// get them.
pub fn shared() -> &'static Helm {
    static HELM: OnceLock<Helm> = OnceLock::new();
    HELM.get_or_init(|| {
        Helm::new().unwrap_or_else(|e| {
            panic!(
                "the chart tests need the real helm and kubectl: `bash tests/scripts/helm.sh` \
                 builds them and prints their directory, which RAILGUARD_HELM_BIN_DIR names \
                 (tests/scripts/test-all.sh sets it): {e:#}"
            )
        })
    })
}

impl Helm {
    /// The pinned binaries (see the module doc).
    pub fn new() -> Result<Helm> {
        Ok(Helm {
            dir: helm_binaries()?,
            scratch: tempfile::tempdir()?,
        })
    }

    pub fn helm(&self) -> PathBuf {
        self.dir.join("helm")
    }

    pub fn kubectl(&self) -> PathBuf {
        self.dir.join("kubectl")
    }

    /// A `helm` command with its state (config, cache, plugins) in the scratch dir, so the
    /// user's own Helm setup neither leaks in nor is written to.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(self.helm());
        let home = self.scratch.path().join("home");
        for (var, sub) in [
            ("HELM_CONFIG_HOME", "config"),
            ("HELM_CACHE_HOME", "cache"),
            ("HELM_DATA_HOME", "data"),
        ] {
            cmd.env(var, home.join(sub));
        }
        cmd.env_remove("KUBECONFIG");
        cmd
    }

    /// `set`'s values as a file.
    pub fn values_file(&self, set: &ValuesSet) -> Result<PathBuf> {
        self.write_values(set.values)
    }

    /// `values` (YAML) as a file of its own in the scratch dir (one per call: tests render
    /// concurrently).
    pub fn write_values(&self, values: &str) -> Result<PathBuf> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = self.scratch.path().join(format!("values-{n}.yaml"));
        std::fs::write(&path, values)?;
        Ok(path)
    }

    /// `helm lint --strict` of the chart with `set` for a cluster at `kube_version`.
    pub fn lint(&self, set: &ValuesSet, kube_version: &str) -> Result<Output> {
        let values = self.values_file(set)?;
        let out = self
            .command()
            .arg("lint")
            .arg("--strict")
            .arg(chart_dir())
            .args(["--namespace", set.namespace, "--kube-version", kube_version])
            .arg("-f")
            .arg(&values)
            .output()
            .context("running helm lint")?;
        Ok(out)
    }

    /// `helm template` of the chart with `set` for a cluster at `kube_version` serving
    /// `api_versions` (added to Helm's own built-in list, as `--api-versions` does); the raw
    /// output.
    pub fn template_output(
        &self,
        set: &ValuesSet,
        api_versions: &[String],
        kube_version: &str,
    ) -> Result<Output> {
        self.template_values_output(
            set.release,
            set.namespace,
            &[set.values],
            api_versions,
            kube_version,
        )
    }

    /// `helm template RELEASE charts/railguard` in `namespace` with each of `values` (YAML) as
    /// a `-f` file, in order, for a cluster at `kube_version` serving `api_versions`; the raw
    /// output.
    pub fn template_values_output(
        &self,
        release: &str,
        namespace: &str,
        values: &[&str],
        api_versions: &[String],
        kube_version: &str,
    ) -> Result<Output> {
        let mut cmd = self.command();
        cmd.args(["template", release]).arg(chart_dir()).args([
            "--namespace",
            namespace,
            "--kube-version",
            kube_version,
        ]);
        for v in values {
            cmd.arg("-f").arg(self.write_values(v)?);
        }
        for v in api_versions {
            cmd.args(["--api-versions", v]);
        }
        cmd.output().context("running helm template")
    }

    /// [`Helm::template_output`]'s manifest, or the error Helm printed.
    pub fn template(
        &self,
        set: &ValuesSet,
        api_versions: &[String],
        kube_version: &str,
    ) -> Result<String> {
        let out = self.template_output(set, api_versions, kube_version)?;
        manifest_of(out, &format!("({})", set.label))
    }

    /// [`Helm::template`]'s objects.
    pub fn template_docs(
        &self,
        set: &ValuesSet,
        api_versions: &[String],
        kube_version: &str,
    ) -> Result<Vec<HelmDoc>> {
        documents(&self.template(set, api_versions, kube_version)?)
    }

    /// `helm ARGS --kubeconfig KUBECONFIG` (install, upgrade, uninstall, get ...) against the
    /// cluster of `kubeconfig`; its stdout, or the error Helm printed.
    pub fn on_cluster<I, S>(&self, kubeconfig: &Path, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let args: Vec<std::ffi::OsString> =
            args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let out = self
            .command()
            .args(&args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .output()
            .context("running helm")?;
        if !out.status.success() {
            bail!(
                "helm {} failed ({}): {}{}",
                args.iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }

    /// `kubectl apply --dry-run=server --validate=strict -f file` against the cluster of
    /// `kubeconfig`.
    pub fn kubectl_dry_run(&self, kubeconfig: &Path, file: &Path) -> Result<Output> {
        let file = file.to_str().context("a UTF-8 manifest path")?;
        self.kubectl_with(
            kubeconfig,
            &["apply", "--dry-run=server", "--validate=strict", "-f", file],
        )
    }

    /// `kubectl` with `args` against the cluster of `kubeconfig`.
    pub fn kubectl_with(&self, kubeconfig: &Path, args: &[&str]) -> Result<Output> {
        Command::new(self.kubectl())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .context("running kubectl")
    }
}

/// A release name, namespace and values overrides to render the chart with (the sets the
/// tests use, and how each renders: `crate::chart_values`).
#[derive(Debug, Clone, Copy)]
pub struct ValuesSet {
    pub label: &'static str,
    pub release: &'static str,
    pub namespace: &'static str,
    pub values: &'static str,
}

/// `kubectl apply --dry-run=server` (`out`) succeeded and dry-ran all `objects` objects;
/// `context` starts each failure's message.
#[track_caller]
pub fn assert_server_dry_run(out: &Output, objects: usize, context: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{context}kubectl dry run failed:\n{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count(),
        objects,
        "{context}every object dry-run:\n{stdout}"
    );
}

/// The chart under test.
pub fn chart_dir() -> PathBuf {
    workspace_root().join("charts/railguard")
}

/// The objects of a manifest as Helm prints it (`---`, `# Source: <template>`, the object).
pub fn documents(manifest: &str) -> Result<Vec<HelmDoc>> {
    // A document marker is a `---` line at column 0 (one inside a block scalar is indented).
    let mut parts: Vec<String> = vec![String::new()];
    for line in manifest.lines() {
        if line == "---" || line.starts_with("--- ") {
            parts.push(String::new());
        }
        let last = parts.len() - 1;
        parts[last].push_str(line);
        parts[last].push('\n');
    }
    let mut docs = Vec::new();
    for part in &parts {
        let source = part
            .lines()
            .find_map(|l| l.strip_prefix("# Source: "))
            .unwrap_or_default()
            .to_string();
        let v = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(part)
            .with_context(|| format!("helm's output from {source}"))?;
        if !v.is_null() {
            docs.push(HelmDoc {
                source,
                obj: serde_json::to_value(v)?,
            });
        }
    }
    Ok(docs)
}

/// The manifest a `helm template` run printed, or the error Helm printed (`what` names the
/// run in it).
pub fn manifest_of(out: Output, what: &str) -> Result<String> {
    if !out.status.success() {
        bail!(
            "helm template {what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// The objects of a `helm template` run ([`manifest_of`]).
pub fn documents_of(out: Output, what: &str) -> Result<Vec<HelmDoc>> {
    documents(&manifest_of(out, what)?)
}
