//! `railguard-prober certify`: one certification run, printing the comparison matrix and the
//! verdict, optionally publishing the certificate on the Node. The node setup here (profile,
//! simulation, engines, Kubernetes client) is shared with the daemon.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueHint};
use jiff::Timestamp;
use kube::Client;
use railguard_api::{Certificate, FabricProfile, Verdict};
use railguard_runtime::StartupError;

use super::evidence::ResourceExposure;
use super::matrix::{matrix_rows, render_matrix};
use super::policy::assess;
use super::record::{invasive_certificate, Subject};
use super::run::{error_chain, gather_invasive_with, NodeSetup};
use crate::cli::Outcome;
use crate::discover::cli::check_sysfs_root;
use crate::progress::Progress;
use crate::publish::NodePublisher;
use crate::rdma::{RdmaEngine, SimulatedRdmaEngine, VerbsEngine};
use crate::sim::{model_path, write_sysfs, NodeModel, SIM_MODEL_PATH};

/// Node, profile, simulation and cluster options shared by `certify` and `daemon`.
#[derive(Args, Debug, Clone)]
pub struct NodeArgs {
    /// This node's name (the Node object); defaults to the host name.
    #[arg(long, env = "RAILGUARD_NODE_NAME")]
    pub node: Option<String>,
    /// FabricProfile name: which profile of the cluster (or of --profile-file) to certify
    /// against (default: the one matching this node's rail layout, else the default one).
    #[arg(long, alias = "profile-name", env = "RAILGUARD_PROFILE")]
    pub profile: Option<String>,
    /// Read the FabricProfiles from this YAML file instead of the cluster.
    #[arg(long, env = "RAILGUARD_PROFILE_FILE", value_hint = ValueHint::FilePath)]
    pub profile_file: Option<PathBuf>,
    /// Simulate this node model (a name from the models directory, or a YAML path); its
    /// sysfs tree is written at start (test and demo only).
    #[arg(long, env = "RAILGUARD_SIM", conflicts_with = "sim_root")]
    pub sim: Option<String>,
    /// Simulate the node whose tree already exists here (written by `sim-sysfs`): read as
    /// the sysfs root as it is, with RDMA and NCCL simulated from its
    /// `railguard-sim/model.yaml` (test and demo only). Faults written into the tree are seen.
    #[arg(long, env = "RAILGUARD_SIM_ROOT", value_hint = ValueHint::DirPath, conflicts_with = "sysfs_root")]
    pub sim_root: Option<PathBuf>,
    /// Where node models live (for `--sim NAME`).
    #[arg(long, env = "RAILGUARD_MODELS_DIR", value_hint = ValueHint::DirPath)]
    pub models_dir: Option<PathBuf>,
    /// sysfs root to read (`/` on a node; the simulated tree with `--sim`).
    #[arg(long, env = "RAILGUARD_SYSFS_ROOT", value_hint = ValueHint::DirPath)]
    pub sysfs_root: Option<PathBuf>,
    /// kubeconfig for publishing; in-cluster config when absent.
    #[arg(long, env = "RAILGUARD_KUBECONFIG", value_hint = ValueHint::FilePath)]
    pub kubeconfig: Option<PathBuf>,
    /// nccl-tests binary, overriding the profile's (with `--sim`: the stand-in).
    #[arg(long, env = "RAILGUARD_NCCL_BINARY", value_hint = ValueHint::FilePath)]
    pub nccl_binary: Option<PathBuf>,
    /// Directory for NCCL debug logs of each run.
    #[arg(long, env = "RAILGUARD_LOG_DIR", default_value = "/tmp/railguard-nccl", value_hint = ValueHint::DirPath)]
    pub log_dir: PathBuf,
    /// Kill an NCCL run after this many seconds.
    #[arg(long, env = "RAILGUARD_NCCL_TIMEOUT_SECS", default_value_t = 1800)]
    pub nccl_timeout_secs: u64,
}

