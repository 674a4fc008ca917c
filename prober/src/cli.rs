//! `railguard-prober`'s command line: the subcommands and, next to the code that runs each,
//! their arguments.
//!
//! In the library so the chart's contract test parses the containers' arguments with the
//! binary's own definition.

use clap::{Parser, Subcommand};

use crate::analyze::AnalyzeArgs;
use crate::campaign::cli::{CampaignArgs, PeerEndpointArgs};
use crate::certify::cli::CertifyArgs;
use crate::daemon::DaemonArgs;
use crate::discover::cli::{AffinityArgs, DiscoverArgs, EmitProfileArgs};
use crate::preflight::PreflightArgs;
use crate::sim::cli::SimSysfsArgs;

#[derive(Parser, Debug)]
#[command(name = "railguard-prober", version, about = "railguard node prober")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands. Each variant's arguments live next to the code that runs it.
#[derive(Subcommand, Debug)]
pub enum Command {
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
    /// One certification run: rails, native RDMA, NCCL; prints the comparison matrix.
    Certify(CertifyArgs),
    /// Offline analysis of nccl-tests output and NCCL debug logs.
    Analyze(AnalyzeArgs),
    /// Passive checks every interval, invasive certification when due; metrics and health.
    Daemon(DaemonArgs),
    /// In-pod check (init container): RDMA devices, locked memory, /dev/shm, NCCL env.
    Preflight(PreflightArgs),
}
