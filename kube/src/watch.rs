//! The one watch-and-store: a watch of one kind of object feeding a [`Store`], each object
//! converted to what the cache keeps (`None`: not of interest), a (re)list swapped in whole,
//! and the caller told about every change it applied. The extender's cluster state, the node
//! guard's caches and the fleet controller's all run on it.

use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};

use crate::store::{Applied, Applier, Change, Store};

/// What a watch lists and watches (labels, fields): kube-runtime's.
pub use kube::runtime::watcher::Config;

/// The key an object is cached under: `namespace/name`, or `name` for cluster-scoped ones.
pub fn object_key<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.clone().unwrap_or_default();
    match &meta.namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name,
    }
}

/// Runs the watch of `api` (filtered by `config`) into `store` until the future is dropped,
/// retrying with kube-runtime's default backoff. `on_change` hears every change that
/// readers can see (not the objects of a list in progress); `on_error` every failed watch
/// call before its retry (it is also logged here, with the cache's name).
pub async fn watch_into<K, V>(
    api: Api<K>,
    config: watcher::Config,
    store: &Store<V>,
    convert: impl Fn(&K) -> Option<V>,
    mut on_change: impl FnMut(&Applied<V>),
    on_error: impl Fn(&watcher::Error),
) where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let stream = watcher::watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    let mut applier = Applier::default();
    while let Some(event) = stream.next().await {
        let change = match event {
            Ok(Event::Init) => Change::Restart,
            Ok(Event::InitApply(obj)) => Change::Listed(object_key(&obj), convert(&obj)),
            Ok(Event::InitDone) => {
                tracing::info!(cache = store.name, "cache listed");
                Change::ListDone
            }
            Ok(Event::Apply(obj)) => Change::Changed(object_key(&obj), convert(&obj)),
            Ok(Event::Delete(obj)) => Change::Changed(object_key(&obj), None),
            Err(e) => {
                on_error(&e);
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
