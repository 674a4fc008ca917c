//! A Helm-like chart: `Chart.yaml`, `values.yaml` (+ `values.schema.json`) and `templates/`,
//! rendered the way `helm template` does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::exec::{MissingKey, TemplateSet};
use super::schema;
use super::value::Value;
use super::TemplateError;

/// The API group/versions a Kubernetes 1.20 API server serves (what `kubectl api-versions`
/// prints there), plus the `group/version/Kind` entries Helm adds for the kinds charts
/// commonly test: `policy/v1beta1` but no `policy/v1`, CronJob only in `batch/v1beta1`.
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

/// A loaded chart.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Directory it was loaded from.
    pub dir: PathBuf,
    /// `Chart.yaml` as `.Chart` sees it (`Name`, `Version`, `AppVersion`, ...).
    pub metadata: BTreeMap<String, Value>,
    /// `values.yaml`.
    pub values: Value,
    /// `values.schema.json`, when present.
    pub schema: Option<serde_json::Value>,
    /// `templates/**` as (name like `railguard/templates/x.yaml`, source).
    pub templates: Vec<(String, String)>,
    /// Other files, for `.Files.Get` (paths relative to the chart).
    pub files: BTreeMap<String, String>,
}

/// Release and cluster inputs for one render.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    pub release_name: String,
    pub namespace: String,
    /// Values overrides applied in order over `values.yaml` (like repeated `-f`).
    pub values: Vec<serde_yaml_ng::Value>,
    /// `.Capabilities.APIVersions`.
    pub api_versions: Vec<String>,
    /// `.Capabilities.KubeVersion.Version`, e.g. `v1.20.2`.
    pub kube_version: String,
    pub is_upgrade: bool,
}

impl RenderOptions {
    /// A release against a Kubernetes 1.20 API server.
    pub fn new(release_name: &str, namespace: &str) -> Self {
        Self {
            release_name: release_name.into(),
            namespace: namespace.into(),
            values: Vec::new(),
            api_versions: KUBE_1_20_API_VERSIONS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            kube_version: "v1.20.2".into(),
            is_upgrade: false,
        }
    }

    /// Adds a values override given as YAML text.
    pub fn with_values_yaml(mut self, yaml: &str) -> Result<Self, TemplateError> {
        let v = serde_yaml_ng::from_str(yaml).map_err(|source| TemplateError::Yaml {
            path: "values override".into(),
            source,
        })?;
        self.values.push(v);
        Ok(self)
    }
}

/// The output of a render: each template's text, in template-name order.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub files: Vec<(String, String)>,
    /// The final (coalesced) values.
    pub values: Value,
}

impl Rendered {
    /// Every non-empty YAML document, with the template it came from.
    pub fn documents(&self) -> Result<Vec<(String, serde_yaml_ng::Value)>, TemplateError> {
        use serde::Deserialize;
        let mut docs = Vec::new();
        for (name, text) in &self.files {
            if name.ends_with("NOTES.txt") {
                continue;
            }
            for de in serde_yaml_ng::Deserializer::from_str(text) {
                let v = serde_yaml_ng::Value::deserialize(de).map_err(|source| {
                    TemplateError::Yaml {
                        path: name.clone(),
                        source,
                    }
                })?;
                if !v.is_null() {
                    docs.push((name.clone(), v));
                }
            }
        }
        Ok(docs)
    }

    /// The concatenated manifest, like `helm template`'s stdout.
    pub fn manifest(&self) -> String {
        let mut out = String::new();
        for (name, text) in &self.files {
            if name.ends_with("NOTES.txt") || text.trim().is_empty() {
                continue;
            }
            out.push_str(&format!(
                "---\n# Source: {name}\n{}\n",
                text.trim_end_matches('\n')
            ));
        }
        out
    }
}

