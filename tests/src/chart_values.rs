//! The values sets the chart tests render `charts/railguard` with: the structural and
//! dry-run tests (`tests/chart_e2e.rs`) and the chart/binary contract test
//! (`tests/chart_contract.rs`) use the same ones. The renderer is the real Helm
//! ([`crate::helm`]).

use anyhow::{Context, Result};
use serde_json::Value as Json;

use crate::helm::{self, HelmDoc};

pub use crate::helm::ValuesSet;

impl ValuesSet {
    /// `helm template` of the chart with this set for a cluster serving `api_versions` at
    /// `kube_version`; the error is Helm's.
    pub fn render(&self, api_versions: &[String], kube_version: &str) -> Result<Vec<HelmDoc>> {
        helm::shared().template_docs(self, api_versions, kube_version)
    }

    /// The objects of [`ValuesSet::render`] for the 1.20 server
    /// ([`helm::KUBE_1_20_API_VERSIONS`]), as JSON.
    pub fn objects_1_20(&self) -> Result<Vec<Json>> {
        Ok(self
            .render(&helm::kube_1_20_api_versions(), helm::KUBE_1_20_VERSION)?
            .into_iter()
            .map(|d| d.obj)
            .collect())
    }

    /// The values the templates see: the chart's values.yaml with this set's merged over it
    /// (maps merge, anything else replaces; a `null` removes the default, as Helm's
    /// coalescing does).
    pub fn values(&self) -> Result<Json> {
        let path = helm::chart_dir().join("values.yaml");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut values: Json = serde_yaml_ng::from_str(&text).context("values.yaml")?;
        let over: Json = serde_yaml_ng::from_str(self.values)
            .with_context(|| format!("the values of {}", self.label))?;
        coalesce(&mut values, &over);
        Ok(values)
    }
}

