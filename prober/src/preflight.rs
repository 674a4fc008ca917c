//! `railguard-prober preflight`: the in-pod check the webhook adds as an init container.
//! Inside the training container's view it checks that the RDMA devices of the HCAs in
//! `NCCL_IB_HCA` exist (sysfs entry and `/dev/infiniband/uverbsN`), that locked memory is
//! unlimited or IPC_LOCK is effective, that `/dev/shm` is large enough, and that `/sys`
//! shows the RDMA topology — and fails fast with one clear message instead of letting NCCL
//! hang at init. The decision is a pure function over [`PreflightInputs`].

use std::collections::BTreeMap;
use std::path::Path;

use railguard_api::keys::env::{NCCL_IB_HCA, SHM_SIZE};
use railguard_api::profile::parse_ib_hca;
use railguard_api::quantity::parse_bytes;

/// Without an expected size, anything under this is the container runtime's 64 MiB default
/// that makes NCCL's shared-memory transport fail.
pub const MIN_SHM_BYTES: u64 = 1 << 30;

/// What the container can see, gathered by [`gather`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PreflightInputs {
    /// Environment of the container (only `NCCL_*` and `RAILGUARD_*` matter).
    pub env: BTreeMap<String, String>,
    /// RDMA devices under `/sys/class/infiniband`, with their uverbs char device name.
    pub rdma_devices: BTreeMap<String, Option<String>>,
    /// Char devices present under `/dev/infiniband`.
    pub dev_infiniband: Vec<String>,
    /// Soft RLIMIT_MEMLOCK in bytes; `None` = unlimited.
    pub memlock_bytes: Option<u64>,
    /// CAP_IPC_LOCK in the effective set.
    pub ipc_lock_effective: bool,
    /// Size of the filesystem at `/dev/shm`, if it could be read.
    pub shm_bytes: Option<u64>,
}

/// One check's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreflightCheck {
    pub name: &'static str,
    pub ok: bool,
    pub message: String,
}

/// Runs every check. Pure.
pub fn check(inputs: &PreflightInputs) -> Vec<PreflightCheck> {
    let mut out = Vec::new();
    let mut push = |name, ok, message: String| out.push(PreflightCheck { name, ok, message });

    // RDMA devices named by NCCL_IB_HCA.
    match inputs.env.get(NCCL_IB_HCA) {
        None => push(
            "nccl-env",
            false,
            "NCCL_IB_HCA is not set; NCCL would pick HCAs on its own".into(),
        ),
        Some(v) => match parse_ib_hca(v) {
            Err(e) => push("nccl-env", false, format!("NCCL_IB_HCA is malformed: {e}")),
            Ok(list) if list.exclude => push(
                "nccl-env",
                true,
                format!("NCCL_IB_HCA={v} excludes HCAs; not checked"),
            ),
            Ok(list) => {
                let mut missing = Vec::new();
                let mut no_dev = Vec::new();
                for e in &list.entries {
                    match inputs.rdma_devices.get(&e.hca) {
                        None => missing.push(e.hca.clone()),
                        Some(Some(uverbs)) if !inputs.dev_infiniband.contains(uverbs) => {
                            no_dev.push(format!("{} (/dev/infiniband/{uverbs})", e.hca))
                        }
                        Some(None) => no_dev.push(format!("{} (no uverbs device)", e.hca)),
                        Some(Some(_)) => {}
                    }
                }
                if inputs.rdma_devices.is_empty() {
                    push(
                        "topology",
                        false,
                        "/sys/class/infiniband is empty: the pod sees no RDMA devices (RDMA resource not requested?)".into(),
                    );
                } else {
                    push(
                        "topology",
                        true,
                        format!("{} RDMA devices visible", inputs.rdma_devices.len()),
                    );
                }
                if !missing.is_empty() {
                    push(
                        "hca",
                        false,
                        format!(
                            "NCCL_IB_HCA names {} but the pod cannot see them",
                            missing.join(",")
                        ),
                    );
                } else if !no_dev.is_empty() {
                    push(
                        "hca",
                        false,
                        format!(
                            "device files missing for {}: request the RDMA resource",
                            no_dev.join(", ")
                        ),
                    );
                } else {
                    push(
                        "hca",
                        true,
                        format!("all {} HCAs of NCCL_IB_HCA are usable", list.entries.len()),
                    );
                }
                if !list.exact {
                    push(
                        "nccl-env",
                        true,
                        "NCCL_IB_HCA is a prefix match; the exact form (=) is safer".into(),
                    );
                } else {
                    push(
                        "nccl-env",
                        true,
                        "NCCL_IB_HCA uses the exact-match form".into(),
                    );
                }
            }
        },
    }

    // Locked memory: RDMA registers (pins) buffers.
    match (inputs.memlock_bytes, inputs.ipc_lock_effective) {
        (None, _) => push("memlock", true, "locked memory is unlimited".into()),
        (Some(_), true) => push("memlock", true, "CAP_IPC_LOCK is effective".into()),
        (Some(b), false) => push(
            "memlock",
            false,
            format!("locked memory is limited to {} KiB and IPC_LOCK is not effective: ibv_reg_mr will fail", b / 1024),
        ),
    }

    // /dev/shm.
    let want = match inputs.env.get(SHM_SIZE) {
        Some(s) => match parse_bytes(s) {
            Ok(b) => u64::try_from(b).unwrap_or(u64::MAX),
            Err(e) => {
                push("shm", false, format!("{SHM_SIZE}: {e}"));
                return out;
            }
        },
        None => MIN_SHM_BYTES,
    };
    match inputs.shm_bytes {
        None => push("shm", false, "/dev/shm is not mounted".into()),
        Some(have) if have < want => push(
            "shm",
            false,
            format!(
                "/dev/shm is {} MiB, needs at least {} MiB (NCCL's SHM transport fails)",
                have >> 20,
                want >> 20
            ),
        ),
        Some(have) => push("shm", true, format!("/dev/shm is {} MiB", have >> 20)),
    }
    out
}

