//! The real Helm and kubectl (`tests/scripts/helm.sh`: helm v4 and the 1.37 kubectl, built
//! from the Go module proxy and cached), run on `charts/railguard` with the tests' values sets.
//! The binaries come from `RAILGUARD_HELM_BIN_DIR`, else from running the script; a test that
//! needs them fails when neither gives them, it never skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};
use serde_json::Value as Json;

use crate::chart_values::ValuesSet;
use crate::{helm_binaries, workspace_root};

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
        let name: String = format!("{}-{}", set.release, set.label)
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let path = self.scratch.path().join(format!("{name}.yaml"));
        std::fs::write(&path, set.values)?;
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
        let values = self.values_file(set)?;
        let mut cmd = self.command();
        cmd.args(["template", set.release])
            .arg(chart_dir())
            .args(["--namespace", set.namespace, "--kube-version", kube_version])
            .arg("-f")
            .arg(&values);
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
        if !out.status.success() {
            bail!(
                "helm template ({}) failed: {}",
                set.label,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
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
