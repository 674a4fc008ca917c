//! `railguard-prober campaign` (the coordinator) and `railguard-prober peer-endpoint`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::{Args, ValueHint};
use jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::Client;
use railguard_api::{keys, FabricProfile};
use railguard_runtime::StartupError;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use railguard_campaign::coordinator::{run_campaign_with, CampaignNode, CampaignSettings};
use railguard_campaign::endpoint::{serve, ConnectionLimits, EndpointConfig};
use railguard_campaign::identity::{
    CoordinatorCheck, CoordinatorIdentity, EndpointIdentityCheck, ServiceAccountRef,
    DEFAULT_AUDIENCE,
};
use railguard_campaign::kube::{
    collect_launcher_log, endpoint_of, profile_nodes, write_findings, GpuPodSource, LeaderLease,
    Leadership,
};
use railguard_campaign::mpijob::{self, PairJob};
use railguard_campaign::nccl_pair::NcclRunner;
use railguard_campaign::summary::{found_faults, render_summary};
use railguard_campaign::token::{load_token, TokenSource};
use railguard_campaign::CampaignError;
use railguard_campaign::DEFAULT_PEER_PORT;
use railguard_prober::rdma::{PeerConfig, PeerRdmaEngine, VerbsEngine};
use railguard_sim::{ModelSource, SIM_MODEL_PATH};

use crate::gpu_pods::GpuResourceArgs;

use crate::{Outcome, Status};

