//! `railguard-prober`'s shell: the command line (subcommands and, next to the code that runs
//! each, their arguments), the async runtime, the daemon loop with its metrics and health
//! port, the Kubernetes client wiring and progress drawing, around the typed operations of
//! the `railguard-prober` library.
//!
//! A library so the chart's contract test parses the containers' arguments with the binary's
//! own definition ([`Cli`]).
//!
//! Exit status, the same for every subcommand: 0 pass, 1 a failed verdict or a CRITICAL
//! finding ([`Status::Fail`]), 2 a usage, configuration or runtime error.

pub mod analyze;
pub mod campaign;
pub mod certification;
pub mod certify;
pub mod cleanup;
pub mod daemon;
pub mod discover;
pub mod fleet;
pub mod gpu_check;
pub mod gpu_pods;
pub mod health;
pub mod nccl_env;
pub mod nccl_ranks;
pub mod node_context;
pub mod peer_token;
pub mod preflight;
pub mod profile_source;
pub mod progress;
pub mod sim;
pub mod unprofiled;
pub mod upgrade_crd;
pub mod verify_install;

use clap::{Parser, Subcommand};
use railguard_runtime::LogFormat;

/// The cluster client every subcommand uses: `--kubeconfig`, else in-cluster config or
/// `$KUBECONFIG` (railguard_kube::kube_client, with the prober's flag named in its errors).
pub async fn cluster_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    Ok(railguard_kube::kube_client(
        kubeconfig,
        "--kubeconfig",
        "pass --kubeconfig, or run in a cluster",
    )
    .await?)
}

use crate::analyze::AnalyzeArgs;
use crate::campaign::{CampaignArgs, PeerEndpointArgs};
use crate::certify::CertifyArgs;
use crate::cleanup::CleanupArgs;
use crate::daemon::DaemonArgs;
use crate::discover::{AffinityArgs, DiscoverArgs, EmitProfileArgs};
use crate::fleet::FleetArgs;
use crate::gpu_check::GpuCheckArgs;
use crate::nccl_env::NcclEnvArgs;
use crate::nccl_ranks::NcclRanksArgs;
use crate::peer_token::PeerTokenArgs;
use crate::preflight::PreflightArgs;
use crate::sim::SimSysfsArgs;
use crate::upgrade_crd::UpgradeCrdArgs;
use crate::verify_install::VerifyInstallArgs;

/// The exit status convention, shown under every `--help`.
pub const EXIT_STATUS: &str =
    "Exit status: 0 pass, 1 failed verdict or CRITICAL finding, 2 usage, configuration or runtime error.";

/// Example invocations shown by `railguard-prober --help`.
pub const EXAMPLES: &str = "\
Examples:
  railguard-prober discover --sysfs-root /host --json
  railguard-prober certify --profile-file profiles.yaml --profile h100-ndr
  railguard-prober daemon --node $NODE_NAME --sysfs-root /host --log-format json

Exit status: 0 pass, 1 failed verdict or CRITICAL finding, 2 usage, configuration or runtime error.";

