//! A Go `text/template` renderer with the Sprig/Helm functions railguard's chart uses, and a
//! Helm-like chart loader on top of it — so the chart can be rendered and checked in tests
//! on machines where Helm cannot be installed.
//!
//! Semantics follow Go's `text/template` (truthiness, `{{-`/`-}}` trimming, variable
//! scoping, sorted map iteration, `and`/`or` short-circuit returning operands, `eq` refusing
//! to compare an int with a float, missing keys) and Helm's engine (`missingkey=zero`,
//! `<no value>` removed from output, values coalesced with user overrides where `null`
//! deletes a key the defaults set and stays `null` elsewhere, numbers from values are
//! float64, `lookup` empty without a cluster, `values.schema.json` validation). Functions outside [`funcs::is_function`] are
//! rejected at parse time, like Go's "function not defined".

mod chart;
mod exec;
pub mod funcs;
mod parse;
mod schema;
mod value;

#[cfg(test)]
mod tests;

pub use chart::{Chart, RenderOptions, Rendered, KUBE_1_20_API_VERSIONS};
pub use exec::{MissingKey, TemplateSet};
pub use schema::validate as validate_schema;
pub use value::{go_float, Value};

/// Errors from parsing, executing or loading templates.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The source is not a valid template.
    #[error("template: {template}:{line}: {msg}")]
    Parse {
        template: String,
        line: usize,
        msg: String,
    },
    /// Execution failed (a function error, `required`, `fail`, a bad field access).
    #[error("template: {template}:{line}: {msg}")]
    Exec {
        template: String,
        line: usize,
        msg: String,
    },
    /// `template`/`include`/execute named a template that does not exist.
    #[error("no template {0:?}")]
    NoTemplate(String),
    /// A chart file could not be read.
    #[error("reading {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A chart file or values override is not valid YAML/JSON.
    #[error("parsing {path}")]
    Yaml {
        path: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// Values do not satisfy `values.schema.json`.
    #[error("values don't meet the specifications of the schema:\n{}", .0.join("\n"))]
    Schema(Vec<String>),
    /// The chart itself is malformed (Chart.yaml missing fields, schema uses an
    /// unsupported keyword, rendered output is not YAML).
    #[error("chart: {0}")]
    Chart(String),
}