/// Where the shared token comes from.
#[derive(Args, Debug, Clone)]
pub struct TokenArgs {
    /// File holding the shared token (e.g. a mounted Secret).
    #[arg(long, env = "RAILGUARD_TOKEN_FILE", value_hint = ValueHint::FilePath)]
    pub token_file: Option<PathBuf>,
    /// The shared token itself (prefer --token-file; the value is never printed).
    #[arg(long, env = "RAILGUARD_PEER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

impl TokenArgs {
    pub fn load(&self) -> anyhow::Result<Vec<u8>> {
        let source = match (&self.token_file, &self.token) {
            (Some(path), _) => TokenSource::File(path),
            (None, Some(t)) => TokenSource::Value(t),
            (None, None) => bail!(
                "no shared token: set --token-file (RAILGUARD_TOKEN_FILE) or RAILGUARD_PEER_TOKEN"
            ),
        };
        Ok(load_token(source)?)
    }
}

/// `railguard-prober peer-endpoint`: serve campaign tests for this node.
#[derive(Args, Debug)]
pub struct PeerEndpointArgs {
    /// This node's name.
    #[arg(long, env = "RAILGUARD_NODE_NAME")]
    pub node: String,
    /// This node's FabricProfile; tests for another profile are refused.
    #[arg(long, env = "RAILGUARD_PROFILE")]
    pub profile: String,
    /// Address of the endpoint (control channel and RDMA side channel).
    #[arg(long, env = "RAILGUARD_PEER_LISTEN", default_value = "0.0.0.0:7470")]
    pub listen: String,
    #[command(flatten)]
    pub token: TokenArgs,
    /// Simulate this node from a node model (a name from the models directory, or a YAML
    /// path) instead of using ibverbs (test and demo only).
    #[arg(long, env = "RAILGUARD_SIM", conflicts_with = "sim_root")]
    pub sim: Option<String>,
    /// Where node models live (for `--sim NAME`).
    #[arg(long, env = "RAILGUARD_MODELS_DIR", value_hint = ValueHint::DirPath)]
    pub models_dir: Option<PathBuf>,
    /// Simulate the node whose tree `sim-sysfs` wrote here (its `railguard-sim/model.yaml`),
    /// as `certify --sim-root` and `daemon --sim-root` do (test and demo only).
    #[arg(long, env = "RAILGUARD_SIM_ROOT", value_hint = ValueHint::DirPath)]
    pub sim_root: Option<PathBuf>,
    /// Simulated fault on the path to one peer: `PEER=dead|FACTOR[@HCA,...]` (repeatable).
    #[arg(long = "sim-link", env = "RAILGUARD_SIM_LINKS", value_delimiter = ';')]
    pub sim_links: Vec<String>,
    /// Simulated bad cable/switch port behind a rail: `HCA:PORT=dead|FACTOR` (repeatable).
    #[arg(long = "sim-wire", env = "RAILGUARD_SIM_WIRES", value_delimiter = ';')]
    pub sim_wires: Vec<String>,
    /// Kubeconfig for the GPU pod check (in-cluster config when unset; a simulated node
    /// without it checks no pods).
    #[arg(long, env = "RAILGUARD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub gpu: GpuResourceArgs,
    /// Limit for one side-channel step, seconds.
    #[arg(long, env = "RAILGUARD_PEER_IO_TIMEOUT_SECS", default_value_t = 10)]
    pub io_timeout_secs: u64,
    /// Limit for a whole incoming handshake (accept to authenticated), seconds: a client
    /// trickling bytes cannot hold a connection longer.
    #[arg(
        long,
        env = "RAILGUARD_PEER_HANDSHAKE_TIMEOUT_SECONDS",
        default_value_t = 5
    )]
    pub peer_handshake_timeout_seconds: u64,
    /// Most unauthenticated connections at once; more are closed at once.
    #[arg(long, env = "RAILGUARD_PEER_MAX_HANDSHAKES", default_value_t = 128)]
    pub peer_max_handshakes: usize,
    /// Most unauthenticated connections at once from one source address.
    #[arg(
        long,
        env = "RAILGUARD_PEER_MAX_HANDSHAKES_PER_SOURCE",
        default_value_t = 32
    )]
    pub peer_max_handshakes_per_source: usize,
    /// Most connections at once, authenticated or not; more are closed at once.
    #[arg(long, env = "RAILGUARD_PEER_MAX_CONNECTIONS", default_value_t = 512)]
    pub peer_max_connections: usize,
    /// The campaign coordinator's service account, NAMESPACE/NAME. Set, the endpoint runs in
    /// coordinator mode: it takes requests only with that account's token for the
    /// connection (TokenReview; needs cluster access), and peers authenticate with the pair
    /// key the coordinator gives both sides of a test, so a node can only speak for itself.
    /// Unset, any holder of the shared token can speak for any node: only for setups
    /// without a coordinator (manual runs, the Soft-RoCE VM test).
    #[arg(long, env = "RAILGUARD_COORDINATOR_SERVICE_ACCOUNT")]
    pub coordinator_service_account: Option<String>,
    /// This pod's projected service-account token (audience `railguard-campaign`), which
    /// proves to the coordinator which node the endpoint runs on.
    #[arg(long, env = "RAILGUARD_IDENTITY_TOKEN_FILE", value_hint = ValueHint::FilePath)]
    pub identity_token_file: Option<PathBuf>,
    /// The CUDA driver library of NCCL pair tests (default: libcuda.so.1 where dlopen finds it).
    #[arg(long, env = "RAILGUARD_CUDA_LIBRARY", value_hint = ValueHint::FilePath)]
    pub cuda_library: Option<PathBuf>,
    /// The NCCL library of NCCL pair tests (default: the image's
    /// /usr/lib/railguard/nccl/libnccl.so.2 where it exists, else libnccl.so.2 where dlopen
    /// finds it; a node without it reports its pair tests as not measured).
    #[arg(long, env = "RAILGUARD_NCCL_LIBRARY", value_hint = ValueHint::FilePath)]
    pub nccl_library: Option<PathBuf>,
    /// The node's GPUs by PCI bus id, in index order, for NCCL pair tests (default: every GPU
    /// CUDA sees, in PCI bus order).
    #[arg(long, env = "RAILGUARD_NCCL_GPUS", value_delimiter = ',')]
    pub nccl_gpus: Vec<String>,
    /// Where the NCCL debug logs of pair tests are kept (the latest per peer and scope).
    #[arg(long, env = "RAILGUARD_NCCL_LOG_DIR", value_hint = ValueHint::DirPath)]
    pub nccl_log_dir: Option<PathBuf>,
    /// The node's test lock, the file the daemon's `--test-lock-file` names: every pair test
    /// holds it shared and is refused as busy while the node's own invasive run holds it
    /// (the chart shares it between the two containers). Unset: pair tests do not look.
    #[arg(long, env = "RAILGUARD_TEST_LOCK_FILE", value_hint = ValueHint::FilePath)]
    pub test_lock_file: Option<PathBuf>,
}

