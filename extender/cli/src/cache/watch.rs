//! The watches that feed [`ClusterState`]: one per cache, each converting objects to what
//! its store keeps and telling the derived state what changed.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::{Api, Client, Resource, ResourceExt};
use railguard_api::{NodeFabric, ProfileObject};
use railguard_extender::cache::{bound_pod, CachedNode};
use railguard_kube::store::{Applied, Store};
use railguard_kube::watch::{watch_into, Config};

use crate::cache::ClusterState;
use crate::metrics::{CacheLabels, Metrics};

impl ClusterState {
    /// Runs the four watches until the returned future is dropped.
    pub async fn run(self: Arc<Self>, client: Client, metrics: Arc<Metrics>) {
        let nodes = watch(
            Api::<Node>::all(client.clone()),
            Config::default(),
            &self.nodes,
            &metrics,
            |n: &Node| {
                let fabric = NodeFabric::from_node(n, Timestamp::now());
                Some(CachedNode::new(Arc::new(fabric), &self.profile_set()))
            },
            |applied| self.node_changed(applied),
        );
        let config = self.config.clone();
        let pods = watch(
            Api::<Pod>::all(client.clone()),
            // Only bound pods matter for locality.
            Config::default().fields("spec.nodeName!="),
            &self.pods,
            &metrics,
            move |p: &Pod| bound_pod(p, &config),
            |applied| match applied {
                Applied::Staged => {}
                Applied::Replaced => self.jobs.rebuild(&self.pods.read()),
                Applied::Changed { old, new } => self.jobs.update(old.as_deref(), new.as_deref()),
            },
        );
        let namespaces = watch(
            Api::<Namespace>::all(client.clone()),
            Config::default(),
            &self.namespaces,
            &metrics,
            |ns: &Namespace| Some(ns.labels().clone()),
            |_| {},
        );
        // Each object decoded on its own: an invalid one is skipped and reported, never a
        // failed list (see `ClusterState::profile_objects_changed`).
        let profiles = watch(
            Api::<ProfileObject>::all(client),
            Config::default(),
            &self.profile_objects,
            &metrics,
            |p: &ProfileObject| Some(p.clone()),
            |_| self.profile_objects_changed(&metrics),
        );
        tokio::join!(nodes, pods, namespaces, profiles);
    }
}

/// One of the four watches, its errors counted in `watch_errors` by cache.
async fn watch<K, V>(
    api: Api<K>,
    config: Config,
    store: &Store<V>,
    metrics: &Metrics,
    convert: impl Fn(&K) -> Option<V>,
    on_change: impl Fn(&Applied<V>),
) where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watch_into(api, config, store, convert, on_change, |_| {
        metrics
            .watch_errors
            .get_or_create(&CacheLabels { cache: store.name })
            .inc();
    })
    .await;
}