/// The environment variables preflight reads (the webhook injects them).
pub const ENV_READ: &[&str] = &[NCCL_IB_HCA, SHM_SIZE];

/// The part of a process environment preflight reads ([`ENV_READ`]).
pub fn env_of(vars: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, String> {
    vars.into_iter()
        .filter(|(k, _)| ENV_READ.contains(&k.as_str()))
        .collect()
}

/// Reads the inputs from the container (`root` is `/` except in tests).
pub fn gather(root: &Path, env: BTreeMap<String, String>) -> PreflightInputs {
    let ib = root.join("sys/class/infiniband");
    let mut rdma_devices = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(&ib) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let uverbs = std::fs::read_dir(e.path().join("device/infiniband_verbs"))
                .ok()
                .and_then(|mut d| d.next())
                .and_then(|d| d.ok())
                .map(|d| d.file_name().to_string_lossy().into_owned());
            rdma_devices.insert(name, uverbs);
        }
    }
    let dev_infiniband = std::fs::read_dir(root.join("dev/infiniband"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let memlock_bytes =
        match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK) {
            Ok((soft, _)) if soft == nix::sys::resource::RLIM_INFINITY => None,
            Ok((soft, _)) => Some(soft),
            Err(_) => Some(0),
        };
    let ipc_lock_effective = std::fs::read_to_string(root.join("proc/self/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:").map(|v| v.trim().to_string()))
        })
        .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0);
    let shm_bytes = nix::sys::statvfs::statvfs(&root.join("dev/shm"))
        .ok()
        .map(|s| s.blocks().saturating_mul(s.fragment_size()));
    PreflightInputs {
        env,
        rdma_devices,
        dev_infiniband,
        memlock_bytes,
        ipc_lock_effective,
        shm_bytes,
    }
}

/// The JSON printed by `preflight --json`.
#[derive(Debug, serde::Serialize)]
pub struct PreflightReport<'a> {
    /// Every check passed.
    pub passed: bool,
    /// The first failed check's message (what the text output ends with).
    pub failure: Option<&'a str>,
    pub checks: Vec<PreflightCheckJson<'a>>,
}

/// One check in [`PreflightReport`].
#[derive(Debug, serde::Serialize)]
pub struct PreflightCheckJson<'a> {
    pub name: &'a str,
    pub ok: bool,
    pub message: &'a str,
}

/// Whether every check passed.
pub fn passed(checks: &[PreflightCheck]) -> bool {
    checks.iter().all(|c| c.ok)
}

