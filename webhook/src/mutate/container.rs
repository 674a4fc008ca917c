//! One target container as the patch leaves it. Every step changes a container through a
//! [`Shadow`], which writes the JSON-patch operation against the container as the earlier
//! steps left it (so two steps adding env to a container without any never both create the
//! list) and applies the same change to its typed copy (which the preflight init container
//! copies).

use std::collections::BTreeMap;

use crate::json_text::{JsonText, Object};
use crate::patch::{child, pointer, PatchOp};
use jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, ResourceRequirements, SecurityContext, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

pub(crate) const IPC_LOCK: &str = "IPC_LOCK";

/// A target container: where it is in the pod and what the parts steps read and edit look
/// like after the steps so far.
#[derive(Clone, Debug)]
pub(crate) struct Shadow {
    base: PointerBuf,
    /// The container's name, env, resources, mounts and security context; nothing else (image,
    /// command, probes, ports) is read by a step or the preflight container, so it is not
    /// copied.
    pub(crate) container: Container,
}

impl Shadow {
    pub(crate) fn new(index: usize, container: &Container) -> Self {
        let idx = index.to_string();
        Self {
            base: pointer(["spec", "containers", idx.as_str()]),
            container: Container {
                name: container.name.clone(),
                env: container.env.clone(),
                resources: container.resources.clone(),
                volume_mounts: container.volume_mounts.clone(),
                security_context: container.security_context.clone(),
                ..Container::default()
            },
        }
    }

    /// Appends plain `name=value` variables.
    pub(crate) fn add_env(&mut self, vars: Vec<EnvVar>, ops: &mut Vec<PatchOp>) {
        if vars.is_empty() {
            return;
        }
        let write = |o: &mut Object<'_>, e: &EnvVar| {
            o.str("name", &e.name)
                .str("value", e.value.as_deref().unwrap_or_default());
        };
        match &self.container.env {
            None => ops.push(PatchOp::add(
                child(&self.base, ["env"]),
                JsonText::array(|a| {
                    for v in &vars {
                        a.object(|o| write(o, v));
                    }
                }),
            )),
            Some(_) => {
                for v in &vars {
                    ops.push(PatchOp::add(
                        child(&self.base, ["env", "-"]),
                        JsonText::object(|o| write(o, v)),
                    ));
                }
            }
        }
        self.container.env.get_or_insert_with(Vec::new).extend(vars);
    }

    /// Adds a capability to `securityContext.capabilities.add`, creating what is missing.
    pub(crate) fn add_capability(&mut self, cap: &str, ops: &mut Vec<PatchOp>) {
        let sc = self.container.security_context.as_ref();
        let caps = sc.and_then(|s| s.capabilities.as_ref());
        let add = |o: &mut Object<'_>| {
            o.array("add", |a| {
                a.str(cap);
            });
        };
        ops.push(match (sc, caps, caps.and_then(|c| c.add.as_ref())) {
            (None, _, _) => PatchOp::add(
                child(&self.base, ["securityContext"]),
                JsonText::object(|o| {
                    o.object("capabilities", add);
                }),
            ),
            (Some(_), None, _) => PatchOp::add(
                child(&self.base, ["securityContext", "capabilities"]),
                JsonText::object(add),
            ),
            (Some(_), Some(_), None) => PatchOp::add(
                child(&self.base, ["securityContext", "capabilities", "add"]),
                JsonText::array(|a| {
                    a.str(cap);
                }),
            ),
            (Some(_), Some(_), Some(_)) => PatchOp::add(
                child(&self.base, ["securityContext", "capabilities", "add", "-"]),
                JsonText::string(cap),
            ),
        });
        self.container
            .security_context
            .get_or_insert_with(SecurityContext::default)
            .capabilities
            .get_or_insert_with(Capabilities::default)
            .add
            .get_or_insert_with(Vec::new)
            .push(cap.to_string());
    }

    /// Mounts volume `name` at `path`.
    pub(crate) fn add_mount(&mut self, name: &str, path: &str, ops: &mut Vec<PatchOp>) {
        self.mount(name, path, false, ops);
    }

    /// Mounts volume `name` at `path`, read-only.
    pub(crate) fn add_read_only_mount(&mut self, name: &str, path: &str, ops: &mut Vec<PatchOp>) {
        self.mount(name, path, true, ops);
    }

    fn mount(&mut self, name: &str, path: &str, read_only: bool, ops: &mut Vec<PatchOp>) {
        let mount = |o: &mut Object<'_>| {
            o.str("name", name).str("mountPath", path);
            if read_only {
                o.bool("readOnly", true);
            }
        };
        ops.push(match &self.container.volume_mounts {
            None => PatchOp::add(
                child(&self.base, ["volumeMounts"]),
                JsonText::array(|a| {
                    a.object(mount);
                }),
            ),
            Some(_) => PatchOp::add(
                child(&self.base, ["volumeMounts", "-"]),
                JsonText::object(mount),
            ),
        });
        self.container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: name.to_string(),
                mount_path: path.to_string(),
                read_only: read_only.then_some(true),
                ..Default::default()
            });
    }

    /// Requests and limits `count` of an extended resource (they must be equal).
    pub(crate) fn add_extended_resource(
        &mut self,
        resource: &str,
        count: u64,
        ops: &mut Vec<PatchOp>,
    ) {
        let n = count.to_string();
        let quantity = |o: &mut Object<'_>| {
            o.str(resource, &n);
        };
        match &self.container.resources {
            None => ops.push(PatchOp::add(
                child(&self.base, ["resources"]),
                JsonText::object(|o| {
                    o.object("limits", quantity).object("requests", quantity);
                }),
            )),
            Some(r) => {
                for (field, map) in [("limits", &r.limits), ("requests", &r.requests)] {
                    ops.push(match map {
                        None => PatchOp::add(
                            child(&self.base, ["resources", field]),
                            JsonText::object(quantity),
                        ),
                        Some(_) => PatchOp::add(
                            child(&self.base, ["resources", field, resource]),
                            JsonText::string(&n),
                        ),
                    });
                }
            }
        }
        let r = self
            .container
            .resources
            .get_or_insert_with(ResourceRequirements::default);
        for map in [&mut r.limits, &mut r.requests] {
            map.get_or_insert_with(BTreeMap::new)
                .insert(resource.to_string(), Quantity(n.clone()));
        }
    }
}

