//! Where profiles and namespace labels come from: watched stores in cluster mode, a YAML
//! file in standalone mode (where namespaces have no labels, so namespace-selector
//! exemptions and the Pod Security label are never seen; listing namespaces by name in a
//! profile's `exemptions.namespaces` still works).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client, ResourceExt};
use railguard_api::profile_list::InvalidProfiles;
use railguard_api::profile_list::{partition, ProfileObject};
use railguard_api::FabricProfile;
use railguard_kube::store::Store;
use railguard_kube::watch::{watch_into, Config};
use railguard_kube::ProfileStatusWriter;
use railguard_webhook::ProfileSet;
use tokio::sync::mpsc;

use crate::namespace_lookup::{LookupLimits, NamespaceLookups};
use railguard_webhook::config::NamespaceInfo;

pub struct Catalog {
    profiles: RwLock<ProfileSet>,
    /// Each namespace's labels, by name.
    namespaces: Option<Arc<Store<BTreeMap<String, String>>>>,
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
        let ns_store: Arc<Store<BTreeMap<String, String>>> = Arc::new(Store::new("namespaces"));
        let profile_store: Arc<Store<ProfileObject>> = Arc::new(Store::new("fabricprofiles"));
        let (statuses, pending) = mpsc::unbounded_channel();
        tokio::spawn(write_statuses(
            ProfileStatusWriter::new(client.clone(), "railguard-webhook"),
            pending,
        ));
        let catalog = Arc::new(Self {
            profiles: RwLock::new(Arc::new(Vec::new())),
            namespaces: Some(ns_store.clone()),
            client: Some(client.clone()),
            lookups: NamespaceLookups::new(LookupLimits::default()),
            ready: AtomicBool::new(false),
            invalid: Mutex::default(),
            statuses: Some(statuses),
            metrics: Some(metrics.clone()),
        });

        let (store, ns_client) = (ns_store.clone(), client.clone());
        tokio::spawn(async move {
            watch_into(
                Api::<Namespace>::all(ns_client),
                Config::default(),
                &store,
                |ns: &Namespace| Some(ns.labels().clone()),
                |_| {},
                |_| {},
            )
            .await;
        });

        let weak = Arc::downgrade(&catalog);
        let store = profile_store.clone();
        tokio::spawn(async move {
            watch_into(
                Api::<ProfileObject>::all(client),
                Config::default(),
                &store,
                |p: &ProfileObject| Some(p.clone()),
                |_| {
                    if let Some(catalog) = weak.upgrade() {
                        let n = catalog.rebuild_profiles(&store);
                        metrics.profiles.set(n as i64);
                    }
                },
                |_| {},
            )
            .await;
        });

        let weak = Arc::downgrade(&catalog);
        tokio::spawn(async move {
            tokio::join!(ns_store.synced(), profile_store.synced());
            if let Some(catalog) = weak.upgrade() {
                catalog.rebuild_profiles(&profile_store);
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
        let objects = reader.values();
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
        if let Some(labels) = store.get(name) {
            info.labels = (*labels).clone();
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
