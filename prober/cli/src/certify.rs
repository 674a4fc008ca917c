//! `railguard-prober certify`: one certification run, printing the comparison matrix and the
//! verdict, optionally publishing the certificate on the Node (the node setup is
//! [`crate::node_context`]'s, shared with the daemon).

use clap::Args;
use railguard_api::Verdict;

use crate::certification::certify_once;
use crate::node_context::NodeArgs;
use crate::{Outcome, Status};

/// `railguard-prober certify [--sim MODEL] [--publish] [--json]`
#[derive(Args, Debug, Clone)]
pub struct CertifyArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Publish the certificate on the Node (labels, annotation, condition, Event).
    #[arg(long, env = "RAILGUARD_PUBLISH")]
    pub publish: bool,
    /// Print the certificate as JSON instead of the matrix (keys: docs/reference.md, "JSON output").
    /// No progress is drawn then.
    #[arg(long, env = "RAILGUARD_JSON")]
    pub json: bool,
}

impl CertifyArgs {
    /// Runs the command: the matrix (or the certificate as JSON); not certified is exit
    /// status 1. Progress is drawn on stderr only when it is a terminal and not `--json`.
    pub async fn run(&self) -> anyhow::Result<Outcome> {
        let client = self.node.client(self.publish).await?;
        let ctx = self.node.context(client).await?;
        let progress = crate::progress::for_stderr(self.json);
        let out = certify_once(&ctx, self.publish, progress).await?;
        let status = Status::fail_if(out.certificate.verdict != Verdict::Certified);
        let text = if self.json {
            let mut s = serde_json::to_string_pretty(&out.certificate)?;
            s.push('\n');
            s
        } else {
            out.matrix
        };
        Ok(Outcome::new(text, status))
    }
}