impl PeerEndpointArgs {
    /// Serves until SIGTERM/SIGINT.
    pub async fn run(self) -> anyhow::Result<()> {
        let token = self.token.load()?;
        let model_source = match (&self.sim, &self.sim_root) {
            (Some(sim), _) => Some(ModelSource::resolve(sim, self.models_dir.as_deref())),
            (None, Some(root)) => Some(ModelSource::File(root.join(SIM_MODEL_PATH))),
            (None, None) => None,
        };
        let engine: Arc<dyn PeerRdmaEngine> = match &model_source {
            Some(source) => {
                let model = source
                    .load()
                    .with_context(|| format!("cannot load node model {source}"))?;
                Arc::new(railguard_sim::node::engine(
                    &model,
                    &self.node,
                    &self.sim_links,
                    &self.sim_wires,
                )?)
            }
            None => {
                if !self.sim_links.is_empty() || !self.sim_wires.is_empty() {
                    bail!("--sim-link and --sim-wire need --sim MODEL");
                }
                Arc::new(VerbsEngine::new())
            }
        };
        let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        let coordinator = self
            .coordinator_service_account
            .as_deref()
            .map(ServiceAccountRef::parse)
            .transpose()
            .context("--coordinator-service-account")?;
        let coordinator_check = match coordinator {
            Some(coordinator) => Some(CoordinatorCheck {
                client: crate::cluster_client(self.kubeconfig.as_deref())
                    .await
                    .context("checking the coordinator's token needs cluster access")?,
                coordinator,
            }),
            None => None,
        };
        let gpu_pods = if model_source.is_some() && self.kubeconfig.is_none() && !in_cluster {
            // A simulated node outside a cluster has no pods to protect.
            warn!("simulated node without --kubeconfig: GPU pods are not checked");
            GpuPodSource::Unchecked
        } else {
            let client = crate::cluster_client(self.kubeconfig.as_deref())
                .await
                .context("the GPU pod check needs cluster access")?;
            GpuPodSource::Kube {
                client,
                node: self.node.clone(),
                resources: self.gpu.gpu_resources.clone(),
            }
        };
        let handshake_timeout = Duration::from_secs(self.peer_handshake_timeout_seconds.max(1));
        let mut peer = PeerConfig::new(&self.node, &self.profile, &token)?;
        peer.io_timeout = Duration::from_secs(self.io_timeout_secs.max(1));
        peer.handshake_timeout = handshake_timeout;
        let mut cfg = EndpointConfig::new(peer, &token, engine, gpu_pods);
        if let Some(path) = &self.test_lock_file {
            cfg.locks = railguard_prober::rdma::RailLocks::with_node_lock(
                railguard_prober::test_lock::NodeTestLock::new(path),
            );
        }
        cfg.io_timeout = Duration::from_secs(self.io_timeout_secs.max(1));
        cfg.limits = ConnectionLimits {
            handshake_timeout,
            max_handshakes: self.peer_max_handshakes.max(1),
            max_handshakes_per_source: self.peer_max_handshakes_per_source.max(1),
            max_connections: self.peer_max_connections.max(1),
        };
        cfg.identity_token_file = self.identity_token_file.clone();
        if let Some(check) = coordinator_check {
            cfg = cfg.with_coordinator_check(check);
        }
        cfg.nccl = Some(NcclRunner {
            exe: std::env::current_exe()
                .context("the NCCL pair tests run this executable's nccl-ranks")?,
            cuda_library: self.cuda_library.clone(),
            nccl_library: self.nccl_library.clone(),
            node_gpus: self.nccl_gpus.clone(),
            log_dir: self
                .nccl_log_dir
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join("railguard-nccl-pair")),
            env: Vec::new(),
        });
        let listener =
            railguard_runtime::bind(self.listen.as_str(), "the peer endpoint", "--listen")?;
        let listener = TcpListener::from_std(listener).context("cannot serve the peer endpoint")?;
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            railguard_runtime::shutdown_signal().await;
            stop.cancel();
        });
        serve(listener, Arc::new(cfg), shutdown).await?;
        Ok(())
    }
}

