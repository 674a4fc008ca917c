//! The node models of `prober/models`, compiled into this crate, and where a model named on
//! the command line comes from: `--sim NAME` and `sim-sysfs --model NAME` work without a
//! source tree, a YAML path or a `--models-dir` still wins.

use std::fmt;
use std::path::{Path, PathBuf};

use super::model::NodeModel;
use super::ModelError;

/// The shipped models, name (file name without `.yaml`) -> YAML. A `base:` of a built-in
/// model names another one (`base: dgx-h100.yaml`).
pub const BUILTIN_MODELS: &[(&str, &str)] = &[
    (
        "dgx-a100",
        include_str!("../../prober/models/dgx-a100.yaml"),
    ),
    (
        "dgx-h100",
        include_str!("../../prober/models/dgx-h100.yaml"),
    ),
    (
        "h100-acs",
        include_str!("../../prober/models/h100-acs.yaml"),
    ),
    (
        "h100-hca-far-socket",
        include_str!("../../prober/models/h100-hca-far-socket.yaml"),
    ),
    (
        "h100-iommu-no-peermem",
        include_str!("../../prober/models/h100-iommu-no-peermem.yaml"),
    ),
    (
        "h100-numa-unknown",
        include_str!("../../prober/models/h100-numa-unknown.yaml"),
    ),
    (
        "h100-pcie-x8",
        include_str!("../../prober/models/h100-pcie-x8.yaml"),
    ),
    (
        "h100-port-down",
        include_str!("../../prober/models/h100-port-down.yaml"),
    ),
    (
        "h100-rate-downshift",
        include_str!("../../prober/models/h100-rate-downshift.yaml"),
    ),
    (
        "h100-slow-rail",
        include_str!("../../prober/models/h100-slow-rail.yaml"),
    ),
    (
        "roce-cloud",
        include_str!("../../prober/models/roce-cloud.yaml"),
    ),
];

/// The YAML of the built-in model `name` (with or without `.yaml`).
pub fn builtin_model(name: &str) -> Option<&'static str> {
    let name = name.strip_suffix(".yaml").unwrap_or(name);
    BUILTIN_MODELS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, yaml)| *yaml)
}

/// Where a node model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A YAML file; its `base:` is relative to it.
    File(PathBuf),
    /// A model built into this binary ([`BUILTIN_MODELS`]); its `base:` is built in too.
    Builtin(String),
}

impl ModelSource {
    /// The model `--sim` (or `sim-sysfs --model`) names: an existing YAML file; else
    /// `NAME.yaml` in `models_dir` when given; else a path (one with a directory, to report
    /// it missing); else a built-in model's name.
    pub fn resolve(sim: &str, models_dir: Option<&Path>) -> Self {
        let p = PathBuf::from(sim);
        if p.is_file() {
            return ModelSource::File(p);
        }
        if let Some(dir) = models_dir {
            return ModelSource::File(dir.join(format!("{sim}.yaml")));
        }
        if p.components().count() > 1 {
            return ModelSource::File(p);
        }
        ModelSource::Builtin(sim.to_string())
    }

    /// Loads the model (see [`NodeModel::load`] and [`NodeModel::builtin`]).
    pub fn load(&self) -> Result<NodeModel, ModelError> {
        match self {
            ModelSource::File(path) => NodeModel::load(path),
            ModelSource::Builtin(name) => NodeModel::builtin(name),
        }
    }
}

impl fmt::Display for ModelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelSource::File(path) => write!(f, "{}", path.display()),
            ModelSource::Builtin(name) => write!(f, "{name} (built in)"),
        }
    }
}

/// The names of the built-in models, for error messages.
pub(crate) fn builtin_names() -> String {
    BUILTIN_MODELS
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const SOURCE_MODELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../prober/models");

    /// Every file of `prober/models` is built in, under its name, with the same text.
    #[test]
    fn every_shipped_model_is_built_in() {
        let mut on_disk: Vec<String> = std::fs::read_dir(SOURCE_MODELS)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter_map(|f| f.strip_suffix(".yaml").map(str::to_string))
            .collect();
        on_disk.sort();
        let built_in: Vec<&str> = BUILTIN_MODELS.iter().map(|(n, _)| *n).collect();
        assert_eq!(on_disk, built_in);
        for (name, yaml) in BUILTIN_MODELS {
            let file = std::fs::read_to_string(format!("{SOURCE_MODELS}/{name}.yaml")).unwrap();
            assert_eq!(&file, yaml, "{name}");
        }
    }

    /// A built-in model loads as its file does, `base:` included.
    #[test]
    fn builtin_models_load_like_their_files() {
        for (name, _) in BUILTIN_MODELS {
            let built_in = NodeModel::builtin(name).unwrap();
            let file =
                NodeModel::load(&Path::new(SOURCE_MODELS).join(format!("{name}.yaml"))).unwrap();
            assert_eq!(built_in, file, "{name}");
        }
        assert_eq!(
            NodeModel::builtin("dgx-h100.yaml").unwrap(),
            NodeModel::builtin("dgx-h100").unwrap()
        );
    }

    #[test]
    fn resolve_prefers_files_then_models_dir_then_builtin() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mine.yaml");
        std::fs::write(&file, "name: x\n").unwrap();
        let file_str = file.to_str().unwrap();
        assert_eq!(
            ModelSource::resolve(file_str, None),
            ModelSource::File(file.clone())
        );
        assert_eq!(
            ModelSource::resolve("dgx-h100", Some(dir.path())),
            ModelSource::File(dir.path().join("dgx-h100.yaml"))
        );
        assert_eq!(
            ModelSource::resolve("dgx-h100", None),
            ModelSource::Builtin("dgx-h100".into())
        );
        assert_eq!(
            ModelSource::resolve("/nonexistent/model.yaml", None),
            ModelSource::File("/nonexistent/model.yaml".into())
        );
        let e = ModelSource::resolve("no-such-model", None)
            .load()
            .unwrap_err()
            .to_string();
        assert!(e.contains("no-such-model") && e.contains("dgx-h100"), "{e}");
    }
}
