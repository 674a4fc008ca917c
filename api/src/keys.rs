//! The label, annotation and condition keys of railguard's Node and Pod contract.
//! Operators select on these; they are part of the public API and never change meaning.

/// API group of railguard's custom resources.
pub const GROUP: &str = "railguard.io";
/// Field manager of the node's own prober (`certify --publish`, `daemon`) on Nodes.
///
/// Two writers share a Node's certificate: the prober (its own run's results) and the
/// campaign coordinator ([`CAMPAIGN_FIELD_MANAGER`], the cross-node findings). Neither
/// overwrites the other: each reads the Node, merges its part into the certificate found
/// there and writes with that read's `resourceVersion` as a precondition, retrying on a
/// conflict. The campaign's part is its findings, kept in the certificate under
/// [`CERTIFICATE_CAMPAIGN_KEY`] (and the NCCL pair results under `ncclPairs`); the prober
/// carries them into every certificate it writes and re-applies them, so a campaign's blame
/// stands until the next campaign clears it.
pub const PROBER_FIELD_MANAGER: &str = "railguard-prober";
/// Field manager of the campaign coordinator (`railguard-prober campaign`) on Nodes.
pub const CAMPAIGN_FIELD_MANAGER: &str = "railguard-campaign";
/// Key in the certificate JSON holding the last campaign's findings for the node (written by
/// the campaign, carried by the prober); absent until a campaign wrote to the node.
pub const CERTIFICATE_CAMPAIGN_KEY: &str = "campaign";
/// Field manager of the fleet controller (`railguard-prober fleet --watch`): the
/// [`CONDITION_FLEET_OUTLIER`] Node condition and `status.fleet` of FabricProfiles.
pub const FLEET_FIELD_MANAGER: &str = "railguard-fleet";
/// Generic field manager for other railguard writers (webhook cert rotation, demo).
pub const FIELD_MANAGER: &str = "railguard";

/// Node label: `certified|degraded|failed|pending`.
pub const LABEL_FABRIC: &str = "railguard.io/fabric";
/// Node label: the FabricProfile the node was certified against.
pub const LABEL_PROFILE: &str = "railguard.io/profile";
/// Node label: short hash of the rail layout (see [`crate::signature`]).
pub const LABEL_SIGNATURE: &str = "railguard.io/signature";

/// Node label: `"true"` while the certificate on the Node was made by a simulated engine and
/// stand-in (`simulated: true`); absent otherwise. It lets a node affinity (the webhook's)
/// keep pods off simulated certifications, which only profiles with
/// `certification.acceptSimulated` count.
pub const LABEL_SIMULATED: &str = "railguard.io/simulated";
/// The one value of [`LABEL_SIMULATED`].
pub const SIMULATED: &str = "true";

/// Node annotation: JSON [`crate::certificate::Certificate`].
pub const ANNOTATION_CERTIFICATE: &str = "railguard.io/certificate";
/// Node annotation: ask the prober for an invasive run now (any non-empty value).
pub const ANNOTATION_RECERTIFY: &str = "railguard.io/recertify";
/// Node annotation: the daemon waits for an invasive slot since (RFC 3339), renewed while it
/// waits; the fleet controller queues such nodes oldest certificate first
/// ([`crate::invasive`]).
pub const ANNOTATION_INVASIVE_WAITING: &str = "railguard.io/invasive-waiting";

/// Node condition type published by the prober.
pub const CONDITION_FABRIC_READY: &str = "RailguardFabricReady";
/// Node condition type published by the fleet controller: `True` when a measurement of the
/// node is an outlier of its profile's fleet (reasons in [`crate::fleet::reason`]).
pub const CONDITION_FLEET_OUTLIER: &str = "RailguardFleetOutlier";

/// Pod input: choose a profile by name (also written back as an output).
pub const ANNOTATION_PROFILE: &str = "railguard.io/profile";
/// Pod input: `"false"` opts a pod out, `"true"` opts a non-GPU pod in.
pub const ANNOTATION_INJECT: &str = "railguard.io/inject";
/// Pod input: comma list of parts to skip, see [`SKIP_PARTS`].
pub const ANNOTATION_SKIP: &str = "railguard.io/skip";
/// Pod input: `"true"` lets the extender place the pod on uncertified nodes.
pub const ANNOTATION_ALLOW_UNCERTIFIED: &str = "railguard.io/allow-uncertified";
/// Pod output: the rail-layout signature of the chosen profile.
pub const ANNOTATION_SIGNATURE: &str = "railguard.io/signature";
/// Pod output: comma list of the mutations the webhook applied.
pub const ANNOTATION_MUTATIONS: &str = "railguard.io/mutations";