/// `railguard-prober campaign`: test the nodes of a profile pairwise and localize faults.
#[derive(Args, Debug)]
pub struct CampaignArgs {
    /// FabricProfile name (read from the API unless --profile-file is given).
    #[arg(long, env = "RAILGUARD_PROFILE")]
    pub profile: String,
    /// Read the profile from this YAML file instead of the API.
    #[arg(long, env = "RAILGUARD_PROFILE_FILE")]
    pub profile_file: Option<PathBuf>,
    /// Kubeconfig file; in-cluster config or $KUBECONFIG when unset.
    #[arg(long, env = "RAILGUARD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub token: TokenArgs,
    /// Lease for leader election (`coordination.k8s.io/v1`); without it no election.
    #[arg(long, env = "RAILGUARD_LEASE_NAME")]
    pub lease_name: Option<String>,
    /// Namespace of the Lease.
    #[arg(long, env = "RAILGUARD_LEASE_NAMESPACE", default_value = "railguard")]
    pub lease_namespace: String,
    /// This coordinator's identity in the Lease (the pod name in a Deployment).
    #[arg(long, env = "RAILGUARD_IDENTITY")]
    pub identity: Option<String>,
    /// Lease duration, seconds.
    #[arg(long, env = "RAILGUARD_LEASE_DURATION_SECS", default_value_t = 60)]
    pub lease_duration_secs: i32,
    /// Endpoint of a node, `NODE=HOST:PORT` (repeatable); otherwise the node's
    /// `railguard.io/peer-endpoint` annotation or its InternalIP and --peer-port.
    #[arg(long = "endpoint", env = "RAILGUARD_ENDPOINTS", value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Port of the nodes' peer endpoints, when only their InternalIP is known.
    #[arg(long, env = "RAILGUARD_PEER_PORT", default_value_t = DEFAULT_PEER_PORT)]
    pub peer_port: u16,
    /// This coordinator's service account, NAMESPACE/NAME: it proves itself to endpoints in
    /// coordinator mode with a token of it per connection (TokenRequest), and gives every
    /// two-node test a fresh pair key. Unset: the shared token alone.
    #[arg(long, env = "RAILGUARD_COORDINATOR_SERVICE_ACCOUNT")]
    pub coordinator_service_account: Option<String>,
    /// The prober pods' service account, NAMESPACE/NAME: each endpoint must prove with its
    /// pod's token (TokenReview) that it runs on the node it claims; nodes that cannot are
    /// left out. Needs --coordinator-service-account.
    #[arg(
        long,
        env = "RAILGUARD_ENDPOINT_SERVICE_ACCOUNT",
        requires = "coordinator_service_account"
    )]
    pub endpoint_service_account: Option<String>,
    /// Audience of the endpoints' identity tokens.
    #[arg(long, env = "RAILGUARD_IDENTITY_AUDIENCE", default_value = DEFAULT_AUDIENCE)]
    pub identity_audience: String,
    /// Run tests even on nodes with GPU pods.
    #[arg(long, env = "RAILGUARD_ALLOW_GPU_PODS")]
    pub allow_gpu_pods: bool,
    #[command(flatten)]
    pub gpu: GpuResourceArgs,
    /// Taints that keep a node out of the campaign like the built-in holds (as the daemon's
    /// `--hold-taints`): keys or `key=value`, `*` for any characters.
    #[arg(long, env = "RAILGUARD_HOLD_TAINTS", value_delimiter = ',')]
    pub hold_taints: Vec<String>,
    /// Shuffle the ring with this seed (default: keep node-name order).
    #[arg(long, env = "RAILGUARD_SHUFFLE_SEED")]
    pub shuffle_seed: Option<u64>,
    /// Pair tests under way at once (a round's pairs run in waves of this many), so a
    /// campaign never loads the whole fabric that running jobs share.
    #[arg(
        long,
        env = "RAILGUARD_MAX_CONCURRENT_PAIRS",
        default_value_t = railguard_campaign::coordinator::DEFAULT_MAX_CONCURRENT_PAIRS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096)
    )]
    pub max_concurrent_pairs: usize,
    /// Limit for one pair test, seconds.
    #[arg(long, env = "RAILGUARD_TEST_TIMEOUT_SECS", default_value_t = 120)]
    pub test_timeout_secs: u64,
    /// RDMA WRITE iterations per message size.
    #[arg(long, env = "RAILGUARD_ITERATIONS", default_value_t = 200)]
    pub iterations: u32,
    /// Plan and test, but write nothing to the nodes.
    #[arg(long, env = "RAILGUARD_DRY_RUN")]
    pub dry_run: bool,
    /// Print the campaign report (or the judged 2-node NCCL log) as JSON instead of text
    /// (keys: docs/reference.md, "JSON output"). No progress is drawn then.
    #[arg(long, env = "RAILGUARD_JSON")]
    pub json: bool,
    /// Instead of a campaign: render (and with --launch, create) the 2-node nccl-tests MPIJob
    /// for this pair, `NODE_A,NODE_B`.
    #[arg(long, env = "RAILGUARD_NCCL_PAIR")]
    pub nccl_pair: Option<String>,
    /// MPIJob template for --nccl-pair (`{{name}}` placeholders; default: the built-in one).
    #[arg(long, env = "RAILGUARD_MPIJOB_TEMPLATE")]
    pub mpijob_template: Option<PathBuf>,
    /// Namespace of the --nccl-pair MPIJob.
    #[arg(long, env = "RAILGUARD_NCCL_NAMESPACE", default_value = "railguard")]
    pub nccl_namespace: String,
    /// nccl-tests image of the --nccl-pair MPIJob.
    #[arg(
        long,
        env = "RAILGUARD_NCCL_IMAGE",
        default_value = "ghcr.io/railguard/nccl-tests:latest"
    )]
    pub nccl_image: String,
    /// GPUs per node of the --nccl-pair MPIJob (default: the profile's rails' GPUs).
    #[arg(long, env = "RAILGUARD_GPUS_PER_NODE")]
    pub gpus_per_node: Option<u32>,
    /// Create the rendered MPIJob in the cluster, wait for its launcher, read the launcher's
    /// log through the API and judge it (as --nccl-log does).
    #[arg(long, env = "RAILGUARD_LAUNCH")]
    pub launch: bool,
    /// With --launch: how long to wait for the launcher pod to finish, seconds.
    #[arg(long, env = "RAILGUARD_LAUNCHER_TIMEOUT_SECS", default_value_t = 1800)]
    pub launcher_timeout_secs: u64,
    /// Judge collected nccl-tests logs of a 2-node run (repeatable) instead of a campaign.
    #[arg(long = "nccl-log", env = "RAILGUARD_NCCL_LOG", value_delimiter = ',', value_hint = ValueHint::FilePath)]
    pub nccl_logs: Vec<PathBuf>,
}

