//! railguard-prober: the node-side binary (discovery, simulation, certification, daemon).

use std::process::ExitCode;

use clap::Parser;

use railguard_prober::cli::{Cli, Command};

/// Runs an async command on a fresh runtime; exit 1 when the command reports a failed verdict.
fn run_async<F>(fut: F) -> ExitCode
where
    F: std::future::Future<Output = anyhow::Result<(String, bool)>>,
{
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("railguard-prober: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    verdict_exit(rt.block_on(fut))
}

/// Prints the text; exit 0 on success, 1 when the verdict is not a pass, 2 on errors.
fn verdict_exit(out: anyhow::Result<(String, bool)>) -> ExitCode {
    match out {
        Ok((text, ok)) => {
            print!("{text}");
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("railguard-prober: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn print(out: anyhow::Result<String>) -> ExitCode {
    match out {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("railguard-prober: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RAILGUARD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Discover(a) => print(a.run().map_err(Into::into)),
        Command::Affinity(a) => print(a.run().map_err(Into::into)),
        Command::EmitProfile(a) => print(a.run().map_err(Into::into)),
        Command::SimSysfs(a) => print(a.run().map_err(Into::into)),
        Command::Campaign(a) => print(a.run()),
        Command::PeerEndpoint(a) => print(a.run()),
        Command::Certify(a) => run_async(async move { a.run().await }),
        Command::Daemon(a) => {
            run_async(async move { a.run().await.map(|()| (String::new(), true)) })
        }
        Command::Preflight(a) => match a.run() {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(text) => {
                eprintln!("{text}");
                ExitCode::FAILURE
            }
        },
        Command::Analyze(a) => {
            verdict_exit(a.run().map(|(t, failed)| (t, !failed)).map_err(Into::into))
        }
    }
}
