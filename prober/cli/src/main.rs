//! railguard-prober: the node-side binary (discovery, simulation, certification, daemon).
//!
//! Exit status: 0 pass, 1 a failed verdict or a CRITICAL finding, 2 a usage, configuration or
//! runtime error (clap's usage errors exit 2 as well).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use railguard_prober_cli::Cli;
use railguard_runtime::{error_line, EXIT_ERROR};

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    // Log lines are written around a progress bar, when one is drawn.
    railguard_runtime::init_logging_with(
        cli.log_format,
        "info",
        railguard_prober_cli::progress::LogWriter,
    );
    match cli.command.run() {
        Ok(outcome) => {
            // A closed pipe (`| head`) is not worth a panic.
            let _ = if outcome.on_stderr {
                std::io::stderr().write_all(outcome.text.as_bytes())
            } else {
                std::io::stdout().write_all(outcome.text.as_bytes())
            };
            ExitCode::from(outcome.exit_code())
        }
        Err(e) => {
            eprintln!("railguard-prober: {}", error_line(e.as_ref()));
            ExitCode::from(EXIT_ERROR)
        }
    }
}
