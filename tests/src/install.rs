//! Installs rendered chart objects into a cluster the way Helm does: in Helm's kind order,
//! each object applied server-side, then waits for the workloads to become ready.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use kube::Client;
use serde_json::Value;

use crate::eventually;

/// Field manager of objects the harness installs from the chart.
pub const INSTALL_FIELD_MANAGER: &str = "railguard-install";

/// Helm's install order (`releaseutil.InstallOrder`); kinds it does not list go last.
const INSTALL_ORDER: &[&str] = &[
    "PriorityClass",
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
];

fn install_rank(kind: &str) -> usize {
    INSTALL_ORDER
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(INSTALL_ORDER.len())
}

/// `kind namespace/name` of an object, for messages.
pub fn object_ref(obj: &Value) -> String {
    let kind = obj["kind"].as_str().unwrap_or("?");
    let name = obj["metadata"]["name"].as_str().unwrap_or("?");
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Applies `objects` server-side in Helm's order. Namespaced objects without a namespace go
/// to `namespace`. Every failure is collected and reported together.
pub async fn apply_objects(client: &Client, namespace: &str, objects: &[Value]) -> Result<()> {
    let mut sorted: Vec<&Value> = objects.iter().collect();
    sorted.sort_by_key(|o| install_rank(o["kind"].as_str().unwrap_or_default()));
    let mut failures = Vec::new();
    let mut discovery = Discovery::new(client.clone())
        .run()
        .await
        .context("API discovery")?;
    for obj in sorted {
        let what = object_ref(obj);
        let typed: DynamicObject = serde_json::from_value(obj.clone())
            .with_context(|| format!("{what} is not an object"))?;
        let Some(tm) = typed.types.clone() else {
            failures.push(format!("{what}: no apiVersion/kind"));
            continue;
        };
        let mut resolved = discovery.resolve_typemeta(&tm);
        if resolved.is_none() {
            // A kind from a CRD applied just before.
            discovery = Discovery::new(client.clone()).run().await?;
            resolved = discovery.resolve_typemeta(&tm);
        }
        let Some((ar, caps)) = resolved else {
            failures.push(format!(
                "{what}: {}/{} is not served",
                tm.api_version, tm.kind
            ));
            continue;
        };
        let name = typed.metadata.name.clone().unwrap_or_default();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Cluster => Api::all_with(client.clone(), &ar),
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                typed.metadata.namespace.as_deref().unwrap_or(namespace),
                &ar,
            ),
        };
        if let Err(e) = api
            .patch(
                &name,
                &PatchParams::apply(INSTALL_FIELD_MANAGER).force(),
                &Patch::Apply(&typed),
            )
            .await
        {
            failures.push(format!("{what}: {e}"));
        }
    }
    if !failures.is_empty() {
        bail!("installing failed:\n  {}", failures.join("\n  "));
    }
    Ok(())
}

/// Waits until every Deployment and DaemonSet among `objects` has all its pods ready (a
/// DaemonSet whose node selector matches no node is ready with none). The message names
/// what is still not ready.
pub async fn wait_workloads_ready(
    client: &Client,
    namespace: &str,
    objects: &[Value],
    timeout: Duration,
) -> Result<()> {
    let workloads: Vec<(String, String, String)> = objects
        .iter()
        .filter_map(|o| {
            let kind = o["kind"].as_str()?;
            if kind != "Deployment" && kind != "DaemonSet" {
                return None;
            }
            let ns = o["metadata"]["namespace"].as_str().unwrap_or(namespace);
            Some((
                kind.to_string(),
                ns.to_string(),
                o["metadata"]["name"].as_str()?.to_string(),
            ))
        })
        .collect();
    let last = std::sync::Mutex::new(Vec::new());
    let result = eventually(timeout, "workloads ready", || {
        let workloads = workloads.clone();
        let client = client.clone();
        let last = &last;
        async move {
            let mut pending = Vec::new();
            for (kind, ns, name) in &workloads {
                let ready = if kind == "Deployment" {
                    let d = Api::<Deployment>::namespaced(client.clone(), ns)
                        .get(name)
                        .await?;
                    let want = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                    let st = d.status.unwrap_or_default();
                    st.ready_replicas.unwrap_or(0) >= want
                        && st.updated_replicas.unwrap_or(0) >= want
                } else {
                    let d = Api::<DaemonSet>::namespaced(client.clone(), ns)
                        .get(name)
                        .await?;
                    let generation = d.metadata.generation.unwrap_or(0);
                    let st = d.status.unwrap_or_default();
                    st.observed_generation.unwrap_or(0) >= generation
                        && st.number_ready >= st.desired_number_scheduled
                };
                if !ready {
                    pending.push(format!("{kind} {ns}/{name}"));
                }
            }
            let done = pending.is_empty();
            *last.lock().unwrap_or_else(|p| p.into_inner()) = pending;
            Ok(done.then_some(()))
        }
    })
    .await;
    let still = last.lock().unwrap_or_else(|p| p.into_inner()).join(", ");
    result.with_context(|| format!("not ready: {still}"))
}