fn read(path: &Path) -> Result<String, TemplateError> {
    std::fs::read_to_string(path).map_err(|source| TemplateError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn walk_files(
    dir: &Path,
    base: &Path,
    out: &mut Vec<(String, PathBuf)>,
) -> Result<(), TemplateError> {
    let entries = std::fs::read_dir(dir).map_err(|source| TemplateError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            walk_files(&p, base, out)?;
        } else {
            let rel = p
                .strip_prefix(base)
                .unwrap_or(&p)
                .to_string_lossy()
                .replace('\\', "/");
            out.push((rel, p));
        }
    }
    Ok(())
}

/// Helm's `.Chart` field names for Chart.yaml keys.
fn chart_field(key: &str) -> String {
    match key {
        "apiVersion" => "APIVersion".into(),
        "appVersion" => "AppVersion".into(),
        "kubeVersion" => "KubeVersion".into(),
        other => {
            let mut c = other.chars();
            match c.next() {
                Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
                None => String::new(),
            }
        }
    }
}

/// Helm's value coalescing (`pkg/chart/common/util/coalesce.go`): maps merge deeply, other
/// values replace; a `null` deletes the key where the defaults give it a value, and elsewhere
/// stays `null` (templates and the schema see it), as do the nulls of a map only the
/// override has.
pub(crate) fn coalesce(base: &mut BTreeMap<String, Value>, over: &BTreeMap<String, Value>) {
    for (k, v) in over {
        match v {
            Value::Nil | Value::Invalid => match base.get(k) {
                Some(Value::Nil | Value::Invalid) | None => {
                    base.insert(k.clone(), Value::Nil);
                }
                Some(_) => {
                    base.remove(k);
                }
            },
            Value::Map(o) => match base.get_mut(k) {
                Some(Value::Map(b)) => coalesce(b, o),
                _ => {
                    base.insert(k.clone(), v.clone());
                }
            },
            other => {
                base.insert(k.clone(), other.clone());
            }
        }
    }
}

impl Chart {
    /// Loads a chart directory.
    pub fn load(dir: impl AsRef<Path>) -> Result<Chart, TemplateError> {
        let dir = dir.as_ref().to_path_buf();
        let meta_path = dir.join("Chart.yaml");
        let meta: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&read(&meta_path)?).map_err(|source| TemplateError::Yaml {
                path: meta_path.display().to_string(),
                source,
            })?;
        let Value::Map(raw) = Value::from_yaml(&meta) else {
            return Err(TemplateError::Chart("Chart.yaml is not a mapping".into()));
        };
        let metadata: BTreeMap<String, Value> =
            raw.into_iter().map(|(k, v)| (chart_field(&k), v)).collect();
        for required in ["Name", "Version"] {
            if !matches!(metadata.get(required), Some(Value::Str(_))) {
                return Err(TemplateError::Chart(format!(
                    "Chart.yaml has no {} string",
                    required.to_lowercase()
                )));
            }
        }
        let values_path = dir.join("values.yaml");
        let values =
            if values_path.exists() {
                let y: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read(&values_path)?)
                    .map_err(|source| TemplateError::Yaml {
                        path: values_path.display().to_string(),
                        source,
                    })?;
                match Value::from_yaml(&y) {
                    Value::Nil => Value::Map(BTreeMap::new()),
                    m @ Value::Map(_) => m,
                    _ => return Err(TemplateError::Chart("values.yaml is not a mapping".into())),
                }
            } else {
                Value::Map(BTreeMap::new())
            };
        let schema_path = dir.join("values.schema.json");
        let schema = if schema_path.exists() {
            Some(
                serde_json::from_str(&read(&schema_path)?)
                    .map_err(|e| TemplateError::Chart(format!("values.schema.json: {e}")))?,
            )
        } else {
            None
        };
        let name = match metadata.get("Name") {
            Some(Value::Str(n)) => n.clone(),
            _ => String::new(),
        };
        let mut all = Vec::new();
        walk_files(&dir, &dir, &mut all)?;
        let mut templates = Vec::new();
        let mut files = BTreeMap::new();
        for (rel, path) in all {
            if rel.starts_with("templates/") {
                templates.push((format!("{name}/{rel}"), read(&path)?));
            } else if !rel.starts_with("crds/") && !rel.starts_with("charts/") {
                // Binary files are not used by templates here; skip what is not UTF-8.
                if let Ok(text) = std::fs::read_to_string(&path) {
                    files.insert(rel, text);
                }
            }
        }
        Ok(Chart {
            dir,
            metadata,
            values,
            schema,
            templates,
            files,
        })
    }

    /// The chart's name.
    pub fn name(&self) -> String {
        match self.metadata.get("Name") {
            Some(Value::Str(n)) => n.clone(),
            _ => String::new(),
        }
    }

    /// The CRDs in `crds/` (installed before templates, never templated).
    pub fn crds(&self) -> Result<Vec<(String, String)>, TemplateError> {
        let mut out = Vec::new();
        let crd_dir = self.dir.join("crds");
        if crd_dir.is_dir() {
            let mut all = Vec::new();
            walk_files(&crd_dir, &self.dir, &mut all)?;
            for (rel, path) in all {
                out.push((rel, read(&path)?));
            }
        }
        Ok(out)
    }

    /// Coalesces values and validates them against the schema.
    pub fn values_for(&self, opts: &RenderOptions) -> Result<Value, TemplateError> {
        let Value::Map(mut vals) = self.values.clone() else {
            return Err(TemplateError::Chart("values are not a mapping".into()));
        };
        for over in &opts.values {
            match Value::from_yaml(over) {
                Value::Map(o) => coalesce(&mut vals, &o),
                Value::Nil => {}
                _ => {
                    return Err(TemplateError::Chart(
                        "a values override is not a mapping".into(),
                    ))
                }
            }
        }
        let vals = Value::Map(vals);
        if let Some(schema) = &self.schema {
            let errs = schema::validate(schema, &vals.to_json()).map_err(TemplateError::Chart)?;
            if !errs.is_empty() {
                return Err(TemplateError::Schema(errs));
            }
        }
        Ok(vals)
    }

    /// Renders every template like `helm template`: partials (`_*`) only define, output
    /// has `<no value>` removed.
    pub fn render(&self, opts: &RenderOptions) -> Result<Rendered, TemplateError> {
        let values = self.values_for(opts)?;
        let mut set = TemplateSet::new();
        set.missing_key = MissingKey::Zero;
        for (name, src) in &self.templates {
            set.add(name, src)?;
        }
        let kube = opts.kube_version.trim_start_matches('v');
        let mut parts = kube.split('.');
        let major = parts.next().unwrap_or("1").to_string();
        let minor = parts.next().unwrap_or("0").to_string();
        let s = |x: &str| Value::Str(x.to_string());
        let map = |pairs: Vec<(&str, Value)>| {
            Value::Map(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
        };
        let capabilities = map(vec![
            ("APIVersions", Value::ApiVersions(opts.api_versions.clone())),
            (
                "KubeVersion",
                map(vec![
                    ("Version", s(&opts.kube_version)),
                    ("GitVersion", s(&opts.kube_version)),
                    ("Major", s(&major)),
                    ("Minor", s(&minor)),
                ]),
            ),
            ("HelmVersion", map(vec![("Version", s("v3.14.0"))])),
        ]);
        let release = map(vec![
            ("Name", s(&opts.release_name)),
            ("Namespace", s(&opts.namespace)),
            ("Service", s("Helm")),
            ("IsInstall", Value::Bool(!opts.is_upgrade)),
            ("IsUpgrade", Value::Bool(opts.is_upgrade)),
            ("Revision", Value::Int(1)),
        ]);
        let chart_name = self.name();
        let mut files = Vec::new();
        for (name, _) in &self.templates {
            let base = name.rsplit('/').next().unwrap_or(name);
            if base.starts_with('_') {
                continue;
            }
            let top = map(vec![
                ("Values", values.clone()),
                ("Release", release.clone()),
                ("Chart", Value::Map(self.metadata.clone())),
                ("Capabilities", capabilities.clone()),
                ("Files", Value::Files(self.files.clone())),
                (
                    "Template",
                    map(vec![
                        ("Name", s(name)),
                        ("BasePath", s(&format!("{chart_name}/templates"))),
                    ]),
                ),
            ]);
            let text = set.execute(name, &top)?;
            files.push((name.clone(), text.replace("<no value>", "")));
        }
        Ok(Rendered { files, values })
    }
}
