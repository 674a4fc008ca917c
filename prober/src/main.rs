//! railguard-prober: the node-side binary (discovery, simulation, certification, daemon).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use railguard_prober::campaign::cli::{CampaignArgs, PeerEndpointArgs};
use railguard_prober::discover::cli::{AffinityArgs, DiscoverArgs, EmitProfileArgs};
use railguard_prober::sim::cli::SimSysfsArgs;

#[derive(Parser, Debug)]
#[command(name = "railguard-prober", version, about = "railguard node prober")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Subcommands. Each variant's arguments live next to the code that runs it.
#[derive(Subcommand, Debug)]
enum Command {
    /// Affinity map, rails and readiness findings of this node (from sysfs).
    Discover(DiscoverArgs),
    /// Affinity map from a saved `nvidia-smi topo -m`.
    Affinity(AffinityArgs),
    /// A FabricProfile YAML for this node's rail layout.
    EmitProfile(EmitProfileArgs),
    /// Write a synthetic sysfs tree for a node model (simulation, demos).
    SimSysfs(SimSysfsArgs),
    /// Test the nodes of a profile pairwise, rail by rail, and localize bad nodes, rails, links.
    Campaign(CampaignArgs),
    /// Serve campaign tests for this node (control channel and RDMA side channel).
    PeerEndpoint(PeerEndpointArgs),
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
    }
}
