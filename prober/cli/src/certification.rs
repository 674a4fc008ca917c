//! One certification of this node, end to end (the orchestration; each step is the
//! library's): read the Node once, mark it pending, gather the evidence (hardware), assess
//! it (pure), record the certificate (pure), publish it (one write). And the daemon's
//! passive check, the same way. The caller builds the [`NodeContext`] (and the runtime it
//! runs on).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use railguard_api::{Certificate, FabricProfile, Verdict};

use railguard_prober::certify::evidence::ResourceExposure;
use railguard_prober::certify::matrix::{matrix_rows, render_matrix};
use railguard_prober::certify::policy::{assess_in_fleet, assess_passive_against};
use railguard_prober::certify::record::{
    invasive_certificate, passive_certificate, passive_is_news, Subject,
};
use railguard_prober::certify::renewal::{renew_by_traffic, Renewal, RenewalPolicy, TrafficTally};
use railguard_prober::certify::run::{
    gather_invasive_with, gather_passive, GatherError, NodeSetup,
};
use railguard_prober::progress::Progress;
use railguard_prober::publish::{NodePublisher, NodeState, PublishError};

/// Everything a run on this node needs, resolved once by the caller.
pub struct NodeContext {
    pub node: String,
    pub profile: FabricProfile,
    pub setup: NodeSetup,
    /// Writes to this node's Node object; `None` without a cluster.
    pub publisher: Option<NodePublisher>,
}

/// Why a certification could not finish.
#[derive(Debug, thiserror::Error)]
pub enum CertifyError {
    #[error("publishing needs a cluster (--kubeconfig or in-cluster config)")]
    NoCluster,
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error(transparent)]
    Gather(#[from] GatherError),
}

/// What one invasive certification produced.
#[derive(Clone, Debug)]
pub struct CertifyOutcome {
    pub certificate: Certificate,
    /// The comparison matrix, with a header naming node, profile and signature.
    pub matrix: String,
}

/// What a passive check did.
#[derive(Clone, Debug, PartialEq)]
pub enum PassiveOutcome {
    /// No certificate yet and nothing failed: only an invasive run can certify.
    NothingToPublish,
    /// The check found what the certificate on the Node already says: nothing written.
    Unchanged,
    /// The updated certificate, published.
    Published(Box<Certificate>),
}

impl NodeContext {
    /// The Node as it is now (one GET); `None` without a cluster.
    pub async fn read_state(&self) -> Result<Option<NodeState>, PublishError> {
        match &self.publisher {
            Some(p) => Ok(Some(p.read_state().await?)),
            None => Ok(None),
        }
    }

    /// The profile's RDMA resource as the Node advertises it (needs the Node).
    fn exposure(&self, state: Option<&NodeState>) -> Option<ResourceExposure> {
        let rdma = self.profile.spec.rdma.as_ref()?;
        Some(state?.exposure(&rdma.resource_name))
    }
}

/// One invasive certification with optional publishing, reading the Node once. Each rail and
/// NCCL run is a step of `progress`.
pub async fn certify_once(
    ctx: &NodeContext,
    publish: bool,
    progress: Arc<dyn Progress>,
) -> Result<CertifyOutcome, CertifyError> {
    let mut state = ctx.read_state().await?;
    certify_with_state(ctx, state.as_mut(), publish, progress).await
}

