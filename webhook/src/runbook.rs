//! The runbook's unsafe NCCL settings, found in a pod's literal env values.

use k8s_openapi::api::core::v1::Container;
use railguard_api::profile::parse_ib_hca;

/// NCCL's default `NCCL_IB_TIMEOUT` (since 2.14); higher values hide a flapping rail.
pub const DEFAULT_IB_TIMEOUT: u32 = 20;
/// NCCL's default `NCCL_IB_RETRY_CNT`.
pub const DEFAULT_IB_RETRY_CNT: u32 = 7;

/// One unsafe setting, already phrased for an admission warning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub container: String,
    pub variable: &'static str,
    pub message: String,
}

/// Checks every literal env value of the containers against the runbook.
pub fn scan<'a>(containers: impl IntoIterator<Item = &'a Container>) -> Vec<Finding> {
    let mut out = Vec::new();
    for c in containers {
        for e in c.env.iter().flatten() {
            let Some(value) = e.value.as_deref() else {
                continue;
            };
            if let Some((variable, message)) = check(&e.name, value.trim()) {
                out.push(Finding {
                    container: c.name.clone(),
                    variable,
                    message: format!("container {}: {message}", c.name),
                });
            }
        }
    }
    out
}

fn check(name: &str, value: &str) -> Option<(&'static str, String)> {
    Some(match name {
        "NCCL_DEBUG" => (
            "NCCL_DEBUG",
            format!("NCCL_DEBUG={value} persisted; keep debug logging out of production manifests"),
        ),
        "NCCL_DEBUG_SUBSYS" => (
            "NCCL_DEBUG_SUBSYS",
            "NCCL_DEBUG_SUBSYS persisted; keep debug logging out of production manifests".into(),
        ),
        "NCCL_NET_GDR_LEVEL" if value.eq_ignore_ascii_case("SYS") => (
            "NCCL_NET_GDR_LEVEL",
            "NCCL_NET_GDR_LEVEL=SYS forces GPUDirect across the CPU interconnect; leave it unset"
                .into(),
        ),
        "NCCL_IB_TIMEOUT" => match value.parse::<u32>() {
            Ok(v) if v > DEFAULT_IB_TIMEOUT => (
                "NCCL_IB_TIMEOUT",
                format!("NCCL_IB_TIMEOUT={v} above default {DEFAULT_IB_TIMEOUT} hides a bad rail; fix the rail"),
            ),
            Ok(_) => return None,
            Err(_) => ("NCCL_IB_TIMEOUT", format!("NCCL_IB_TIMEOUT={value:?} is not a number")),
        },
        "NCCL_IB_RETRY_CNT" => match value.parse::<u32>() {
            Ok(v) if v > DEFAULT_IB_RETRY_CNT => (
                "NCCL_IB_RETRY_CNT",
                format!("NCCL_IB_RETRY_CNT={v} above default {DEFAULT_IB_RETRY_CNT} hides a bad rail; fix the rail"),
            ),
            Ok(_) => return None,
            Err(_) => ("NCCL_IB_RETRY_CNT", format!("NCCL_IB_RETRY_CNT={value:?} is not a number")),
        },
        "NCCL_IB_GID_INDEX" => (
            "NCCL_IB_GID_INDEX",
            format!("NCCL_IB_GID_INDEX={value} hard-coded; leave it unset unless proven on this fabric"),
        ),
        "NCCL_NET" if value.eq_ignore_ascii_case("Socket") => (
            "NCCL_NET",
            "NCCL_NET=Socket turns RDMA off; training traffic falls back to TCP".into(),
        ),
        "NCCL_IB_HCA" if !is_exact(value) => (
            "NCCL_IB_HCA",
            "NCCL_IB_HCA is a prefix match; use the exact form =mlx5_0:1,...".into(),
        ),
        "NCCL_SOCKET_IFNAME" if !is_exact(value) => (
            "NCCL_SOCKET_IFNAME",
            "NCCL_SOCKET_IFNAME is a prefix match; use the exact form =eth0".into(),
        ),
        _ => return None,
    })
}

/// `=x` or `^=x`: NCCL's exact-match forms.
fn is_exact(value: &str) -> bool {
    match parse_ib_hca(value) {
        Ok(list) => list.exact,
        // Interface names need not be HCA-shaped; fall back to the prefix test.
        Err(_) => value.starts_with('=') || value.starts_with("^="),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::EnvVar;

    fn container(env: &[(&str, &str)]) -> Container {
        Container {
            name: "trainer".into(),
            env: Some(
                env.iter()
                    .map(|(k, v)| EnvVar {
                        name: k.to_string(),
                        value: Some(v.to_string()),
                        value_from: None,
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn vars(env: &[(&str, &str)]) -> Vec<&'static str> {
        scan([&container(env)]).iter().map(|f| f.variable).collect()
    }

    #[test]
    fn every_runbook_rule_fires() {
        assert_eq!(vars(&[("NCCL_DEBUG", "INFO")]), ["NCCL_DEBUG"]);
        assert_eq!(
            vars(&[("NCCL_DEBUG_SUBSYS", "INIT,NET")]),
            ["NCCL_DEBUG_SUBSYS"]
        );
        assert_eq!(
            vars(&[("NCCL_NET_GDR_LEVEL", "sys")]),
            ["NCCL_NET_GDR_LEVEL"]
        );
        assert_eq!(vars(&[("NCCL_IB_TIMEOUT", "23")]), ["NCCL_IB_TIMEOUT"]);
        assert_eq!(vars(&[("NCCL_IB_RETRY_CNT", "13")]), ["NCCL_IB_RETRY_CNT"]);
        assert_eq!(vars(&[("NCCL_IB_GID_INDEX", "3")]), ["NCCL_IB_GID_INDEX"]);
        assert_eq!(vars(&[("NCCL_NET", "Socket")]), ["NCCL_NET"]);
        assert_eq!(vars(&[("NCCL_IB_HCA", "mlx5")]), ["NCCL_IB_HCA"]);
        assert_eq!(
            vars(&[("NCCL_SOCKET_IFNAME", "eth")]),
            ["NCCL_SOCKET_IFNAME"]
        );
    }

    #[test]
    fn safe_values_pass() {
        assert!(vars(&[
            ("NCCL_NET_GDR_LEVEL", "PHB"),
            ("NCCL_IB_TIMEOUT", "20"),
            ("NCCL_IB_RETRY_CNT", "7"),
            ("NCCL_NET", "IB"),
            ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_3:1"),
            ("NCCL_SOCKET_IFNAME", "=eth0"),
            ("NCCL_IB_QPS_PER_CONNECTION", "4"),
        ])
        .is_empty());
    }

    #[test]
    fn messages_name_the_container_and_stay_short() {
        let f = scan([&container(&[("NCCL_IB_TIMEOUT", "not-a-number")])]);
        assert_eq!(f.len(), 1);
        assert!(f[0]
            .message
            .starts_with("container trainer: NCCL_IB_TIMEOUT"));
        assert!(f[0].message.contains("not a number"));
        assert!(f[0].message.chars().count() < 120);
    }
}
