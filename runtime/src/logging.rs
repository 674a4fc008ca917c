//! One logging set-up for every binary: text or JSON lines on stderr, colour only on a
//! terminal, the filter from `RAILGUARD_LOG` (or `RUST_LOG`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Variables the log filter is read from, first set wins (`RUST_LOG` syntax).
pub const LOG_FILTER_VARS: [&str; 2] = ["RAILGUARD_LOG", "RUST_LOG"];

/// How log lines are written (`--log-format`, env `RAILGUARD_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line (what the chart sets).
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether log lines get ANSI colour: text logs on a terminal, unless `NO_COLOR` is set.
pub fn use_ansi(format: LogFormat, stderr_is_terminal: bool, no_color: bool) -> bool {
    format == LogFormat::Text && stderr_is_terminal && !no_color
}

/// The filter directives: the first of `vars` (values of [`LOG_FILTER_VARS`], in order) that
/// is set, non-empty and valid; otherwise `default`.
pub fn filter_directives(vars: &[Option<String>], default: &str) -> String {
    vars.iter()
        .flatten()
        .map(|v| v.trim())
        .find(|v| !v.is_empty() && EnvFilter::try_new(v).is_ok())
        .map_or_else(|| default.to_string(), str::to_string)
}

/// Installs the global subscriber: `format` lines on stderr, filtered by `RAILGUARD_LOG`, else
/// `RUST_LOG`, else `default_directive` (e.g. `info`). A second call does nothing.
pub fn init_logging(format: LogFormat, default_directive: &str) {
    init_logging_with(format, default_directive, std::io::stderr);
}

/// [`init_logging`] writing through `writer`, which must end up on stderr (colour is decided
/// by whether stderr is a terminal): e.g. a writer that hides a progress bar while a line
/// is written.
pub fn init_logging_with<W>(format: LogFormat, default_directive: &str, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let vars: Vec<Option<String>> = LOG_FILTER_VARS
        .iter()
        .map(|v| std::env::var(v).ok())
        .collect();
    let filter = EnvFilter::new(filter_directives(&vars, default_directive));
    let ansi = use_ansi(
        format,
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    // An error means a subscriber is already installed (tests): keep that one.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_for_text_on_a_terminal_without_no_color() {
        assert!(use_ansi(LogFormat::Text, true, false));
        assert!(!use_ansi(LogFormat::Text, false, false));
        assert!(!use_ansi(LogFormat::Text, true, true));
        assert!(!use_ansi(LogFormat::Json, true, false));
    }

    #[test]
    fn the_first_valid_filter_variable_wins() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(filter_directives(&[None, None], "info"), "info");
        assert_eq!(filter_directives(&[s("debug"), s("warn")], "info"), "debug");
        assert_eq!(filter_directives(&[None, s("warn")], "info"), "warn");
        assert_eq!(filter_directives(&[s(" "), s("warn")], "info"), "warn");
        assert_eq!(
            filter_directives(&[s("railguard=debug,info")], "info"),
            "railguard=debug,info"
        );
        // A filter that does not parse falls through instead of silencing the logs.
        assert_eq!(filter_directives(&[s("[[["), None], "info"), "info");
    }

    #[test]
    fn log_format_values_are_text_and_json() {
        use clap::ValueEnum;
        let names: Vec<String> = LogFormat::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        assert_eq!(names, ["text", "json"]);
        assert_eq!(LogFormat::Json.to_string(), "json");
        assert_eq!(LogFormat::default(), LogFormat::Text);
    }
}
