//! The guard's own view of every Node's railguard outputs: a reflector over Nodes keeping
//! only the protected labels, annotations and condition (a few hundred bytes a node).
//!
//! It stands in for the review's `oldObject` when that is byte-identical to `object`: the
//! Kubernetes 1.20 API server of the test harness sends the updated Node as both for every
//! update (a no-op update is the only other such case), so a guard reading `oldObject`
//! alone would see no change and allow everything. The cache lags the API server by a
//! watch event: right after a Node's outputs changed, a write by someone else that leaves
//! them as they now are can be refused once (the writer retries, as kubelets do).

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

use railguard_webhook::node_guard::{keep_outputs, NodeView};

/// See the module docs.
#[derive(Clone)]
pub struct NodeOutputs {
    store: Store<Node>,
}

impl NodeOutputs {
    /// Starts the watch of every Node in a task of its own.
    pub fn watch(client: Client) -> Self {
        let (store, writer) = reflector::store::<Node>();
        let stream = reflector::reflector(
            writer,
            watcher(Api::<Node>::all(client), watcher::Config::default())
                .default_backoff()
                .modify(keep_outputs),
        );
        tokio::spawn(async move {
            let mut s = std::pin::pin!(stream);
            while let Some(ev) = s.next().await {
                if let Err(e) = ev {
                    tracing::warn!(error = %e, "node guard: node watch error");
                }
            }
        });
        Self { store }
    }

    /// Whether the Node watch has listed once (before, a missing Node means nothing).
    pub fn is_synced(&self) -> bool {
        super::store_synced(&self.store)
    }

    /// The cached outputs of Node `name`, None when the cache does not hold it.
    pub fn view(&self, name: &str) -> Option<NodeView> {
        let node = self.store.get(&ObjectRef::new(name))?;
        let value = serde_json::to_value(&*node).ok()?;
        serde_json::from_value(value).ok()
    }
}
