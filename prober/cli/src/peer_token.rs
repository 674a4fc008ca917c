//! `railguard-prober peer-token`: the init container of the pods that read the campaign's
//! shared token (the probers' peer endpoints, the campaign coordinator). It makes sure the
//! chart's Secret holds a token (generated here once, never by the chart, so `helm template`
//! renders no random material; a `prober.peerToken` value is rendered into the Secret and
//! kept) and writes it where the containers read it (`--token-file`).

use std::error::Error;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueHint};
use railguard_campaign::token::{generate_token, load_token, TokenSource, TOKEN_KEY};
use railguard_kube::secret_fill::{fill_secret, FillAction, SecretToFill};

use crate::Outcome;

/// The field manager of the token written here.
pub const FIELD_MANAGER: &str = "railguard-prober-peer-token";

/// `railguard-prober peer-token`: fill the token Secret when empty, write the token file.
#[derive(Args, Debug, Clone)]
pub struct PeerTokenArgs {
    /// The Secret that keeps the token under key `token` (the chart creates it).
    #[arg(long, env = "RAILGUARD_PEER_TOKEN_SECRET")]
    pub secret: String,
    /// The Secret's namespace; the client's (the pod's) when unset.
    #[arg(long, env = "RAILGUARD_PEER_TOKEN_SECRET_NAMESPACE")]
    pub namespace: Option<String>,
    /// The file the token is written to (the containers' --token-file).
    #[arg(long, env = "RAILGUARD_PEER_TOKEN_OUT", value_hint = ValueHint::FilePath)]
    pub out: PathBuf,
    /// Kubeconfig file; in-cluster config or $KUBECONFIG when unset.
    #[arg(long, env = "RAILGUARD_KUBECONFIG", value_hint = ValueHint::FilePath)]
    pub kubeconfig: Option<PathBuf>,
}

impl PeerTokenArgs {
    pub async fn run(self) -> anyhow::Result<Outcome> {
        let client = crate::cluster_client(self.kubeconfig.as_deref()).await?;
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let target = SecretToFill {
            namespace: &namespace,
            name: &self.secret,
            keys: &[TOKEN_KEY],
            field_manager: FIELD_MANAGER,
        };
        let filled = fill_secret(&client, &target, || {
            Ok::<_, Box<dyn Error + Send + Sync>>(
                [(TOKEN_KEY.to_string(), generate_token().into_bytes())].into(),
            )
        })
        .await?;
        let token = filled
            .data
            .get(TOKEN_KEY)
            .with_context(|| format!("Secret {namespace}/{} has no {TOKEN_KEY}", self.secret))?;
        // A given token (prober.peerToken) too short for the peers is refused here, before
        // the containers start with it.
        let text = String::from_utf8_lossy(token);
        load_token(TokenSource::Value(&text)).with_context(|| {
            format!(
                "the token in Secret {namespace}/{} is unusable (set a longer prober.peerToken, or remove the key to have one generated)",
                self.secret
            )
        })?;
        railguard_runtime::write_atomic(&self.out, token, 0o440)
            .with_context(|| format!("cannot write {} (--out)", self.out.display()))?;
        let action = match &filled.action {
            FillAction::Kept => "kept the Secret's token",
            FillAction::Filled { .. } => "generated a token",
            FillAction::AdoptedWinner => "adopted the token another pod wrote first",
        };
        tracing::info!(
            secret = %self.secret, namespace = %namespace, out = %self.out.display(),
            "peer token: {action}; file written"
        );
        Ok(Outcome::default())
    }
}
