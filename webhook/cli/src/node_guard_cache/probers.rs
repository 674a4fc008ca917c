//! The cache of prober pods the node guard looks requesters up in: a reflector over the
//! pods of the prober namespace (the release namespace unless split) that carry the probers' labels (one per GPU node), fed by
//! one watch. Handlers only read it.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

use railguard_webhook::node_guard::{PodLookup, ProberPod};

/// See the module docs.
#[derive(Clone)]
pub struct ProberPods {
    namespace: String,
    store: Store<Pod>,
}

impl ProberPods {
    /// Starts the watch of pods in `namespace` matching the label `selector` (the probers'
    /// DaemonSet labels) in a task of its own.
    pub fn watch(client: Client, namespace: &str, selector: &str) -> Self {
        let (store, writer) = reflector::store::<Pod>();
        let config = watcher::Config::default().labels(selector);
        let stream = reflector::reflector(
            writer,
            watcher(Api::<Pod>::namespaced(client, namespace), config)
                .default_backoff()
                // Only the facts the guard reads are kept: a pod's spec and status are large.
                .modify(|pod: &mut Pod| {
                    pod.managed_fields_mut().clear();
                    pod.annotations_mut().clear();
                    pod.status = None;
                    if let Some(spec) = pod.spec.as_mut() {
                        spec.containers.clear();
                        spec.init_containers = None;
                        spec.volumes = None;
                    }
                }),
        );
        let ns = namespace.to_string();
        tokio::spawn(async move {
            let mut s = std::pin::pin!(stream);
            while let Some(ev) = s.next().await {
                if let Err(e) = ev {
                    tracing::warn!(namespace = %ns, error = %e, "prober pod watch error");
                }
            }
        });
        Self {
            namespace: namespace.to_string(),
            store,
        }
    }

    /// What the cache knows of prober pod `name`.
    pub fn lookup(&self, name: &str) -> PodLookup {
        match self
            .store
            .get(&ObjectRef::new(name).within(&self.namespace))
        {
            Some(pod) => PodLookup::Found(facts(&pod)),
            None if self.is_synced() => PodLookup::Missing,
            None => PodLookup::NotSynced,
        }
    }

    /// Whether the first list has completed.
    pub fn is_synced(&self) -> bool {
        super::store_synced(&self.store)
    }

    /// Waits up to `timeout` for the first list (a request arriving right after start-up).
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        matches!(
            tokio::time::timeout(timeout, self.store.wait_until_ready()).await,
            Ok(Ok(()))
        )
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