impl CampaignArgs {
    /// Runs the command. A blamed node, rail or link (or a failed 2-node NCCL log) is exit
    /// status 1.
    pub async fn run(self) -> anyhow::Result<Outcome> {
        if !self.nccl_logs.is_empty() {
            return self.judge_logs().await;
        }
        if let Some(pair) = &self.nccl_pair {
            return self.nccl_pair(pair).await;
        }
        self.campaign().await
    }

    async fn load_profile(&self, client: Option<&Client>) -> anyhow::Result<FabricProfile> {
        let profile = match &self.profile_file {
            Some(path) => {
                let profiles = railguard_runtime::read_profiles(path, "--profile-file")?;
                let names: Vec<String> = profiles.iter().map(|p| p.name().to_string()).collect();
                profiles
                    .into_iter()
                    .find(|p| p.name() == self.profile)
                    .ok_or_else(|| {
                        StartupError::new(
                            format!(
                                "no FabricProfile named {} (--profile) in {} (--profile-file)",
                                self.profile,
                                path.display()
                            ),
                            format!("it holds {}", names.join(", ")),
                            "name one of them",
                        )
                    })?
            }
            None => {
                let client = client
                    .ok_or_else(|| anyhow!("reading the profile from the API needs a cluster"))?;
                crate::profile_source::cluster_profile(client, &self.profile).await?
            }
        };
        Ok(profile)
    }

    /// Judges collected logs of a 2-node NCCL run.
    async fn judge_logs(&self) -> anyhow::Result<Outcome> {
        let profile = self.load_profile(None).await?;
        let texts: Vec<String> = self
            .nccl_logs
            .iter()
            .map(|p| {
                std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
            })
            .collect::<Result<_, _>>()?;
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        self.judged(&refs, &profile)
    }

    /// The judgement of a 2-node run's logs: a failed verdict is exit status 1.
    fn judged(&self, texts: &[&str], profile: &FabricProfile) -> anyhow::Result<Outcome> {
        let report = mpijob::judge_log(texts, profile)?;
        let status =
            Status::fail_if(report.verdict == railguard_prober::analyze::AnalyzeVerdict::Fail);
        let text = if self.json {
            serde_json::to_string_pretty(&report)? + "\n"
        } else {
            railguard_prober::analyze::render_report(&report)
        };
        Ok(Outcome::new(text, status))
    }