/// A plain `name=value` variable.
pub(crate) fn env_var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        value_from: None,
    }
}

pub(crate) fn find_env<'c>(c: &'c Container, name: &str) -> Option<&'c EnvVar> {
    c.env.iter().flatten().find(|e| e.name == name)
}

/// Whether the container names the resource at all (a `0` the user wrote counts: it is
/// theirs, and an `add` would overwrite it).
pub(crate) fn has_resource(c: &Container, name: &str) -> bool {
    c.resources.as_ref().is_some_and(|r| {
        r.limits.as_ref().is_some_and(|m| m.contains_key(name))
            || r.requests.as_ref().is_some_and(|m| m.contains_key(name))
    })
}

/// Privileged, or IPC_LOCK (either spelling) added.
pub(crate) fn has_ipc_lock(c: &Container) -> bool {
    let Some(sc) = &c.security_context else {
        return false;
    };
    sc.privileged.unwrap_or(false)
        || sc
            .capabilities
            .as_ref()
            .and_then(|caps| caps.add.as_ref())
            .is_some_and(|add| add.iter().any(|a| a == IPC_LOCK || a == "CAP_IPC_LOCK"))
}

/// The container's `/dev/shm` mount, if any.
pub(crate) fn dev_shm_mount(c: &Container) -> Option<&VolumeMount> {
    c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path.trim_end_matches('/') == "/dev/shm")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::{json, Value};

    use super::*;

    fn container(v: Value) -> Container {
        serde_json::from_value(v).unwrap()
    }

    /// Applies the ops to the container as a pod and checks that the parts a shadow keeps
    /// equal the typed shadow.
    fn check(original: &Container, shadow: &Shadow, ops: &[PatchOp]) {
        let mut doc = json!({"spec": {"containers": [serde_json::to_value(original).unwrap()]}});
        json_patch::patch(&mut doc, &crate::patch::to_patch(ops.to_vec())).unwrap();
        let patched: Container =
            serde_json::from_value(doc["spec"]["containers"][0].clone()).unwrap();
        assert_eq!(Shadow::new(0, &patched).container, shadow.container);
    }

    #[test]
    fn two_env_additions_create_the_list_once() {
        let c = container(json!({"name": "c"}));
        let mut s = Shadow::new(0, &c);
        let mut ops = Vec::new();
        s.add_env(vec![env_var("A", "1")], &mut ops);
        s.add_env(vec![env_var("B", "2")], &mut ops);
        s.add_env(Vec::new(), &mut ops);
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[1].path().as_str(), "/spec/containers/0/env/-");
        check(&c, &s, &ops);
    }

    #[test]
    fn capabilities_resources_and_mounts_fill_in_what_is_missing() {
        for c in [
            container(json!({"name": "c", "image": "trainer:1", "command": ["torchrun"]})),
            container(
                json!({"name": "c", "securityContext": {}, "resources": {}, "volumeMounts": []}),
            ),
            container(json!({"name": "c", "securityContext": {"capabilities": {}},
                "resources": {"limits": {"x/y": "1"}}})),
            container(
                json!({"name": "c", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}},
                "resources": {"limits": {"x/y": "1"}, "requests": {"x/y": "1"}}}),
            ),
        ] {
            let mut s = Shadow::new(0, &c);
            let mut ops = Vec::new();
            s.add_capability(IPC_LOCK, &mut ops);
            s.add_extended_resource("rdma/a", 2, &mut ops);
            s.add_mount("v", "/dev/shm", &mut ops);
            check(&c, &s, &ops);
            assert!(has_ipc_lock(&s.container));
            assert!(has_resource(&s.container, "rdma/a"));
            assert_eq!(dev_shm_mount(&s.container).unwrap().name, "v");
        }
    }

    #[test]
    fn privileged_counts_as_ipc_lock_and_a_zero_resource_is_present() {
        let c = container(json!({"name": "c", "securityContext": {"privileged": true},
            "resources": {"requests": {"rdma/a": "0"}}}));
        assert!(has_ipc_lock(&c));
        assert!(has_resource(&c, "rdma/a"));
        assert!(dev_shm_mount(&c).is_none());
    }
}