/// The chart's fleet controller, run the way its Deployment runs it: the chart's
/// ServiceAccount, ClusterRole, Role and their bindings applied, then the real
/// `railguard-prober` with the container's args and env (the downward API filled in as the
/// kubelet does). Only the metrics address moves to loopback and the in-cluster credentials
/// become a kubeconfig holding a token of that ServiceAccount, so every request it makes is
/// judged by the chart's RBAC.
pub struct ChartFleet {
    pub daemon: crate::daemon::Daemon,
    /// `http://` + its metrics address.
    pub url: String,
    /// A kubeconfig with the ServiceAccount's token alone.
    pub kubeconfig: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// A rendered container's `args`, as its binary gets them.
pub fn container_args(container: &Value) -> Result<Vec<String>> {
    container["args"]
        .as_array()
        .context("container args")?
        .iter()
        .map(|a| {
            a.as_str()
                .map(str::to_string)
                .context("an arg that is no string")
        })
        .collect()
}

/// A rendered container's `env` with the downward API filled in as the kubelet does for a
/// pod `pod_name` in `namespace` (only the pod's namespace and name are filled in); none
/// when the container sets none.
pub fn container_env(
    container: &Value,
    namespace: &str,
    pod_name: &str,
) -> Result<Vec<(String, String)>> {
    let mut env = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let var = e["name"].as_str().context("an env var without a name")?;
        let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("metadata.namespace") => namespace.to_string(),
            Some("metadata.name") => pod_name.to_string(),
            Some(other) => bail!("{var}: fieldRef {other} is not filled in here"),
            None => e["value"]
                .as_str()
                .with_context(|| format!("{var}: neither a value nor a fieldRef"))?
                .to_string(),
        };
        env.push((var.to_string(), value));
    }
    Ok(env)
}

/// Whether a rendered object belongs to the fleet controller.
pub fn is_fleet(obj: &Value) -> bool {
    obj["metadata"]["labels"]["app.kubernetes.io/component"] == "fleet"
}

impl ChartFleet {
    /// Applies the fleet identity of `docs` (the chart rendered for this server) in
    /// `namespace` and starts the controller as `name` (its log: `<name>.log`), ready.
    pub async fn start(
        cp: &crate::ControlPlane,
        docs: &[Value],
        namespace: &str,
        name: &'static str,
    ) -> Result<ChartFleet> {
        let admin = cp.client();
        let identity: Vec<Value> = docs
            .iter()
            .filter(|d| {
                is_fleet(d)
                    && matches!(
                        d["kind"].as_str(),
                        Some(
                            "ServiceAccount"
                                | "ClusterRole"
                                | "ClusterRoleBinding"
                                | "Role"
                                | "RoleBinding"
                        )
                    )
            })
            .cloned()
            .collect();
        if identity.len() != 7 {
            bail!(
                "the chart renders {} fleet identity objects, not 7 (ServiceAccount, ClusterRole and binding, the leader Lease's Role and binding, the slot Leases' Role and binding)",
                identity.len()
            );
        }
        apply_objects(&admin, namespace, &identity).await?;
        let deployment = docs
            .iter()
            .find(|d| is_fleet(d) && d["kind"] == "Deployment")
            .context("the chart renders no fleet Deployment")?;
        let pod = &deployment["spec"]["template"]["spec"];
        let account = pod["serviceAccountName"]
            .as_str()
            .context("the fleet pod names no ServiceAccount")?;
        let token = crate::service_account_token(&admin, namespace, account, None).await?;
        let dir = tempfile::tempdir()?;
        let admin_config = std::fs::read_to_string(cp.kubeconfig_path())?;
        if !admin_config.contains(cp.admin_token()) {
            bail!("the control plane's kubeconfig is no token kubeconfig");
        }
        let kubeconfig = dir.path().join("fleet.kubeconfig");
        std::fs::write(&kubeconfig, admin_config.replace(cp.admin_token(), &token))?;

        let prober = crate::workspace_binary("railguard-prober-cli", "railguard-prober")?;
        let container = &pod["containers"][0];
        let mut cmd = std::process::Command::new(&prober);
        cmd.args(container_args(container)?);
        let pod_name = format!("{name}-0");
        cmd.envs(container_env(container, namespace, &pod_name)?);
        cmd.env("RAILGUARD_METRICS_LISTEN", crate::daemon::ANY_LOOPBACK_PORT)
            .env("RAILGUARD_KUBECONFIG", &kubeconfig)
            .env("RAILGUARD_LOG", "info")
            .env("HOSTNAME", &pod_name);
        let logs = cp.log_dir();
        let mut daemon = crate::daemon::Daemon::spawn(name, &mut cmd, logs);
        let url = format!("http://{}", daemon.listen_addr("--metrics-listen").await);
        crate::daemon::wait_ready(
            &format!("{url}/readyz"),
            "fleet controller",
            &mut daemon,
            logs,
        )
        .await;
        Ok(ChartFleet {
            daemon,
            url,
            kubeconfig,
            _dir: dir,
        })
    }

    /// A client that authenticates as the fleet's ServiceAccount.
    pub async fn client(&self) -> Result<Client> {
        let config = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(
            config,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        Ok(Client::try_from(config)?)
    }

    /// Its log so far.
    pub fn log(&self) -> Result<String> {
        Ok(std::fs::read_to_string(&self.daemon.log)?)
    }
}