    /// A campaign over the profile's nodes.
    async fn campaign(self) -> anyhow::Result<Outcome> {
        let client = crate::cluster_client(self.kubeconfig.as_deref()).await?;
        let profile = self.load_profile(Some(&client)).await?;
        let token = self.token.load()?;
        // The lease is renewed while the campaign runs; once it cannot be proven held, the
        // campaign stops and nothing more is written (every write confirms it first).
        let stop_renewing = CancellationToken::new();
        let _stop_renewing = stop_renewing.clone().drop_guard();
        let leadership = match &self.lease_name {
            Some(lease_name) => {
                let identity = self
                    .identity
                    .clone()
                    .or_else(|| std::env::var("HOSTNAME").ok())
                    .ok_or_else(|| {
                        anyhow!("leader election needs --identity (RAILGUARD_IDENTITY)")
                    })?;
                let lease = LeaderLease::new(
                    Api::namespaced(client.clone(), &self.lease_namespace),
                    lease_name,
                    &identity,
                    Duration::from_secs(u64::from(self.lease_duration_secs.unsigned_abs())),
                );
                let Some(leadership) = Leadership::acquire(lease).await? else {
                    info!(lease = %lease_name, "another coordinator holds the lease; nothing to do");
                    return Ok(Outcome::pass(format!(
                        "lease {lease_name} is held by another coordinator; no campaign run\n"
                    )));
                };
                info!(lease = %lease_name, identity = %identity, "leader");
                let period = Duration::from_secs((self.lease_duration_secs.max(3) / 3) as u64);
                tokio::spawn(leadership.clone().keep(period, stop_renewing.clone()));
                Some(leadership)
            }
            None => None,
        };

        let overrides: BTreeMap<String, String> = self
            .endpoints
            .iter()
            .map(|s| {
                s.split_once('=')
                    .map(|(n, a)| (n.trim().to_string(), a.trim().to_string()))
                    .ok_or_else(|| anyhow!("--endpoint {s:?} is not NODE=HOST:PORT"))
            })
            .collect::<Result<_, _>>()?;
        let mut nodes = Vec::new();
        // The GPUs and the profile's RDMA resource: a node whose HCAs serve a storage client
        // is in use too.
        let in_use_resources = self.gpu.in_use_resources(&profile);
        let gpu_check = |node: &str| GpuPodSource::Kube {
            client: client.clone(),
            node: node.to_string(),
            resources: in_use_resources.clone(),
        };
        for node in profile_nodes(&client, &profile).await? {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            let Some(endpoint) = overrides
                .get(&name)
                .cloned()
                .or_else(|| endpoint_of(&node, self.peer_port))
            else {
                warn!(node = %name, "no endpoint (annotation, InternalIP or --endpoint); skipped");
                continue;
            };
            let held = railguard_prober::publish::held_by_named_taint(
                &railguard_prober::publish::NodeState::of(&node).taints,
                &self.hold_taints,
            );
            if let Some(why) = railguard_prober::publish::unavailable_for_tests(&node).or(held) {
                warn!(node = %name, reason = %why, "the node is out of service for tests; skipped");
                continue;
            }
            if !self.allow_gpu_pods {
                let pods = gpu_check(&name).gpu_pods().await?;
                if !pods.is_empty() {
                    warn!(node = %name, pods = %pods.join(","), "GPU pods on the node; skipped");
                    continue;
                }
            }
            nodes.push(CampaignNode { name, endpoint });
        }
        let mut settings = CampaignSettings::from_profile(&profile, &token)?;
        settings.identity = self.identity(&client)?;
        settings.allow_gpu_pods = self.allow_gpu_pods;
        settings.max_concurrent_pairs = self.max_concurrent_pairs;
        settings.plan.shuffle_seed = self.shuffle_seed;
        settings.test_timeout = Duration::from_secs(self.test_timeout_secs.max(1));
        settings.iterations = self.iterations.max(1);
        info!(profile = %profile.name(), nodes = nodes.len(), rails = settings.rails.len(), "campaign starts");
        let now = Timestamp::now();
        let progress = crate::progress::for_stderr(self.json);
        let run = run_campaign_with(&nodes, &settings, now, progress.as_ref());
        let report = match leadership.as_ref().map(Leadership::lost) {
            Some(lost) => tokio::select! {
                r = run => r,
                _ = lost.cancelled() => {
                    progress.finish();
                    bail!("the lease was lost during the campaign; it stopped and wrote nothing");
                }
            },
            None => run.await,
        };
        progress.finish();
        let report = report?;
        if !self.dry_run {
            for (name, findings) in &report.findings {
                match write_findings(&client, name, findings, leadership.as_ref()).await {
                    Ok(_) => {}
                    Err(e @ CampaignError::LeaseLost { .. }) => return Err(e.into()),
                    Err(e) => {
                        warn!(node = %name, error = %format!("{e:#}"), "cannot write campaign results")
                    }
                }
            }
        }
        let status = Status::fail_if(found_faults(&report));
        let text = if self.json {
            serde_json::to_string_pretty(&report)? + "\n"
        } else {
            render_summary(&report)
        };
        Ok(Outcome::new(text, status))
    }