#[derive(Parser, Debug)]
#[command(
    name = "railguard-prober",
    version,
    about = "railguard node prober",
    after_help = EXAMPLES
)]
pub struct Cli {
    /// Log format: `text` (coloured only on a terminal) or `json` lines, on stderr. The
    /// filter comes from RAILGUARD_LOG (or RUST_LOG), default `info`.
    #[arg(
        long,
        env = "RAILGUARD_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
        global = true
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands. Each variant's arguments live next to the code that runs it.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Affinity map, rails and readiness findings of this node (from sysfs).
    #[command(after_help = "\
Example:
  railguard-prober discover --sysfs-root /host --json

Exit status: 0 no CRITICAL finding, 1 a CRITICAL finding, 2 the sysfs root cannot be read.")]
    Discover(DiscoverArgs),
    /// Affinity map from a saved `nvidia-smi topo -m`.
    #[command(after_help = "\
Example:
  nvidia-smi topo -m > topo.txt && railguard-prober affinity --topo topo.txt

Exit status: 0 no CRITICAL finding, 1 a CRITICAL finding, 2 the file cannot be read or parsed.")]
    Affinity(AffinityArgs),
    /// A FabricProfile YAML for this node's rail layout.
    #[command(after_help = "\
Example:
  railguard-prober emit-profile --sysfs-root /host --profile h100-ndr > h100-ndr.yaml

Exit status: 0 printed, 2 error.")]
    EmitProfile(EmitProfileArgs),
    /// Write a synthetic sysfs tree for a node model (simulation, demos).
    #[command(after_help = "\
Example:
  railguard-prober sim-sysfs --model prober/models/h100-port-down.yaml --out /tmp/node-a
  railguard-prober discover --sysfs-root /tmp/node-a

Exit status: 0 written, 2 error.")]
    SimSysfs(SimSysfsArgs),
    /// Test the nodes of a profile pairwise, rail by rail, and localize bad nodes, rails, links.
    #[command(after_help = "\
Examples:
  railguard-prober campaign --profile h100-ndr --token-file /etc/railguard/peer/token
  railguard-prober campaign --profile h100-ndr --profile-file p.yaml --nccl-pair node-a,node-b

Exit status: 0 no fault found, 1 a node, rail or link blamed (or a failed 2-node NCCL log),
2 error.")]
    Campaign(CampaignArgs),
    /// Serve campaign tests for this node (control channel and RDMA side channel).
    #[command(after_help = "\
Example:
  railguard-prober peer-endpoint --node $NODE_NAME --profile h100-ndr \\
    --token-file /etc/railguard/peer/token --listen 0.0.0.0:7470

Exit status: 0 after SIGTERM, 2 error.")]
    PeerEndpoint(PeerEndpointArgs),
    /// Ensure the campaign's token Secret holds a token (generated once when it does not)
    /// and write it to a file: the init container of the peer endpoints and the campaign.
    #[command(after_help = "\
Example:
  railguard-prober peer-token --secret railguard-peer-token --namespace railguard \\
    --out /etc/railguard/peer/token

Rotation: remove the Secret's token key (or delete the Secret and run helm upgrade), then
restart the prober DaemonSets; the next campaign run reads the new token.

Exit status: 0 the file is written, 2 error.")]
    PeerToken(PeerTokenArgs),
    #[command(after_help = "\
Examples:
  railguard-prober fleet --profile h100-ndr --html fleet.html
  railguard-prober fleet --watch --metrics-listen 0.0.0.0:9464

Report mode prints every node of each profile with its verdict, outlier marks and per-rail
host bandwidth relative to the fleet baseline; --watch runs the fleet controller.

Exit status: 0 no outlier (controller: after SIGTERM), 1 a node is a fleet outlier, 2 error.")]
    Fleet(FleetArgs),
    /// This node's ranks of one NCCL pair test (started by the peer endpoint).
    #[command(
        hide = true,
        after_help = "\
Example:
  railguard-prober nccl-ranks --sizes 1048576,4194304 --gpus 0,1 > id-and-result.jsonl

Exit status: 0 measured, 1 the ranks did not run (the error is the last stdout line), 2 error."
    )]
    NcclRanks(NcclRanksArgs),
    /// The GPU layers on this node: discovery, GPU memory through the CUDA driver API, and a
    /// one-GPU NCCL all-reduce, as JSON (skipped on a CPU-only node).
    #[command(after_help = "\
Example:
  railguard-prober gpu-check --nccl-library /opt/nccl/lib/libnccl.so.2

Exit status: 0 pass or skipped (no GPU, no driver), 1 a layer failed, 2 error.")]
    GpuCheck(GpuCheckArgs),
    /// One certification run: rails, native RDMA, NCCL; prints the comparison matrix.
    #[command(after_help = "\
Examples:
  railguard-prober certify --sysfs-root /host --profile-file profiles.yaml --profile h100-ndr
  railguard-prober certify --sim dgx-h100 --profile-file api/fixtures/profiles/dgx-h100-ndr.yaml --json

Progress (rail, step, elapsed, remaining) is drawn on stderr when it is a terminal and
--json is not given.

Exit status: 0 certified, 1 degraded or failed, 2 error.")]
    Certify(CertifyArgs),
    /// Offline analysis of nccl-tests output and NCCL debug logs.
    #[command(after_help = "\
Example:
  railguard-prober analyze --nccl-tests allreduce.txt --nccl-log nccl-debug.txt \\
    --profile-file profiles.yaml --profile h100-ndr

Exit status: 0 pass or unknown, 1 fail, 2 error.")]
    Analyze(AnalyzeArgs),
    /// Passive checks every interval, invasive certification when due; metrics and health.
    #[command(after_help = "\
Example:
  railguard-prober daemon --node $NODE_NAME --sysfs-root /host --metrics-listen 0.0.0.0:9464

Exit status: 0 after SIGTERM, 2 error.")]
    Daemon(DaemonArgs),
    /// In-pod check (init container): RDMA devices, locked memory, /dev/shm, NCCL env.
    #[command(after_help = "\
Example:
  NCCL_IB_HCA==mlx5_0:1,mlx5_3:1 railguard-prober preflight --json

Exit status: 0 every check passed, 1 a check failed, 2 error.")]
    Preflight(PreflightArgs),
    /// What the NCCL environment plugin answers in this container: NAME=value lines from the
    /// node file, this container's RDMA devices and this process' GPUs.
    #[command(after_help = "\
Examples:
  kubectl exec train-0 -- railguard-prober nccl-env
  railguard-prober nccl-env --config /run/railguard/nccl.json --json

Warnings and the plugin's info lines go to stderr.

Exit status: 0 answered, 1 unhealthy (failed, pending or expired certificate, or no rail
usable here), 2 the node file or sysfs cannot be read.")]
    NcclEnv(NcclEnvArgs),
    /// Brings the cluster's FabricProfile CRD to this release's schema (the chart's
    /// pre-install/pre-upgrade hook; Helm never upgrades `crds/`). A newer release's CRD is
    /// left as it is.
    #[command(after_help = "\
