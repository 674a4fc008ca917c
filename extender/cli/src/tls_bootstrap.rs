//! `railguard-extender tls-bootstrap`: the init container of the pods that speak the
//! extender's mTLS (the secondary scheduler's, with the extender beside it or not, and the
//! extender's own Deployment). It makes sure the chart's Secret holds a complete set (the
//! CA, the extender's serving pair, kube-scheduler's client pair; generated here once, never
//! by the chart, so `helm template` renders no random material) and writes the set into the
//! pod's in-memory volume, where the containers read it.

use std::collections::BTreeMap;
use std::error::Error;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::tls_material::{self, TlsMaterialSpec, KEYS};
use anyhow::Context;
use clap::{Args, ValueHint};
use railguard_kube::pki::time::OffsetDateTime;
use railguard_kube::secret_fill::{fill_secret, FillAction, SecretToFill};
use railguard_runtime::{LogFormat, TlsFiles};

/// The field manager of the Secret's data written here.
pub const FIELD_MANAGER: &str = "railguard-extender-tls-bootstrap";

/// Permission bits of the files written (the Secret volume's 0440 the chart used before).
const FILE_MODE: u32 = 0o440;

/// Example shown by `tls-bootstrap --help`.
pub const TLS_BOOTSTRAP_EXAMPLE: &str = "\
Example (what the chart's init containers run):
  railguard-extender tls-bootstrap --secret railguard-extender-tls --namespace railguard \\
    --out /etc/railguard/extender-tls --server-ip 127.0.0.1 \\
    --server-dns localhost,railguard-extender.railguard.svc,railguard-extender.railguard.svc.cluster.local \\
    --server-cn railguard-extender --client-cn railguard-scheduler --ca-cn railguard-extender-ca

Rotation: remove the Secret's keys (or delete the Secret and run helm upgrade, which creates
it again, empty), then restart every pod that mounts it: the first to start issues a new set.

Exit status: 0 the files are written, 2 on an error (the Secret cannot be read or written,
the files cannot be written, or the Secret's set does not load).";

/// Ensure the extender's TLS Secret holds a CA, serving and client pair, and write them out.
#[derive(Args, Debug, Clone)]
pub struct TlsBootstrapArgs {
    /// The Secret that keeps the set (the chart creates it, empty).
    #[arg(long, env = "RAILGUARD_TLS_SECRET")]
    pub secret: String,
    /// The Secret's namespace; the client's (the pod's) when unset.
    #[arg(long, env = "RAILGUARD_TLS_SECRET_NAMESPACE")]
    pub namespace: Option<String>,
    /// Directory the files are written to: ca.crt, tls.crt, tls.key, client.crt, client.key.
    #[arg(long, env = "RAILGUARD_TLS_OUT_DIR", value_hint = ValueHint::DirPath)]
    pub out: PathBuf,
    /// IP addresses of the serving certificate (where kube-scheduler dials the extender).
    #[arg(
        long = "server-ip",
        env = "RAILGUARD_TLS_SERVER_IPS",
        value_delimiter = ','
    )]
    pub server_ips: Vec<IpAddr>,
    /// DNS names of the serving certificate.
    #[arg(
        long = "server-dns",
        env = "RAILGUARD_TLS_SERVER_DNS",
        value_delimiter = ','
    )]
    pub server_dns: Vec<String>,
    /// Common name of the serving certificate.
    #[arg(
        long,
        env = "RAILGUARD_TLS_SERVER_CN",
        default_value = "railguard-extender"
    )]
    pub server_cn: String,
    /// Common name of kube-scheduler's client certificate.
    #[arg(
        long,
        env = "RAILGUARD_TLS_CLIENT_CN",
        default_value = "railguard-scheduler"
    )]
    pub client_cn: String,
    /// Common name of the CA.
    #[arg(
        long,
        env = "RAILGUARD_TLS_CA_CN",
        default_value = "railguard-extender-ca"
    )]
    pub ca_cn: String,
    /// Lifetime of a newly issued set, days (an existing set is kept as it is).
    #[arg(long, env = "RAILGUARD_TLS_VALIDITY_DAYS", default_value_t = 3650,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub validity_days: u32,
    /// Kubeconfig file; in-cluster config or $KUBECONFIG when unset.
    #[arg(long, env = "RAILGUARD_KUBECONFIG", value_hint = ValueHint::FilePath)]
    pub kubeconfig: Option<PathBuf>,
    /// Log format: `text` or `json` lines, on stderr.
    #[arg(long, env = "RAILGUARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl TlsBootstrapArgs {
    /// What a new set is issued for.
    pub fn spec(&self) -> TlsMaterialSpec {
        TlsMaterialSpec {
            ca_common_name: self.ca_cn.clone(),
            server_common_name: self.server_cn.clone(),
            server_ips: self.server_ips.clone(),
            server_dns: self.server_dns.clone(),
            client_common_name: self.client_cn.clone(),
            validity_days: self.validity_days,
        }
    }
}

