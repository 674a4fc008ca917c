//! Which of the node's GPUs this process can see.
//!
//! `NVIDIA_VISIBLE_DEVICES` (set by the NVIDIA container runtime / device plugin) names host
//! GPUs by NVML index or UUID, or says `all`, `none`, `void`. `CUDA_VISIBLE_DEVICES` then
//! picks among those the container sees: indices count them in PCI bus order (NVML's order,
//! and CUDA's with `CUDA_DEVICE_ORDER=PCI_BUS_ID` or identical GPUs), UUIDs may be given by
//! a unique prefix, and CUDA ignores everything from the first entry it cannot resolve.

use std::collections::BTreeSet;

use crate::node_file::{normalize_pci_address, Gpu};

/// The result: the node GPUs (NVML indices) this process sees, and what was odd on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Visibility {
    pub visible: BTreeSet<u32>,
    pub notes: Vec<String>,
}

pub(crate) fn visible_gpus(gpus: &[Gpu], env: &dyn Fn(&str) -> Option<String>) -> Visibility {
    let mut notes = Vec::new();
    let mut exposed: Vec<&Gpu> = match env("NVIDIA_VISIBLE_DEVICES") {
        None => gpus.iter().collect(),
        Some(s) => match s.trim() {
            "all" => gpus.iter().collect(),
            "" | "none" | "void" => Vec::new(),
            list => {
                let mut out: Vec<&Gpu> = Vec::new();
                for entry in list.split(',').map(str::trim) {
                    let found = match entry.parse::<u32>() {
                        Ok(i) => gpus.iter().find(|g| g.index == i),
                        Err(_) => gpus.iter().find(|g| {
                            g.uuid
                                .as_deref()
                                .is_some_and(|u| u.eq_ignore_ascii_case(entry))
                        }),
                    };
                    match found {
                        Some(g) if !out.iter().any(|o| o.index == g.index) => out.push(g),
                        Some(_) => {}
                        None => notes.push(format!(
                            "NVIDIA_VISIBLE_DEVICES entry {entry:?} names no GPU of the node file"
                        )),
                    }
                }
                out
            }
        },
    };
    exposed.sort_by_key(|g| {
        (
            g.pci_bus_id.as_deref().and_then(normalize_pci_address),
            g.index,
        )
    });
    let Some(cuda) = env("CUDA_VISIBLE_DEVICES") else {
        return Visibility {
            visible: exposed.iter().map(|g| g.index).collect(),
            notes,
        };
    };
    let mut visible = BTreeSet::new();
    for entry in cuda.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let found = if let Ok(i) = entry.parse::<usize>() {
            exposed.get(i).copied()
        } else if entry.len() > 4 && entry[..4].eq_ignore_ascii_case("GPU-") {
            let want = entry.to_ascii_lowercase();
            let mut hits = exposed.iter().filter(|g| {
                g.uuid
                    .as_deref()
                    .is_some_and(|u| u.to_ascii_lowercase().starts_with(&want))
            });
            match (hits.next(), hits.next()) {
                (Some(g), None) => Some(*g),
                _ => None,
            }
        } else {
            None
        };
        match found {
            Some(g) => {
                visible.insert(g.index);
            }
            None => {
                notes.push(format!(
                    "CUDA_VISIBLE_DEVICES entry {entry:?} names no GPU this container sees; \
                     CUDA ignores it and the entries after it"
                ));
                break;
            }
        }
    }
    Visibility { visible, notes }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str, bus: &str) -> Gpu {
        Gpu {
            index,
            uuid: Some(uuid.into()),
            pci_bus_id: Some(bus.into()),
            rail: None,
        }
    }

    fn node_gpus() -> Vec<Gpu> {
        // Listed out of PCI order on purpose: CUDA indices follow the bus, not the file.
        vec![
            gpu(2, "GPU-cccc-2", "0000:5d:00.0"),
            gpu(0, "GPU-aaaa-0", "0000:19:00.0"),
            gpu(1, "GPU-bbbb-1", "00000000:3B:00.0"),
            gpu(3, "GPU-dddd-3", "0000:9a:00.0"),
        ]
    }

    fn run(vars: &[(&str, &str)]) -> Visibility {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        visible_gpus(&node_gpus(), &|k| {
            vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    fn set(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn nothing_set_or_all_means_every_gpu() {
        assert_eq!(run(&[]).visible, set(&[0, 1, 2, 3]));
        assert_eq!(
            run(&[("NVIDIA_VISIBLE_DEVICES", "all")]).visible,
            set(&[0, 1, 2, 3])
        );
    }

    #[test]
    fn none_void_and_empty_mean_no_gpu() {
        for v in ["none", "void", ""] {
            assert_eq!(
                run(&[("NVIDIA_VISIBLE_DEVICES", v)]).visible,
                set(&[]),
                "{v}"
            );
        }
        assert_eq!(run(&[("CUDA_VISIBLE_DEVICES", "")]).visible, set(&[]));
    }

    #[test]
    fn nvidia_visible_devices_by_host_index_and_by_uuid() {
        assert_eq!(
            run(&[("NVIDIA_VISIBLE_DEVICES", "3,1")]).visible,
            set(&[1, 3])
        );
        assert_eq!(
            run(&[("NVIDIA_VISIBLE_DEVICES", "GPU-cccc-2, gpu-aaaa-0")]).visible,
            set(&[0, 2])
        );
        let v = run(&[("NVIDIA_VISIBLE_DEVICES", "GPU-zzzz,1")]);
        assert_eq!(v.visible, set(&[1]));
        assert_eq!(
            v.notes,
            ["NVIDIA_VISIBLE_DEVICES entry \"GPU-zzzz\" names no GPU of the node file"]
        );
    }

    #[test]
    fn cuda_indices_count_the_exposed_gpus_in_pci_order() {
        // Exposed: host GPUs 3 and 1; in bus order 1 (3b) then 3 (9a), so CUDA 1 is host 3.
        assert_eq!(
            run(&[
                ("NVIDIA_VISIBLE_DEVICES", "GPU-dddd-3,GPU-bbbb-1"),
                ("CUDA_VISIBLE_DEVICES", "1")
            ])
            .visible,
            set(&[3])
        );
        // Without NVIDIA_VISIBLE_DEVICES, bus order of all: 0 (19), 1 (3b), 2 (5d), 3 (9a).
        assert_eq!(
            run(&[("CUDA_VISIBLE_DEVICES", "2,0")]).visible,
            set(&[0, 2])
        );
    }

    #[test]
    fn cuda_uuids_by_unique_prefix() {
        assert_eq!(
            run(&[("CUDA_VISIBLE_DEVICES", "GPU-cccc")]).visible,
            set(&[2])
        );
        // "GPU-" alone would match every GPU: it names none.
        assert_eq!(run(&[("CUDA_VISIBLE_DEVICES", "GPU-")]).visible, set(&[]));
    }

    #[test]
    fn cuda_stops_at_the_first_entry_it_cannot_resolve() {
        let v = run(&[
            ("NVIDIA_VISIBLE_DEVICES", "0,1"),
            ("CUDA_VISIBLE_DEVICES", "1,7,0"),
        ]);
        assert_eq!(v.visible, set(&[1]));
        assert_eq!(
            v.notes,
            ["CUDA_VISIBLE_DEVICES entry \"7\" names no GPU this container sees; CUDA ignores it and the entries after it"]
        );
        // A GPU outside NVIDIA_VISIBLE_DEVICES is not there to pick, even by UUID.
        assert_eq!(
            run(&[
                ("NVIDIA_VISIBLE_DEVICES", "0"),
                ("CUDA_VISIBLE_DEVICES", "GPU-dddd-3")
            ])
            .visible,
            set(&[])
        );
    }
}
