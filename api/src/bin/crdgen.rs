//! Writes the FabricProfile CRD YAML to stdout or to the path given as the first argument.
use std::io::Write;

fn main() -> std::process::ExitCode {
    let yaml = match railguard_api::crd_yaml() {
        Ok(y) => y,
        Err(e) => {
            eprintln!("railguard-crdgen: cannot render the CRD: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = match std::env::args().nth(1) {
        Some(path) => std::fs::write(&path, yaml),
        None => std::io::stdout().write_all(yaml.as_bytes()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("railguard-crdgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