/// [`certify_once`] from a Node already read (`None` without a cluster): pending label,
/// evidence, verdict, certificate, publish. The outcome's certificate is the one published
/// (with the campaign's findings merged in), else this run's. Every log line of the run is
/// inside a `certification` span naming the node and profile.
#[tracing::instrument(name = "certification", skip_all, fields(node = %ctx.node, profile = %ctx.profile.name(), run = "invasive"))]
pub async fn certify_with_state(
    ctx: &NodeContext,
    mut state: Option<&mut NodeState>,
    publish: bool,
    progress: Arc<dyn Progress>,
) -> Result<CertifyOutcome, CertifyError> {
    let profile_name = ctx.profile.name().to_string();
    let spec = &ctx.profile.spec;
    if publish && (ctx.publisher.is_none() || state.is_none()) {
        return Err(CertifyError::NoCluster);
    }
    let previous = state.as_deref().and_then(|s| s.certificate.clone());
    let exposure = ctx.exposure(state.as_deref());
    if let (true, Some(p), Some(s)) = (publish, &ctx.publisher, state.as_deref_mut()) {
        p.mark_pending(s, &profile_name, &spec.signature()).await?;
    }
    let gathered = gather_invasive_with(&ctx.setup, spec, exposure, progress.clone()).await;
    progress.finish();
    let gathered = gathered?;
    let history = previous
        .as_ref()
        .filter(|p| p.profile == profile_name)
        .map(|p| p.history.as_slice())
        .unwrap_or(&[]);
    // A drop the whole fleet shares is the fleet's (the fleet controller's drift), not this
    // node's; unreadable, every drop counts against the node, as without a fleet.
    let drifting = match &ctx.publisher {
        Some(p) => p.fleet_drift(&profile_name).await.unwrap_or_else(|e| {
            tracing::warn!(profile = %profile_name, error = %railguard_api::error::error_chain(&e), "cannot read the fleet's drift; regressions count against this node");
            Default::default()
        }),
        None => Default::default(),
    };
    let assessment = assess_in_fleet(spec, &gathered.evidence, history, &drifting);
    let subject = Subject {
        node: &ctx.node,
        profile_name: &profile_name,
        profile: spec,
        signature: gathered.evidence.layout_signature.clone(),
        gpus: gathered.gpus.clone(),
        simulated: ctx.setup.simulated,
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
    // What is published carries the campaign's findings on the Node (`railguard_api::campaign_findings`).
    let cert = match (publish, &ctx.publisher, state) {
        (true, Some(p), Some(s)) => p.publish(s, &cert, true).await?,
        _ => cert,
    };
    tracing::info!(node = %ctx.node, verdict = %cert.verdict, generation = cert.generation, reasons = ?cert.reasons, "certification finished");
    Ok(CertifyOutcome {
        certificate: cert,
        matrix,
    })
}

/// One passive check (ports over `window`) against the Node read in `state`, publishing the
/// updated certificate when there is one to update or the check failed the node (in a
/// `certification` span, `run = "passive"`).
#[tracing::instrument(name = "certification", skip_all, fields(node = %ctx.node, profile = %ctx.profile.name(), run = "passive"))]
pub async fn passive_once(
    ctx: &NodeContext,
    state: &mut NodeState,
    window: Duration,
    grey: &std::collections::BTreeMap<String, String>,
    renew: Option<&TrafficTally>,
) -> Result<PassiveOutcome, CertifyError> {
    let publisher = ctx.publisher.as_ref().ok_or(CertifyError::NoCluster)?;
    let spec = &ctx.profile.spec;
    let previous = state.certificate.clone();
    let exposure = ctx.exposure(Some(state));
    let mut gathered = gather_passive(&ctx.setup, spec, window, exposure).await?;
    // The grey-rail judge's verdicts (`--grey-rails enforce`) are this check's evidence too.
    gathered.evidence.grey = grey.clone();
    // The certificate carries the passive holds (passive healing), so they survive a restart.
    let assessment = assess_passive_against(spec, &gathered.evidence, previous.as_ref());
    if previous.is_none() && assessment.verdict != Verdict::Failed {
        return Ok(PassiveOutcome::NothingToPublish);
    }
    let profile_name = ctx.profile.name().to_string();
    let subject = Subject {
        node: &ctx.node,
        profile_name: &profile_name,
        profile: spec,
        signature: gathered.evidence.layout_signature.clone(),
        gpus: gathered.gpus,
        simulated: ctx.setup.simulated,
    };
    let now = Timestamp::now();
    let mut cert = passive_certificate(&subject, &assessment, previous.as_ref(), now);
    if let Some(tally) = renew {
        match renew_by_traffic(&cert, spec, tally, &RenewalPolicy::default(), now) {
            Renewal::NotDue => {}
            Renewal::Refused(why) => {
                tracing::info!(node = %ctx.node, expires_at = %cert.expires_at, why = %why, "certificate not renewed by the jobs' traffic");
            }
            Renewal::Renewed(renewed) => {
                cert = *renewed;
                tracing::info!(node = %ctx.node, expires_at = %cert.expires_at, renewals = cert.renewal.as_ref().map_or(0, |r| r.renewals), "certificate renewed by the jobs' traffic");
            }
        }
    }
    if let Some(prev) = &previous {
        if !passive_is_news(prev, &cert, state.fabric_label.as_deref(), now) {
            return Ok(PassiveOutcome::Unchanged);
        }
    }
    let cert = publisher.publish(state, &cert, false).await?;
    if cert.verdict == Verdict::Failed {
        tracing::warn!(node = %ctx.node, reasons = ?cert.reasons, "passive check failed the node");
    }
    if assessment.restored {
        tracing::info!(node = %ctx.node, verdict = %cert.verdict, "passive check healed the node: every rail a passive failure held is clean again");
    }
    Ok(PassiveOutcome::Published(Box::new(cert)))
}