fn coalesce(base: &mut Json, over: &Json) {
    match (base, over) {
        (Json::Object(b), Json::Object(o)) => {
            for (k, v) in o {
                match (b.get_mut(k), v) {
                    (Some(_), Json::Null) => {
                        b.remove(k);
                    }
                    (Some(x), _) if x.is_object() && v.is_object() => coalesce(x, v),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) if !o.is_null() => *b = o.clone(),
        _ => {}
    }
}

pub const DEFAULT: ValuesSet = ValuesSet {
    label: "default",
    release: "railguard",
    namespace: "railguard",
    values: "{}",
};

pub const CERT_MANAGER_CONFIG_ONLY: ValuesSet = ValuesSet {
    label: "cert-manager + config-only scheduler",
    release: "rg",
    namespace: "railguard-cm",
    values: r#"
webhook:
  failurePolicy: Fail
  certificates:
    mode: certManager
scheduler:
  mode: configOnly
  extenderURL: http://10.96.0.50:8888
"#,
};

pub const ROCE: ValuesSet = ValuesSet {
    label: "RoCE profiles, custom namespaces, Ignore",
    release: "fabric",
    namespace: "gpu-infra",
    values: r#"
fabricProfiles:
  h100-ndr: {enabled: false}
  a100-hdr: {enabled: false}
  roce-cloud: {enabled: true}
webhook:
  failurePolicy: Ignore
  failureMode: closed
  excludedNamespaces: [kube-system, monitoring, gpu-operator]
  objectSelector:
    matchExpressions:
      - {key: railguard.io/opt-out, operator: DoesNotExist}
prober:
  hostNetwork: true
  peerToken: a-given-token-of-sufficient-length
  campaign:
    ncclNamespace: nccl-tests
scheduler:
  schedulerName: fabric-aware
  weight: 10
"#,
};

/// Every example profile of values.yaml enabled (the default set's release).
pub const ALL_PROFILES: ValuesSet = ValuesSet {
    label: "every example profile",
    values: "fabricProfiles:\n  roce-cloud: {enabled: true}\n  h200-ndr: {enabled: true}\n  b200-ndr: {enabled: true}\n",
    ..DEFAULT
};

/// cert-manager with an existing issuer instead of the generated chain.
pub const CERT_MANAGER_ISSUER: ValuesSet = ValuesSet {
    label: "cert-manager with an existing ClusterIssuer",
    values: "webhook:\n  certificates:\n    mode: certManager\n    certManager:\n      issuerRef: {name: corp-ca, kind: ClusterIssuer}\n",
    ..CERT_MANAGER_CONFIG_ONLY
};

/// The values the real-node end-to-end test installs the chart with (local images, the
/// prober on a simulated node's tree, failurePolicy Fail).
pub const REAL_NODE: ValuesSet = ValuesSet {
    label: "real node (tests/values/real-node.yaml)",
    values: include_str!("../values/real-node.yaml"),
    ..DEFAULT
};

/// The default set with the prober allowed to read PCI extended config space (ACS).
pub const PCI_CONFIG_SPACE: ValuesSet = ValuesSet {
    label: "prober.readPciConfigSpace",
    values: "prober:\n  readPciConfigSpace: true\n",
    ..DEFAULT
};

/// The fleet controller tuned and on its own nodes, with the Grafana dashboard ConfigMap.
pub const FLEET_DASHBOARD: ValuesSet = ValuesSet {
    label: "fleet controller with the Grafana dashboard",
    values: r#"
prober:
  fleet:
    intervalSeconds: 300
    settleSeconds: 20
    metricsPort: 9465
    nodeSelector: {node-role.kubernetes.io/infra: ""}
    tolerations: [{key: dedicated, operator: Equal, value: infra, effect: NoSchedule}]
    dashboard:
      enabled: true
      labels: {grafana_dashboard: "1", team: fabric}
      annotations: {grafana_folder: railguard}
"#,
    ..DEFAULT
};

/// The prober namespace of the split sets.
pub const SPLIT_PROBER_NAMESPACE: &str = "railguard-probers";

/// Pod Security split (issue #31): the probers, their campaign and the peer-token Secret in
/// a `privileged` namespace the chart creates (`prober.namespace`), the release namespace
/// left to what meets `restricted`; the prober with SYS_ADMIN (the most it asks for), the
/// extender in its own Deployment beside the scheduler, both with the chart's TLS.
/// `tests/pod_security_e2e.rs` installs this set with the real Helm.
pub const POD_SECURITY_SPLIT: ValuesSet = ValuesSet {
    label: "probers in a privileged namespace the chart creates",
    release: "rg",
    namespace: "railguard-restricted",
    values: r#"
prober:
  namespace:
    name: railguard-probers
    create: true
  readPciConfigSpace: true
extender:
  placement: deployment
"#,
};

/// The same split into a namespace that already exists (a managed cluster's, labelled by
/// its operator): the chart creates no Namespace.
pub const POD_SECURITY_SPLIT_EXISTING: ValuesSet = ValuesSet {
    label: "probers in an existing privileged namespace",
    values: "prober:\n  namespace:\n    name: railguard-probers\n",
    ..POD_SECURITY_SPLIT
};

/// The sets every rendered object is dry-run with.
pub const DRY_RUN_SETS: [&ValuesSet; 7] = [
    &DEFAULT,
    &CERT_MANAGER_CONFIG_ONLY,
    &ROCE,
    &REAL_NODE,
    &FLEET_DASHBOARD,
    &POD_SECURITY_SPLIT,
    &POD_SECURITY_SPLIT_EXISTING,
];

/// Every set that renders (the schema-failure cases of chart_e2e.rs excluded).
pub const ALL_SETS: [&ValuesSet; 10] = [
    &DEFAULT,
    &CERT_MANAGER_CONFIG_ONLY,
    &ROCE,
    &ALL_PROFILES,
    &CERT_MANAGER_ISSUER,
    &REAL_NODE,
    &PCI_CONFIG_SPACE,
    &FLEET_DASHBOARD,
    &POD_SECURITY_SPLIT,
    &POD_SECURITY_SPLIT_EXISTING,
];

/// What Helm takes as `.Capabilities.APIVersions` from the server behind `client`: every
/// group/version it serves and every group/version/kind.
pub async fn server_api_versions(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run()
        .await?;
    let mut out = Vec::new();
    for group in discovery.groups() {
        for ver in group.versions() {
            let gv = if group.name().is_empty() {
                ver.to_string()
            } else {
                format!("{}/{ver}", group.name())
            };
            for (res, _) in group.versioned_resources(ver) {
                out.push(format!("{gv}/{}", res.kind));
            }
            out.push(gv);
        }
    }
    Ok(out)
}

/// The chart's objects as JSON, rendered by `helm template` with `set` for the server behind
/// `client`: its API versions and its own version (`gitVersion`), as `helm install` against
/// it would.
pub async fn render_for_server(set: &ValuesSet, client: &kube::Client) -> Result<Vec<Json>> {
    let api_versions = server_api_versions(client).await?;
    let version = client.apiserver_version().await?.git_version;
    Ok(set
        .render(&api_versions, &version)?
        .into_iter()
        .map(|d| d.obj)
        .collect())
}
