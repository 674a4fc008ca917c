//! Where profiles and namespace labels come from: reflector caches in cluster mode, a YAML
//! file in standalone mode (where namespaces have no labels, so namespace-selector
//! exemptions and the Pod Security label are never seen; listing namespaces by name in a
//! profile's `exemptions.namespaces` still works).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use railguard_api::profile_list::InvalidProfiles;
use railguard_api::profile_list::{partition, ProfileObject};
use railguard_api::FabricProfile;
use railguard_kube::ProfileStatusWriter;
use railguard_webhook::ProfileSet;
use tokio::sync::mpsc;

use crate::namespace_lookup::{LookupLimits, NamespaceLookups};
use railguard_webhook::config::NamespaceInfo;

pub struct Catalog {
    profiles: RwLock<ProfileSet>,
    namespaces: Option<Store<Namespace>>,
    client: Option<Client>,
    /// Live GETs for namespaces the cache misses, bounded.
    lookups: NamespaceLookups,
    ready: AtomicBool,
    /// Profiles skipped as invalid (cluster mode), for the log and the metric.
    invalid: Mutex<InvalidProfiles>,
    /// Objects whose status condition is out of date, to the status writer (cluster mode).
    statuses: Option<mpsc::UnboundedSender<ProfileObject>>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl Catalog {
    /// Standalone mode: fixed profiles, namespaces without labels, ready at once.
    pub fn standalone(mut profiles: Vec<FabricProfile>) -> Arc<Self> {
        profiles.sort_by(|a, b| a.name().cmp(b.name()));
        Arc::new(Self {
            profiles: RwLock::new(Arc::new(profiles)),
            namespaces: None,
            client: None,
            lookups: NamespaceLookups::new(LookupLimits::default()),
            ready: AtomicBool::new(true),
            invalid: Mutex::default(),
            statuses: None,
            metrics: None,
        })
    }

    /// Cluster mode: starts FabricProfile and Namespace reflectors; [`Catalog::is_ready`]
    /// turns true once both caches have listed. Each FabricProfile object is decoded on its
    /// own ([`ProfileObject`]): an invalid one is skipped and reported (warning log, the
    /// `fabric_profiles_invalid` metric, its `Valid=False` status condition and a Warning
    /// Event), the others are served.
    pub fn cluster(client: Client, metrics: Arc<crate::metrics::Metrics>) -> Arc<Self> {
        let (ns_reader, ns_writer) = reflector::store::<Namespace>();
        let (profile_reader, profile_writer) = reflector::store::<ProfileObject>();
        let (statuses, pending) = mpsc::unbounded_channel();
        tokio::spawn(write_statuses(
            ProfileStatusWriter::new(client.clone(), "railguard-webhook"),
            pending,
        ));
        let catalog = Arc::new(Self {
            profiles: RwLock::new(Arc::new(Vec::new())),
            namespaces: Some(ns_reader.clone()),
            client: Some(client.clone()),
            lookups: NamespaceLookups::new(LookupLimits::default()),
            ready: AtomicBool::new(false),
            invalid: Mutex::default(),
            statuses: Some(statuses),
            metrics: Some(metrics.clone()),
        });

        let ns_stream = reflector::reflector(
            ns_writer,
            watcher(
                Api::<Namespace>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff(),
        );
        tokio::spawn(async move {
            let mut s = std::pin::pin!(ns_stream);
            while let Some(ev) = s.next().await {
                if let Err(e) = ev {
                    tracing::warn!(error = %e, "namespace watch error");
                }
            }
        });

        let profile_stream = reflector::reflector(
            profile_writer,
            watcher(
                Api::<ProfileObject>::all(client),
                watcher::Config::default(),
            )
            .default_backoff(),
        );
        let weak = Arc::downgrade(&catalog);
        let reader = profile_reader.clone();
        tokio::spawn(async move {
            let mut s = std::pin::pin!(profile_stream);
            while let Some(ev) = s.next().await {
                let Some(catalog) = weak.upgrade() else {
                    return;
                };
                match ev {
                    Ok(_) => {
                        let n = catalog.rebuild_profiles(&reader);
                        metrics.profiles.set(n as i64);
                    }
                    Err(e) => tracing::warn!(error = %e, "FabricProfile watch error"),
                }
            }
        });

        let weak = Arc::downgrade(&catalog);
        tokio::spawn(async move {
            let synced = ns_reader.wait_until_ready().await.is_ok()
                && profile_reader.wait_until_ready().await.is_ok();
            if let (true, Some(catalog)) = (synced, weak.upgrade()) {
                catalog.rebuild_profiles(&profile_reader);
                catalog.ready.store(true, Ordering::Release);
                tracing::info!("profile and namespace caches synced");
            }
        });
        catalog
    }

    /// Re-reads the profile cache into a snapshot of the valid profiles; the invalid ones
    /// are reported (log and metric once per change) and every object whose status
    /// condition is out of date goes to the status writer.
    fn rebuild_profiles(&self, reader: &Store<ProfileObject>) -> usize {
        let objects = reader.state();
        let (valid, invalid) = partition(objects.iter().map(|o| o.as_ref()));
        let changes = match self.invalid.lock() {
            Ok(mut set) => set.replace(invalid),
            Err(poisoned) => poisoned.into_inner().replace(invalid),
        };
        railguard_kube::log_profile_changes(&changes, "webhook");
        if let Some(m) = &self.metrics {
            railguard_kube::record_profile_changes(&changes, &m.profiles_invalid);
        }
        if let Some(tx) = &self.statuses {
            for o in objects.iter().filter(|o| o.condition_update().is_some()) {
                // The writer outlives the catalog's watch; a closed channel means shutdown.
                let _ = tx.send((**o).clone());
            }
        }
        let n = valid.len();
        if let Ok(mut guard) = self.profiles.write() {
            *guard = Arc::new(valid);
        }
        n
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn profiles(&self) -> ProfileSet {
        match self.profiles.read() {
            Ok(g) => g.clone(),
            // A writer panicked mid-swap; the old Arc is still whole.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The namespace's labels: from the cache, or (a namespace created a moment ago) from
    /// the API server through [`NamespaceLookups`]; unknown labels are empty.
    pub async fn namespace(&self, name: &str) -> NamespaceInfo {
        let mut info = NamespaceInfo::new(name);
        let Some(store) = &self.namespaces else {
            return info;
        };
        if let Some(ns) = store.get(&ObjectRef::new(name)) {
            info.labels = ns.metadata.labels.clone().unwrap_or_default();
            return info;
        }
        if let Some(client) = &self.client {
            let api = Api::<Namespace>::all(client.clone());
            let fetch = || async move {
                match tokio::time::timeout(Duration::from_secs(2), api.get_opt(name)).await {
                    Ok(Ok(ns)) => Ok(ns.map(|ns| ns.metadata.labels.unwrap_or_default())),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("timed out after 2s".to_string()),
                }
            };
            info.labels = self.lookups.labels(name, fetch).await.unwrap_or_default();
        }
        info
    }
}

/// Writes the status of the objects it is sent, one at a time; an object already written at
/// the same resourceVersion is skipped (rebuilds resend objects until the watch shows the
/// new status).
async fn write_statuses(
    writer: ProfileStatusWriter,
    mut pending: mpsc::UnboundedReceiver<ProfileObject>,
) {
    let mut written: HashMap<String, Option<String>> = HashMap::new();
    while let Some(object) = pending.recv().await {
        let version = object.metadata.resource_version.clone();
        if written.get(object.name()) == Some(&version) {
            continue;
        }
        writer.update(&object).await;
        written.insert(object.name().to_string(), version);
    }
}