/// `railguard-prober certify [--sim MODEL] [--publish] [--json]`
#[derive(Args, Debug, Clone)]
pub struct CertifyArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Publish the certificate on the Node (labels, annotation, condition, Event).
    #[arg(long, env = "RAILGUARD_PUBLISH")]
    pub publish: bool,
    /// Print the certificate as JSON instead of the matrix (keys: README, "JSON output").
    /// No progress is drawn then.
    #[arg(long, env = "RAILGUARD_JSON")]
    pub json: bool,
}

/// Everything a run needs, resolved once.
pub struct NodeContext {
    pub node: String,
    pub profile: FabricProfile,
    pub setup: NodeSetup,
    pub client: Option<Client>,
}

impl NodeArgs {
    pub fn node_name(&self) -> anyhow::Result<String> {
        if let Some(n) = &self.node {
            return Ok(n.clone());
        }
        let h = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("no --node given and the host name is unreadable")?;
        Ok(h.trim().to_string())
    }

    /// The node model file for `--sim`.
    pub fn model_path(&self, sim: &str) -> PathBuf {
        model_path(sim, self.models_dir.as_deref())
    }

    pub async fn client(&self, required: bool) -> anyhow::Result<Option<Client>> {
        if self.kubeconfig.is_none() && !required {
            return Ok(None);
        }
        let client = railguard_runtime::kube_client(
            self.kubeconfig.as_deref(),
            "--kubeconfig",
            "pass --kubeconfig, or run in a cluster",
        )
        .await?;
        Ok(Some(client))
    }

