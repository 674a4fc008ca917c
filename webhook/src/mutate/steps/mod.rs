//! One function per part of the configuration, in the order [`mutate()`](super::mutate())
//! runs them. Each reads the [`Ctx`], honors its own `railguard.io/skip` part, adds its
//! operations, warnings and mutation to the [`Draft`], and is tested alone in its file.

use super::{Ctx, Draft};
use crate::error::MutateError;

mod affinity;
mod annotations;
mod dra;
mod ipc_lock;
mod nccl_env;
mod network;
mod preflight;
mod rdma;
mod shm;

pub(crate) use annotations::annotation_ops;

/// A step of the configuration.
pub(crate) type Step = fn(&Ctx<'_>, &mut Draft) -> Result<(), MutateError>;

/// Every step, in order: container changes first (the preflight copy sees them all), the
/// output annotations last (they list every mutation).
pub(crate) const ALL: [Step; 9] = [
    nccl_env::nccl_env,
    ipc_lock::ipc_lock,
    shm::shm,
    rdma::rdma,
    network::network,
    affinity::affinity,
    preflight::preflight,
    // Records that `rdma` and `affinity` left a DRA pod to its claim.
    dra::dra,
    annotations::annotations,
];
