//! The settings that shape decisions.

use railguard_api::keys;

/// Settings that shape decisions.
#[derive(Clone, Debug, PartialEq)]
pub struct ExtenderConfig {
    /// Resources that make a pod a GPU pod.
    pub gpu_resources: Vec<String>,
    /// Pod label keys that group the pods of one job, tried in order.
    pub job_label_keys: Vec<String>,
    /// Node topology label keys, most specific first, for profiles that name none.
    pub topology_keys: Vec<String>,
    /// Report every rejected node in `FailedNodes`, none in `FailedAndUnresolvableNodes`:
    /// kube-scheduler 1.20 and older read only `FailedNodes`, so otherwise the reasons for
    /// nodes that can never fit (a degraded rail, another profile) never reach the pod's
    /// FailedScheduling event. The cost: preemption may evict pods on such nodes for nothing.
    pub report_unresolvable_as_failed: bool,
}

impl Default for ExtenderConfig {
    fn default() -> Self {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        ExtenderConfig {
            gpu_resources: own(keys::DEFAULT_GPU_RESOURCES),
            job_label_keys: own(keys::DEFAULT_JOB_LABEL_KEYS),
            topology_keys: own(keys::DEFAULT_TOPOLOGY_KEYS),
            report_unresolvable_as_failed: false,
        }
    }
}