    /// Resolves node, profile, simulation and engines. With `write_tree`, a `--sim` model's
    /// sysfs tree is (re)written first.
    pub async fn context(&self, need_client: bool) -> anyhow::Result<NodeContext> {
        let node = self.node_name()?;
        let client = self.client(need_client).await?;
        let (sim, sysfs_root) = match (&self.sim, &self.sim_root) {
            (_, Some(root)) => {
                let path = root.join(SIM_MODEL_PATH);
                let model = NodeModel::load(&path).with_context(|| {
                    format!(
                        "cannot load the simulated node {} (write the tree with `railguard-prober sim-sysfs`)",
                        path.display()
                    )
                })?;
                (Some(model), root.clone())
            }
            (Some(name), None) => {
                let path = self.model_path(name);
                let model = NodeModel::load(&path)
                    .with_context(|| format!("cannot load node model {}", path.display()))?;
                let root = self
                    .sysfs_root
                    .clone()
                    .unwrap_or_else(|| std::env::temp_dir().join(format!("railguard-sim-{node}")));
                write_sysfs(&model, &root).with_context(|| {
                    format!("cannot write the simulated sysfs at {}", root.display())
                })?;
                (Some(model), root)
            }
            (None, None) => {
                let root = self
                    .sysfs_root
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("/"));
                check_sysfs_root(&root, "--sysfs-root")?;
                (None, root)
            }
        };
        let profile = self
            .resolve_profile(client.as_ref(), &node, &sysfs_root)
            .await?;
        let engine: Arc<dyn RdmaEngine> = match &sim {
            Some(m) => Arc::new(
                SimulatedRdmaEngine::new(crate::campaign::simnode::rdma_model(m, &node))
                    .context("invalid simulated RDMA model")?,
            ),
            None => Arc::new(VerbsEngine::new()),
        };
        let (nccl_binary, nccl_env) = match (&sim, &self.nccl_binary) {
            (_, Some(b)) => (b.clone(), sim_env(sim.is_some(), &sysfs_root, &node)),
            (Some(_), None) => (standin_path()?, sim_env(true, &sysfs_root, &node)),
            (None, None) => (
                PathBuf::from(&profile.spec.certification.nccl_tests.binary),
                Vec::new(),
            ),
        };
        let setup = NodeSetup {
            sysfs_root,
            use_nvml: sim.is_none(),
            engine,
            nccl_binary,
            nccl_env,
            log_dir: self.log_dir.join(&node),
            nccl_timeout: Duration::from_secs(self.nccl_timeout_secs),
            sim,
        };
        Ok(NodeContext {
            node,
            profile,
            setup,
            client,
        })
    }

    async fn resolve_profile(
        &self,
        client: Option<&Client>,
        node: &str,
        root: &Path,
    ) -> anyhow::Result<FabricProfile> {
        let profiles =
            match (&self.profile_file, client) {
                (Some(path), _) => railguard_runtime::read_profiles(path, "--profile-file")?,
                (None, Some(c)) => {
                    let api: kube::Api<FabricProfile> = kube::Api::all(c.clone());
                    api.list(&Default::default())
                        .await
                        .context("cannot list FabricProfiles")?
                        .items
                }
                (None, None) => return Err(StartupError::new(
                    "no FabricProfiles to certify against",
                    "no --profile-file and no cluster",
                    "pass --profile-file FILE, or --kubeconfig (in a cluster: the service account)",
                )
                .into()),
            };
        if let Some(name) = &self.profile {
            let source = match &self.profile_file {
                Some(p) => format!("{} (--profile-file)", p.display()),
                None => "the cluster".to_string(),
            };
            let names: Vec<&str> = profiles.iter().map(|p| p.name()).collect();
            let held = format!("it holds {}", names.join(", "));
            return profiles
                .iter()
                .find(|p| p.name() == name)
                .cloned()
                .ok_or_else(|| {
                    StartupError::new(
                        format!("no FabricProfile named {name} (--profile) in {source}"),
                        held,
                        "name one of them, or omit --profile to pick the one matching this node's rail layout",
                    )
                    .into()
                });
        }
        if profiles.len() == 1 {
            return profiles.into_iter().next().context("no profile");
        }
        // Several: the one whose rail layout this node has, else the default.
        // An exact layout first, then one that differs only in a link's current rate (a
        // downshifted link is then judged as that profile's rail).
        if let Ok(found) = crate::discover::discover(root, false) {
            let layout = found.rail_layout();
            let exact = railguard_api::layout_signature(&layout);
            let matching = profiles
                .iter()
                .find(|p| p.spec.signature() == exact)
                .or_else(|| {
                    profiles.iter().find(|p| {
                        railguard_api::certified_signature(&layout, &p.spec.layout())
                            == p.spec.signature()
                    })
                });
            if let Some(p) = matching {
                return Ok(p.clone());
            }
        }
        profiles
            .into_iter()
            .find(|p| p.spec.default)
            .with_context(|| {
                format!("no FabricProfile matches node {node}'s rail layout and none is default")
            })
    }
}

fn sim_env(sim: bool, root: &Path, node: &str) -> Vec<(String, String)> {
    if !sim {
        return Vec::new();
    }
    vec![
        ("RAILGUARD_SIM_ROOT".into(), root.display().to_string()),
        ("RAILGUARD_SIM_HOSTNAME".into(), node.to_string()),
    ]
}

/// The simulated `all_reduce_perf`, installed next to this binary.
fn standin_path() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the prober binary")?;
    let dir = exe.parent().context("prober binary has no directory")?;
    let p = dir.join("all_reduce_perf_sim");
    if !p.is_file() {
        bail!(
            "simulated all_reduce_perf not found at {} (build it with the prober, or pass --nccl-binary)",
            p.display()
        );
    }
    Ok(p)
}

impl NodeContext {
    pub fn publisher(&self) -> Option<NodePublisher> {
        self.client
            .as_ref()
            .map(|c| NodePublisher::new(c.clone(), self.node.clone()))
    }