    /// Node identity from the flags.
    fn identity(&self, client: &Client) -> anyhow::Result<Option<CoordinatorIdentity>> {
        let Some(account) = &self.coordinator_service_account else {
            return Ok(None);
        };
        let account = ServiceAccountRef::parse(account).context("--coordinator-service-account")?;
        let endpoints = match &self.endpoint_service_account {
            Some(sa) => Some(EndpointIdentityCheck {
                client: client.clone(),
                endpoints: ServiceAccountRef::parse(sa).context("--endpoint-service-account")?,
                audience: self.identity_audience.clone(),
            }),
            None => None,
        };
        Ok(Some(CoordinatorIdentity {
            client: client.clone(),
            account,
            endpoints,
        }))
    }

    async fn nccl_pair(&self, pair: &str) -> anyhow::Result<Outcome> {
        let (a, b) = pair
            .split_once(',')
            .ok_or_else(|| anyhow!("--nccl-pair {pair:?} is not NODE_A,NODE_B"))?;
        let client = if self.launch || self.profile_file.is_none() {
            Some(crate::cluster_client(self.kubeconfig.as_deref()).await?)
        } else {
            None
        };
        let profile = self.load_profile(client.as_ref()).await?;
        let template = match &self.mpijob_template {
            Some(p) => std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?,
            None => mpijob::DEFAULT_TEMPLATE.to_string(),
        };
        let gpus = self.gpus_per_node.unwrap_or_else(|| {
            let n: std::collections::BTreeSet<u32> = profile
                .spec
                .rails
                .iter()
                .flat_map(|r| r.gpus.iter().copied())
                .collect();
            (n.len() as u32).max(1)
        });
        let job = PairJob {
            node_a: a.trim().to_string(),
            node_b: b.trim().to_string(),
            namespace: self.nccl_namespace.clone(),
            image: self.nccl_image.clone(),
            gpus_per_node: gpus,
            deadline_seconds: 1800,
        };
        let manifest = mpijob::render(&template, &profile, &job)?;
        if self.launch {
            let client = client.ok_or_else(|| anyhow!("--launch needs a cluster"))?;
            let ar = ApiResource {
                group: "kubeflow.org".into(),
                version: "v2beta1".into(),
                api_version: "kubeflow.org/v2beta1".into(),
                kind: "MPIJob".into(),
                plural: "mpijobs".into(),
            };
            let api_client = client.clone();
            let api: Api<DynamicObject> = Api::namespaced_with(client, &job.namespace, &ar);
            let name = mpijob::job_name(&job.node_a, &job.node_b);
            api.patch(
                &name,
                &PatchParams::apply(keys::PROBER_FIELD_MANAGER).force(),
                &Patch::Apply(&manifest),
            )
            .await
            .with_context(|| {
                format!(
                    "cannot create MPIJob {}/{name} (is the MPI Operator installed?)",
                    job.namespace
                )
            })?;
            info!(job = %name, namespace = %job.namespace, "MPIJob created; waiting for its launcher");
            let collected = collect_launcher_log(
                &api_client,
                &job.namespace,
                &name,
                Duration::from_secs(self.launcher_timeout_secs.max(1)),
                Duration::from_secs(5),
            )
            .await
            .with_context(|| format!("MPIJob {}/{name} was created", job.namespace))?;
            info!(pod = %collected.pod, state = ?collected.state, "launcher finished");
            return self.judged(&[collected.log.as_str()], &profile);
        }
        Ok(Outcome::pass(serde_yaml_ng::to_string(&manifest)?))
    }
}
