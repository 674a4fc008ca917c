//! The node guard's caches: the prober pods (for [`railguard_webhook::node_guard::decide`]'s
//! pod lookup) and the Nodes' railguard outputs (the guard's own view of a Node), each one
//! of `railguard_kube`'s watched stores. The decisions are `railguard_webhook::node_guard`'s.

pub mod nodes;
pub mod probers;