    /// The profile's RDMA resource as the Node advertises it (needs the cluster).
    pub async fn exposure(&self) -> Option<ResourceExposure> {
        let rdma = self.profile.spec.rdma.as_ref()?;
        let publisher = self.publisher()?;
        let node = publisher.get_node().await.ok()?;
        let allocatable = node
            .status
            .and_then(|s| s.allocatable)
            .and_then(|a| a.get(&rdma.resource_name).map(|q| q.0.clone()));
        Some(ResourceExposure {
            resource: rdma.resource_name.clone(),
            allocatable,
        })
    }

    pub async fn previous(&self) -> Option<Certificate> {
        let node = self.publisher()?.get_node().await.ok()?;
        NodePublisher::certificate_of(&node)
    }
}

/// Outcome of one invasive certification.
pub struct CertifyOutcome {
    pub certificate: Certificate,
    pub matrix: String,
    pub regressed: bool,
}

/// One invasive certification with optional publishing: pending label, evidence, verdict,
/// certificate, publish. Each rail and NCCL run is a step of `progress`.
pub async fn certify_once(
    ctx: &NodeContext,
    publish: bool,
    progress: Arc<dyn Progress>,
) -> anyhow::Result<CertifyOutcome> {
    let previous = ctx.previous().await;
    let profile_name = ctx.profile.name().to_string();
    let spec = &ctx.profile.spec;
    let publisher = if publish { ctx.publisher() } else { None };
    if publish && publisher.is_none() {
        bail!("--publish needs a cluster (--kubeconfig or in-cluster config)");
    }
    if let Some(p) = &publisher {
        p.mark_pending(&profile_name, &spec.signature(), previous.as_ref())
            .await
            .map_err(|e| anyhow::anyhow!(error_chain(&e)))?;
    }
    let exposure = ctx.exposure().await;
    let gathered = gather_invasive_with(&ctx.setup, spec, exposure, progress.clone()).await;
    progress.finish();
    let gathered = gathered?;
    let history = previous
        .as_ref()
        .filter(|p| p.profile == profile_name)
        .map(|p| p.history.as_slice())
        .unwrap_or(&[]);
    let assessment = assess(spec, &gathered.evidence, history);
    let subject = Subject {
        node: &ctx.node,
        profile_name: &profile_name,
        profile: spec,
        signature: gathered.evidence.layout_signature.clone(),
        gpus: gathered.gpus.clone(),
    };
    let cert = invasive_certificate(
        &subject,
        &assessment,
        &gathered.evidence.software,
        previous.as_ref(),
        Timestamp::now(),
    );
    let rows = matrix_rows(spec, &gathered.evidence, &assessment);
    let matrix = format!(
        "node {} profile {} signature {}\n\n{}",
        ctx.node,
        profile_name,
        cert.signature,
        render_matrix(&rows, &assessment)
    );
    if let Some(p) = &publisher {
        p.publish(&cert, previous.as_ref(), true)
            .await
            .map_err(|e| anyhow::anyhow!(error_chain(&e)))?;
    }
    tracing::info!(node = %ctx.node, verdict = %cert.verdict, generation = cert.generation, reasons = ?cert.reasons, "certification finished");
    Ok(CertifyOutcome {
        certificate: cert,
        matrix,
        regressed: assessment.regressed,
    })
}

impl CertifyArgs {
    /// Runs the command: the matrix (or the certificate as JSON); not certified is exit
    /// status 1. Progress is drawn on stderr only when it is a terminal and not `--json`.
    pub async fn run(&self) -> anyhow::Result<Outcome> {
        let ctx = self.node.context(self.publish).await?;
        let progress = crate::progress::for_stderr(self.json);
        let out = certify_once(&ctx, self.publish, progress).await?;
        let ok = out.certificate.verdict == Verdict::Certified;
        let text = if self.json {
            let mut s = serde_json::to_string_pretty(&out.certificate)?;
            s.push('\n');
            s
        } else {
            out.matrix
        };
        Ok(Outcome::verdict(text, !ok))
    }
}
