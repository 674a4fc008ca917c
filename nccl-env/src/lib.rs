//! The rules of railguard's NCCL environment plugin (the library NCCL loads is the
//! `railguard-nccl-env-plugin` crate, `nccl-env/plugin/`, a thin C ABI over this one): NCCL
//! asks the plugin for every variable it reads, and it answers `NCCL_IB_HCA` (and the profile's NCCL settings) from what the prober certified
//! about this node, restricted to what this container and this process can actually use.
//!
//! # Loading
//!
//! NCCL ≥ 2.28.7 loads an environment plugin named by `NCCL_ENV_PLUGIN`: an absolute path,
//! or a name `<n>` it opens as `libnccl-env-<n>.so` from the library path (NVIDIA/nccl
//! `plugins/env/README.md`, `src/plugin/plugin_open.cc`). Cargo builds the plugin crate's
//! cdylib as `librailguard_nccl_env_plugin.so`; the install step (and the integration test)
//! copies it to `libnccl-env-railguard.so`, so `NCCL_ENV_PLUGIN=railguard` or the absolute
//! path finds it. The library exports `ncclEnvPlugin_v2` (NCCL passes its logger) and
//! `ncclEnvPlugin_v1`. The rules live in this plain library (no cdylib here: a crate that is
//! both cdylib and rlib gets an unhashed rlib name, and two builds of it in one target
//! directory overwrite each other under the crates linked against the first).
//!
//! # What it answers
//!
//! Computed once in `init` by [`answer`] and cached:
//! - `NCCL_IB_HCA` = the node's healthy rails ∩ the RDMA devices this container sees
//!   (`/sys/class/infiniband`; an SR-IOV VF maps to its rail by its `physfn` link's PCI
//!   address, a device whose PCI function cannot be read by netdev) ∩ the rails serving the
//!   GPUs this process sees (`NVIDIA_VISIBLE_DEVICES`, `CUDA_VISIBLE_DEVICES`, by index or
//!   UUID), in NCCL's exact-match form `=mlx5_0:1,mlx5_1:1` with the container's device names
//!   (`=`: NCCL compares whole names, not prefixes; `matchIfList` in `src/misc/utils.cc`,
//!   used by `src/transport/net_ib/init.cc`);
//! - `NCCL_IB_GID_INDEX` when every answered rail has the same proven GID index;
//! - `NCCL_SOCKET_IFNAME`, `NCCL_IB_TC`, `NCCL_IB_SL` and the profile's other `NCCL_*` pairs.
//!
//! A variable the container sets itself (non-empty; a value the webhook injected counts)
//! keeps its value, unless the node file says `enforce: true`: then it is replaced and the
//! replaced value is logged. Every other variable is the process environment's (`getenv`).
//!
//! A failed, pending or expired certificate, no usable rail, or fewer usable rails than the
//! fleet's consistent count is a warning, then `onUnhealthy`: `Warn` answers nothing itself
//! (the process environment as it is), `Fail` makes `init` return `ncclSystemError`, which
//! NCCL returns from `ncclGetUniqueId` and `ncclCommInit*`, so the job fails at start instead
//! of running over sockets (see the `ffi` module for what NCCL really does with it).
//! Any other error (no node file, garbage, unreadable sysfs) answers nothing itself after one
//! warning; the plugin never fails or blocks NCCL for its own problems.
//!
//! `consistentRails: true` answers the same number of rails on every node: the fleet's
//! `consistentRailCount` (limited to the rails serving this process' GPUs), the first ones
//! in natural order of the host's HCA names.
//!
//! Warnings go through NCCL's logger when NCCL prints them (`NCCL_DEBUG=WARN` or more
//! verbose), else to stderr; info lines (what was answered, kept, replaced, skipped) follow
//! `NCCL_DEBUG=INFO`.
//!
//! # Environment
//!
//! - `RAILGUARD_NCCL_CONFIG`: the node file (default `/run/railguard/nccl.json`);
//! - `RAILGUARD_NCCL_SYSFS_ROOT`: test/debug knob, read `<root>/sys/class/infiniband`.
//!
//! # The node file (version 1)
//!
//! JSON written by the prober. Unknown fields are ignored; a change an older plugin must
//! not ignore bumps `version`.
//!
//! ```json
//! {
//!   "version": 1,
//!   "node": "gpu-a1",
//!   "profile": "h100-ib",
//!   "certificate": {"generation": 7, "verdict": "certified", "expiresAt": "2026-12-24T10:00:00Z"},
//!   "rails": [
//!     {"hca": "mlx5_0", "port": 1, "pciAddress": "0000:0c:00.0", "netdev": "ibp12s0",
//!      "gidIndex": 3, "health": "healthy"}
//!   ],
//!   "gpus": [
//!     {"index": 0, "uuid": "GPU-8f3c…", "pciBusId": "0000:19:00.0", "rail": "mlx5_0:1"}
//!   ],
//!   "nccl": {"socketIfname": "=eth0", "trafficClass": 106, "serviceLevel": 3,
//!            "env": {"NCCL_IB_QPS_PER_CONNECTION": "2"},
//!            "enforce": false, "onUnhealthy": "Warn", "consistentRails": false},
//!   "fleet": {"consistentRailCount": 8}
//! }
//! ```
//!
//! - `certificate.verdict`: `certified`, `degraded` (the healthy rails are answered),
//!   `failed`, `pending`; `expiresAt` RFC 3339.
//! - `rails[]`: host HCA name, 1-based port, the PF's PCI address, netdev, GID index (all
//!   three optional), `health` `healthy|degraded|failed` (only `healthy` is answered).
//! - `gpus[]`: NVML index, UUID, PCI bus id (orders CUDA indices), the id `hca:port` of the
//!   rail serving it; empty or absent: no GPU filter.
//! - `nccl`: the profile's settings; `env` may not name `NCCL_IB_HCA`/`NCCL_IB_GID_INDEX`
//!   (computed) or the variables with a field of their own. Defaults: no settings,
//!   `enforce: false`, `onUnhealthy: Warn`, `consistentRails: false`.
//! - `fleet.consistentRailCount`: required (≥ 1) when `consistentRails` is true.
//!
//! The same format, with the rules above, is in `docs/nccl-env-plugin.md`.

mod answer;
mod gpus;
mod node_file;
mod shell;
mod view;

#[cfg(test)]
mod tests;

pub use answer::{
    answer, AnsweredRail, Answers, Level, Message, NCCL_IB_GID_INDEX, NCCL_IB_HCA, NCCL_IB_SL,
    NCCL_IB_TC, NCCL_SOCKET_IFNAME,
};
pub use node_file::{
    CertificateSummary, FleetView, Gpu, NcclProfile, NodeFile, NodeFileError, OnUnhealthy, Rail,
    RailHealth, Verdict, NODE_FILE_VERSION,
};
pub use shell::{
    answers_for_process, error_chain, load, read_node_file, route, Config, PluginError, Route,
    CONFIG_ENV, DEFAULT_NODE_FILE, SYSFS_ROOT_ENV,
};
pub use view::{ContainerView, RdmaDevice, ViewError};