/// Fills the Secret when it is incomplete (or adopts a racing writer's set), writes the
/// files and checks that they load as the extender loads them.
pub async fn run(args: &TlsBootstrapArgs) -> anyhow::Result<()> {
    if args.server_ips.is_empty() && args.server_dns.is_empty() {
        return Err(railguard_runtime::StartupError::new(
            "no name for the serving certificate",
            "neither --server-ip nor --server-dns is given",
            "pass the addresses and names kube-scheduler dials",
        )
        .into());
    }
    let client = railguard_kube::kube_client(
        args.kubeconfig.as_deref(),
        "--kubeconfig",
        "pass --kubeconfig, or run in a cluster",
    )
    .await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let target = SecretToFill {
        namespace: &namespace,
        name: &args.secret,
        keys: &KEYS,
        field_manager: FIELD_MANAGER,
    };
    let spec = args.spec();
    let filled = fill_secret(&client, &target, || {
        tls_material::issue(&spec, OffsetDateTime::now_utc())
            .map_err(|e| Box::new(e) as Box<dyn Error + Send + Sync>)
    })
    .await?;
    write_files(args, &filled.data)?;
    check_loads(args)?;
    let action = match &filled.action {
        FillAction::Kept => "kept the Secret's set".to_string(),
        FillAction::Filled { missing } => {
            format!("issued a new set (missing: {})", missing.join(", "))
        }
        FillAction::AdoptedWinner => "adopted the set another pod wrote first".to_string(),
    };
    tracing::info!(
        secret = %args.secret, namespace = %namespace, out = %args.out.display(),
        "extender TLS: {action}; files written"
    );
    Ok(())
}

fn write_files(args: &TlsBootstrapArgs, data: &BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    for key in KEYS {
        let bytes = data
            .get(key)
            .with_context(|| format!("Secret {} has no {key}", args.secret))?;
        let path = args.out.join(key);
        railguard_runtime::write_atomic(&path, bytes, FILE_MODE)
            .with_context(|| format!("cannot write {} (--out)", path.display()))?;
    }
    Ok(())
}

/// The serving pair matches and the CA loads as a client CA: a set that does not (edited by
/// hand, say) fails here, naming the Secret, instead of in the extender or the scheduler.
fn check_loads(args: &TlsBootstrapArgs) -> anyhow::Result<()> {
    let (cert, key, ca) = (
        args.out.join(tls_material::TLS_CRT),
        args.out.join(tls_material::TLS_KEY),
        args.out.join(tls_material::CA_CRT),
    );
    railguard_runtime::server_tls(TlsFiles {
        cert: &cert,
        key: &key,
        client_ca: Some(&ca),
    })
    .map(|_| ())
    .map_err(|e| {
        railguard_runtime::StartupError::new(
            format!("the set in Secret {} does not load", args.secret),
            e.to_string(),
            "remove its keys (or delete it and run helm upgrade) and restart the pods that mount it, to have a new set issued",
        )
        .into()
    })
}