/// The report of `checks`: the table (ending with the verdict line) or JSON. Pure.
pub fn render(checks: &[PreflightCheck], json: bool) -> Result<String, serde_json::Error> {
    let failure = checks.iter().find(|c| !c.ok).map(|c| c.message.as_str());
    if json {
        let report = PreflightReport {
            passed: failure.is_none(),
            failure,
            checks: checks
                .iter()
                .map(|c| PreflightCheckJson {
                    name: c.name,
                    ok: c.ok,
                    message: &c.message,
                })
                .collect(),
        };
        return Ok(serde_json::to_string_pretty(&report)? + "\n");
    }
    let mut text = String::new();
    for c in checks {
        text.push_str(&format!(
            "{:<4} {:<9} {}\n",
            if c.ok { "ok" } else { "FAIL" },
            c.name,
            c.message
        ));
    }
    match failure {
        Some(m) => text.push_str(&format!("railguard preflight failed: {m}\n")),
        None => text.push_str("railguard preflight passed\n"),
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> PreflightInputs {
        PreflightInputs {
            env: BTreeMap::from([("NCCL_IB_HCA".to_string(), "=mlx5_0:1,mlx5_3:1".to_string())]),
            rdma_devices: BTreeMap::from([
                ("mlx5_0".to_string(), Some("uverbs0".to_string())),
                ("mlx5_3".to_string(), Some("uverbs3".to_string())),
            ]),
            dev_infiniband: vec!["uverbs0".into(), "uverbs3".into(), "rdma_cm".into()],
            memlock_bytes: None,
            ipc_lock_effective: false,
            shm_bytes: Some(64 << 30),
        }
    }

    fn failed(i: &PreflightInputs) -> Vec<(&'static str, String)> {
        check(i)
            .into_iter()
            .filter(|c| !c.ok)
            .map(|c| (c.name, c.message))
            .collect()
    }

    #[test]
    fn a_well_configured_container_passes() {
        assert!(failed(&good()).is_empty(), "{:?}", failed(&good()));
    }

    #[test]
    fn each_misconfiguration_names_its_fix() {
        let mut i = good();
        i.rdma_devices.remove("mlx5_3");
        assert_eq!(
            failed(&i)[0].1,
            "NCCL_IB_HCA names mlx5_3 but the pod cannot see them"
        );

        let mut i = good();
        i.dev_infiniband.retain(|d| d != "uverbs3");
        assert!(
            failed(&i)[0].1.contains("mlx5_3 (/dev/infiniband/uverbs3)"),
            "{:?}",
            failed(&i)
        );

        let mut i = good();
        i.rdma_devices.clear();
        assert!(failed(&i)
            .iter()
            .any(|(n, m)| *n == "topology" && m.contains("no RDMA devices")));

        let mut i = good();
        i.memlock_bytes = Some(64 * 1024);
        assert!(failed(&i)[0].1.contains("limited to 64 KiB"));
        i.ipc_lock_effective = true;
        assert!(failed(&i).is_empty());

        let mut i = good();
        i.shm_bytes = Some(64 << 20);
        assert_eq!(
            failed(&i)[0].1,
            "/dev/shm is 64 MiB, needs at least 1024 MiB (NCCL's SHM transport fails)"
        );
        i.env.insert("RAILGUARD_SHM_SIZE".into(), "32Mi".into());
        assert!(failed(&i).is_empty());
        i.env.insert("RAILGUARD_SHM_SIZE".into(), "lots".into());
        assert!(failed(&i)[0].1.contains("RAILGUARD_SHM_SIZE"));

        let mut i = good();
        i.env.remove("NCCL_IB_HCA");
        assert!(failed(&i)[0].1.contains("NCCL_IB_HCA is not set"));
        i.env.insert("NCCL_IB_HCA".into(), "=mlx5_0:x".into());
        assert!(failed(&i)[0].1.contains("malformed"));
    }

    #[test]
    fn the_report_is_a_table_or_json_and_says_whether_it_failed() {
        let mut i = good();
        i.memlock_bytes = Some(64 * 1024);
        i.shm_bytes = Some(64 << 20);
        let text = render(&check(&i), false).unwrap();
        assert!(!passed(&check(&i)));
        assert!(text.contains("FAIL memlock"), "{text}");
        // The last line is the first failure: what an init container's log ends with.
        assert!(text.ends_with(
            "railguard preflight failed: locked memory is limited to 64 KiB and IPC_LOCK is not effective: ibv_reg_mr will fail\n"
        ), "{text}");
        let json = render(&check(&i), true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["checks", "failure", "passed"]);
        assert_eq!(v["passed"], false);
        assert_eq!(v["checks"].as_array().unwrap().len(), check(&i).len());
        let text = render(&check(&good()), false).unwrap();
        assert!(passed(&check(&good())));
        assert!(text.ends_with("railguard preflight passed\n"));
    }

    #[test]
    fn gather_reads_a_fake_container_view() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(
            root.join("sys/class/infiniband/mlx5_0/device/infiniband_verbs/uverbs0"),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("dev/infiniband")).unwrap();
        std::fs::write(root.join("dev/infiniband/uverbs0"), "").unwrap();
        std::fs::create_dir_all(root.join("dev/shm")).unwrap();
        std::fs::create_dir_all(root.join("proc/self")).unwrap();
        std::fs::write(
            root.join("proc/self/status"),
            "Name:\tx\nCapEff:\t0000000000004000\n",
        )
        .unwrap();
        let env = BTreeMap::from([("NCCL_IB_HCA".to_string(), "=mlx5_0:1".to_string())]);
        let i = gather(root, env);
        assert_eq!(
            i.rdma_devices.get("mlx5_0"),
            Some(&Some("uverbs0".to_string()))
        );
        assert_eq!(i.dev_infiniband, vec!["uverbs0".to_string()]);
        assert!(i.ipc_lock_effective);
        assert!(i.shm_bytes.is_some());
        let hca = check(&i).into_iter().find(|c| c.name == "hca").unwrap();
        assert!(hca.ok, "{hca:?}");
    }
}
