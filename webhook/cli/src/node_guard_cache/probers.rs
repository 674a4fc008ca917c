//! The cache of prober pods the node guard looks requesters up in: a reflector over the
//! pods of the prober namespace (the release namespace unless split) that carry the probers' labels (one per GPU node), fed by
//! one watch. Handlers only read it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use railguard_kube::store::Store;
use railguard_kube::watch::{watch_into, Config};

use railguard_webhook::node_guard::{PodLookup, ProberPod};

/// See the module docs.
#[derive(Clone)]
pub struct ProberPods {
    namespace: String,
    store: Arc<Store<ProberPod>>,
}

impl ProberPods {
    /// Starts the watch of pods in `namespace` matching the label `selector` (the probers'
    /// DaemonSet labels) in a task of its own. Only the facts the guard reads are kept: a
    /// pod's spec and status are large.
    pub fn watch(client: Client, namespace: &str, selector: &str) -> Self {
        let store = Arc::new(Store::new("node-guard-prober-pods"));
        let fed = store.clone();
        let api = Api::<Pod>::namespaced(client, namespace);
        let config = Config::default().labels(selector);
        tokio::spawn(async move {
            watch_into(api, config, &fed, |p: &Pod| Some(facts(p)), |_| {}, |_| {}).await;
        });
        Self {
            namespace: namespace.to_string(),
            store,
        }
    }

    /// What the cache knows of prober pod `name`.
    pub fn lookup(&self, name: &str) -> PodLookup {
        match self.store.get(&format!("{}/{name}", self.namespace)) {
            Some(pod) => PodLookup::Found((*pod).clone()),
            None if self.is_synced() => PodLookup::Missing,
            None => PodLookup::NotSynced,
        }
    }

    /// Whether the first list has completed.
    pub fn is_synced(&self) -> bool {
        self.store.is_synced()
    }

    /// Waits up to `timeout` for the first list (a request arriving right after start-up).
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        self.store.wait_synced(timeout).await
    }
}

/// The facts of a pod the decision reads.
pub fn facts(pod: &Pod) -> ProberPod {
    let spec = pod.spec.as_ref();
    ProberPod {
        uid: pod.metadata.uid.clone(),
        node_name: spec.and_then(|s| s.node_name.clone()),
        service_account: spec.and_then(|s| {
            s.service_account_name
                .clone()
                .or_else(|| s.service_account.clone())
        }),
    }
}
