//! The watches that feed [`ClusterState`]: one per cache, each converting objects to what
//! its store keeps and telling the derived state what changed.

use std::sync::Arc;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use railguard_api::{NodeFabric, ProfileObject};

use crate::cache::ClusterState;
use crate::metrics::{CacheLabels, Metrics};
use railguard_extender::cache::{bound_pod, Applied, Applier, CachedNode, Change, Store};

impl ClusterState {
    /// Runs the four watches until the returned future is dropped.
    pub async fn run(self: Arc<Self>, client: Client, metrics: Arc<Metrics>) {
        let nodes = watch(
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
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
            watcher::Config::default().fields("spec.nodeName!="),
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
            watcher::Config::default(),
            &self.namespaces,
            &metrics,
            |ns: &Namespace| Some(ns.labels().clone()),
            |_| {},
        );
        // Each object decoded on its own: an invalid one is skipped and reported, never a
        // failed list (see `ClusterState::profile_objects_changed`).
        let profiles = watch(
            Api::<ProfileObject>::all(client),
            watcher::Config::default(),
            &self.profile_objects,
            &metrics,
            |p: &ProfileObject| Some(p.clone()),
            |_| self.profile_objects_changed(&metrics),
        );
        tokio::join!(nodes, pods, namespaces, profiles);
    }
}

fn key_of<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.clone().unwrap_or_default();
    match &meta.namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name,
    }
}

async fn watch<K, V>(
    api: Api<K>,
    config: watcher::Config,
    store: &Store<V>,
    metrics: &Metrics,
    convert: impl Fn(&K) -> Option<V>,
    on_change: impl Fn(&Applied<V>),
) where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let stream = watcher::watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    let mut applier = Applier::default();
    while let Some(event) = stream.next().await {
        let change = match event {
            Ok(Event::Init) => Change::Restart,
            Ok(Event::InitApply(obj)) => Change::Listed(key_of(&obj), convert(&obj)),
            Ok(Event::InitDone) => {
                tracing::info!(cache = store.name, "cache listed");
                Change::ListDone
            }
            Ok(Event::Apply(obj)) => Change::Changed(key_of(&obj), convert(&obj)),
            Ok(Event::Delete(obj)) => Change::Changed(key_of(&obj), None),
            Err(e) => {
                metrics
                    .watch_errors
                    .get_or_create(&CacheLabels { cache: store.name })
                    .inc();
                tracing::warn!(cache = store.name, error = %e, "watch failed; retrying");
                continue;
            }
        };
        let applied = applier.apply(store, change);
        if !matches!(applied, Applied::Staged) {
            on_change(&applied);
        }
    }
}
