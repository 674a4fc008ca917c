//! The guard's own view of every Node's railguard outputs: a reflector over Nodes keeping
//! only the protected labels, annotations and condition (a few hundred bytes a node).
//!
//! It stands in for the review's `oldObject` when that is byte-identical to `object`: the
//! Kubernetes 1.20 API server of the test harness sends the updated Node as both for every
//! update (a no-op update is the only other such case), so a guard reading `oldObject`
//! alone would see no change and allow everything. The cache lags the API server by a
//! watch event: right after a Node's outputs changed, a write by someone else that leaves
//! them as they now are can be refused once (the writer retries, as kubelets do).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use railguard_kube::store::Store;
use railguard_kube::watch::{watch_into, Config};

use railguard_webhook::node_guard::{keep_outputs, NodeView};

/// See the module docs.
#[derive(Clone)]
pub struct NodeOutputs {
    store: Arc<Store<NodeView>>,
}

impl NodeOutputs {
    /// Starts the watch of every Node in a task of its own.
    pub fn watch(client: Client) -> Self {
        let store = Arc::new(Store::new("node-guard-nodes"));
        let fed = store.clone();
        tokio::spawn(async move {
            watch_into(
                Api::<Node>::all(client),
                Config::default(),
                &fed,
                view_of,
                |_| {},
                |_| {},
            )
            .await;
        });
        Self { store }
    }

    /// Whether the Node watch has listed once (before, a missing Node means nothing).
    pub fn is_synced(&self) -> bool {
        self.store.is_synced()
    }

    /// The cached outputs of Node `name`, None when the cache does not hold it.
    pub fn view(&self, name: &str) -> Option<NodeView> {
        self.store.get(name).map(|v| (*v).clone())
    }
}

/// What the cache keeps of a Node: its protected outputs, decoded once per change. A Node
/// that does not decode is not held (the guard then treats it as not cached), and said.
fn view_of(node: &Node) -> Option<NodeView> {
    let mut outputs = node.clone();
    keep_outputs(&mut outputs);
    match serde_json::to_value(&outputs).and_then(serde_json::from_value) {
        Ok(view) => Some(view),
        Err(e) => {
            tracing::warn!(node = ?node.metadata.name, error = %e, "node guard: cannot decode the Node's outputs; not cached");
            None
        }
    }
}
