//! The node guard's caches: the prober pods (for [`railguard_webhook::node_guard::decide`]'s
//! pod lookup) and the Nodes' railguard outputs (the guard's own view of a Node), each kept
//! by a reflector. The decisions are `railguard_webhook::node_guard`'s.

pub mod nodes;
pub mod probers;

/// Whether a reflector `store` has completed its first list: `wait_until_ready` resolves
/// at once when it has, so polling it once tells.
pub(crate) fn store_synced<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    futures::FutureExt::now_or_never(store.wait_until_ready()).is_some_and(|r| r.is_ok())
}