Example:
  railguard-prober upgrade-crd --kubeconfig ~/.kube/config

Exit status: 0 current (created, applied or a newer one kept), 2 error.")]
    UpgradeCrd(UpgradeCrdArgs),
    /// Takes railguard's taint, labels and conditions off every Node and deletes the fleet
    /// controller's DeviceTaintRules (the chart's post-delete hook: `helm uninstall` leaves
    /// no railguard taint or rule). The certificate annotations stay.
    #[command(after_help = "\
Example:
  railguard-prober cleanup --kubeconfig ~/.kube/config --keep-node-state false

Exit status: 0 cleaned, 2 error.")]
    Cleanup(CleanupArgs),
    /// The chart's `helm test`: the webhook answers a GPU pod's admission through its
    /// Service with the CA it serves, and enough Nodes are certified.
    #[command(after_help = "\
Example:
  railguard-prober verify-install --webhook-url https://railguard-webhook.railguard.svc/mutate \\
    --webhook-ca-file /etc/railguard/webhook-ca/ca.crt --min-certified-nodes 1

Exit status: 0 both hold, 1 the webhook gave no answer or too few Nodes are certified in
time, 2 error.")]
    VerifyInstall(VerifyInstallArgs),
}

/// Whether a subcommand's result passes (exit status 0) or fails (exit status 1: a failed
/// verdict, a CRITICAL finding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Status {
    #[default]
    Pass,
    Fail,
}

impl Status {
    /// [`Status::Fail`] when `failed`.
    pub fn fail_if(failed: bool) -> Self {
        if failed {
            Status::Fail
        } else {
            Status::Pass
        }
    }
}

/// What a subcommand prints on stdout (or stderr) and whether it passed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    pub text: String,
    pub status: Status,
    /// Print `text` on stderr (a failed preflight's report, for the init container's log).
    pub on_stderr: bool,
}

impl Outcome {
    /// Printed, exit status 0.
    pub fn pass(text: impl Into<String>) -> Self {
        Outcome::new(text, Status::Pass)
    }

    /// Printed, with the exit status of `status`.
    pub fn new(text: impl Into<String>, status: Status) -> Self {
        Outcome {
            text: text.into(),
            status,
            on_stderr: false,
        }
    }

    /// The exit status: 0 or 1 ([`railguard_runtime::EXIT_FAIL`]).
    pub fn exit_code(&self) -> u8 {
        match self.status {
            Status::Pass => 0,
            Status::Fail => railguard_runtime::EXIT_FAIL,
        }
    }
}

impl Command {
    /// Runs the subcommand; async ones on a fresh multi-threaded runtime. An error is exit
    /// status 2 ([`railguard_runtime::EXIT_ERROR`]).
    pub fn run(self) -> anyhow::Result<Outcome> {
        match self {
            Command::Discover(a) => a.run(),
            Command::Affinity(a) => a.run(),
            Command::EmitProfile(a) => a.run().map(Outcome::pass),
            Command::SimSysfs(a) => a.run().map(Outcome::pass),
            Command::Preflight(a) => a.run(),
            Command::NcclEnv(a) => a.run(),
            Command::Analyze(a) => a.run(),
            Command::Campaign(a) => block_on(a.run()),
            Command::PeerEndpoint(a) => block_on(a.run()).map(|()| Outcome::default()),
            Command::PeerToken(a) => block_on(a.run()),
            Command::Fleet(a) => block_on(a.run()),
            Command::NcclRanks(a) => a.run(),
            Command::GpuCheck(a) => a.run(),
            Command::Certify(a) => block_on(a.run()),
            Command::Daemon(a) => block_on(a.run()).map(|()| Outcome::default()),
            Command::UpgradeCrd(a) => block_on(a.run()),
            Command::Cleanup(a) => block_on(a.run()),
            Command::VerifyInstall(a) => block_on(a.run()),
        }
    }
}

/// Runs an async command on a fresh multi-threaded runtime.
fn block_on<T>(fut: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    rt.block_on(fut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_subcommand_shows_an_example_and_the_exit_status() {
        let mut cmd = Cli::command();
        let top = cmd.render_long_help().to_string();
        assert!(top.contains("railguard-prober discover"), "{top}");
        assert!(top.contains(EXIT_STATUS), "{top}");
        for sub in cmd.get_subcommands_mut().filter(|s| s.get_name() != "help") {
            let name = sub.get_name().to_string();
            let help = sub.render_long_help().to_string();
            assert!(
                help.contains(&format!("railguard-prober {name} ")),
                "{name}: no example in --help:\n{help}"
            );
            assert!(help.contains("Exit status: 0"), "{name}:\n{help}");
        }
    }

    #[test]
    fn exit_codes_follow_the_convention() {
        assert_eq!(Outcome::pass("x").exit_code(), 0);
        assert_eq!(Outcome::new("x", Status::fail_if(false)).exit_code(), 0);
        assert_eq!(Outcome::new("x", Status::fail_if(true)).exit_code(), 1);
        assert_eq!(railguard_runtime::EXIT_ERROR, 2);
    }
}