/// Pod output in Audit mode: what railguard would have done (profile, mutations or denial,
/// and the JSON patch), recorded instead of applied.
pub const ANNOTATION_AUDIT: &str = "railguard.io/audit";
/// Namespace and pod label that opts pods into railguard's admission (chart default scope,
/// `webhook.optIn`): `"true"`.
pub const LABEL_INJECT: &str = "railguard.io/inject";

/// The parts of a mutation a pod may skip with [`ANNOTATION_SKIP`].
pub const SKIP_PARTS: &[&str] = &["shm", "ipc-lock", "nccl-env", "rdma", "network", "affinity"];

/// Multus network selection annotation.
pub const ANNOTATION_MULTUS_NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
/// Pod Security Admission enforce label on namespaces.
pub const LABEL_POD_SECURITY_ENFORCE: &str = "pod-security.kubernetes.io/enforce";

/// Node label an operator sets for a maintenance window (any value but `false`): the prober
/// starts no invasive test there, a requested one too (it is kept until the label goes).
pub const LABEL_MAINTENANCE: &str = "railguard.io/maintenance";

/// The NoSchedule taint the fleet controller keeps on unhealthy nodes of a profile with
/// `certification.taints`; its value is the reason (see [`taint_reason`]).
pub const TAINT_FABRIC_UNHEALTHY: &str = "railguard.io/fabric-unhealthy";

/// Values of [`TAINT_FABRIC_UNHEALTHY`].
pub mod taint_reason {
    pub const FAILED: &str = "failed";
    pub const DEGRADED: &str = "degraded";
    pub const EXPIRED: &str = "expired";
    pub const OUTLIER: &str = "outlier";
    /// Put by the node's prober for the length of an invasive run.
    pub const TESTING: &str = "testing";
}

/// Label values of [`LABEL_FABRIC`].
pub mod fabric {
    pub const CERTIFIED: &str = "certified";
    pub const DEGRADED: &str = "degraded";
    pub const FAILED: &str = "failed";
    pub const PENDING: &str = "pending";
}

/// Default GPU resource names that make a pod a training pod.
pub const DEFAULT_GPU_RESOURCES: &[&str] = &["nvidia.com/gpu"];

/// Default label keys that group pods of one job (gang locality).
pub const DEFAULT_JOB_LABEL_KEYS: &[&str] = &[
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "leaderworkerset.sigs.k8s.io/name",
    "batch.kubernetes.io/job-name",
];

/// Default topology label keys, most specific first.
pub const DEFAULT_TOPOLOGY_KEYS: &[&str] = &[
    "network.topology.nvidia.com/leaf",
    "network.topology.nvidia.com/spine",
    "fabric.topograph.run/tier-1",
];

/// The environment the webhook gives a mutated container and its preflight init container,
/// and that `railguard-prober preflight` checks: one definition for both sides.
pub mod env {
    /// The profile's HCA list (`=mlx5_0:1,...`, exact match).
    pub const NCCL_IB_HCA: &str = "NCCL_IB_HCA";
    /// The profile's bootstrap/socket interface.
    pub const NCCL_SOCKET_IFNAME: &str = "NCCL_SOCKET_IFNAME";
    /// The profile's cross-NIC setting.
    pub const NCCL_CROSS_NIC: &str = "NCCL_CROSS_NIC";
    /// The profile's RoCE traffic class (`rdma.trafficClass`).
    pub const NCCL_IB_TC: &str = "NCCL_IB_TC";
    /// The profile's InfiniBand service level (`rdma.serviceLevel`).
    pub const NCCL_IB_SL: &str = "NCCL_IB_SL";
    /// NCCL's own: the environment plugin NCCL loads (`delivery: Plugin` profiles).
    pub const NCCL_ENV_PLUGIN: &str = "NCCL_ENV_PLUGIN";
    /// The node file railguard's NCCL environment plugin reads (`delivery: Plugin`).
    pub const NCCL_CONFIG: &str = "RAILGUARD_NCCL_CONFIG";
    /// The FabricProfile the pod is held to.
    pub const PROFILE: &str = "RAILGUARD_PROFILE";
    /// The rail-layout signature of that profile.
    pub const SIGNATURE: &str = "RAILGUARD_SIGNATURE";
    /// The size of the memory-backed `/dev/shm` the webhook mounted (a Kubernetes quantity);
    /// preflight checks the mounted size against it.
    pub const SHM_SIZE: &str = "RAILGUARD_SHM_SIZE";
}
