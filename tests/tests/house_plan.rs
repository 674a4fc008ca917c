//! The house plan (issue #46), held by the workspace as it is: no module circles in any
//! crate, the webhook, extender and fleet libraries on `api` alone, and kube-runtime only in
//! `railguard-kube` and the tests. The crate graph is `cargo metadata`'s (the real tool);
//! the module graph is read from the sources: every `crate::` and `super::` path outside
//! comments, strings and test modules, lifted to the siblings it joins (a module using its
//! parent's items is not a circle; `discover::pci` using `discover::fabric` and back is).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use railguard_tests::{rust_files, workspace_root};
use serde_json::Value;

/// `cargo metadata` of the workspace's own packages.
fn metadata() -> Value {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata JSON")
}

fn package<'a>(meta: &'a Value, name: &str) -> &'a Value {
    meta["packages"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no package {name}"))
}

/// The normal (not dev, not build) dependencies of `name`.
fn normal_dependencies(meta: &Value, name: &str) -> BTreeSet<String> {
    package(meta, name)["dependencies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["kind"].is_null())
        .filter_map(|d| d["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_pure_libraries_depend_on_api_alone_among_railguards_crates() {
    let meta = metadata();
    for lib in ["railguard-webhook", "railguard-extender", "railguard-fleet"] {
        let deps = normal_dependencies(&meta, lib);
        let ours: Vec<&String> = deps
            .iter()
            .filter(|d| d.starts_with("railguard-") && *d != "railguard-api")
            .collect();
        assert!(ours.is_empty(), "{lib} depends on {ours:?}");
        for io in [
            "kube", "tokio", "reqwest", "axum", "hyper", "clap", "anyhow",
        ] {
            assert!(!deps.contains(io), "{lib} depends on {io}: {deps:?}");
        }
    }
}

/// The source without comments, string contents and the trailing unit-test module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut in_str = false;
        let mut escaped = false;
        for c in line.chars() {
            match (in_str, escaped, c) {
                (true, true, _) => escaped = false,
                (true, false, '\\') => escaped = true,
                (true, false, '"') => in_str = false,
                (true, false, _) => {}
                (false, _, '"') => in_str = true,
                (false, _, _) => out.push(c),
            }
        }
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The module paths a source names: `crate::a::b::C` → `[a, b, C]`, `super::x` → relative to
/// `module`.
fn referenced_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let starts_word = i == 0 || !is_ident(bytes[i - 1] as char);
        let (base, j) = if starts_word && rest.starts_with("crate::") {
            (Vec::new(), i + "crate::".len())
        } else if starts_word && rest.starts_with("super::") {
            let mut j = i;
            let mut ups = 0;
            while code[j..].starts_with("super::") {
                ups += 1;
                j += "super::".len();
            }
            if ups > module.len() {
                i = j;
                continue;
            }
            (module[..module.len() - ups].to_vec(), j)
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let (end, paths) = path_at(code, j, base);
        out.extend(paths);
        i = end.max(i + 1);
    }
    out
}

/// The paths written at `code[j..]` below `base`: `a::b::C`, or a group `{a, b::{c, D}}`.
/// Returns where they end.
fn path_at(code: &str, mut j: usize, mut path: Vec<String>) -> (usize, Vec<Vec<String>>) {
    let bytes = code.as_bytes();
    loop {
        while j < code.len() && bytes[j].is_ascii_whitespace() {
            j += 1;
        }
        if code[j..].starts_with('{') {
            return group_at(code, j + 1, path);
        }
        let start = j;
        while j < code.len() && is_ident(bytes[j] as char) {
            j += 1;
        }
        if start == j {
            return (j, vec![path]);
        }
        path.push(code[start..j].to_string());
        if code[j..].starts_with("::") {
            j += 2;
        } else {
            return (j, vec![path]);
        }
    }
}

/// The paths of a `{...}` group starting after its `{`, each below `base`.
fn group_at(code: &str, mut j: usize, base: Vec<String>) -> (usize, Vec<Vec<String>>) {
    let mut out = Vec::new();
    loop {
        while j < code.len()
            && (code.as_bytes()[j].is_ascii_whitespace() || code.as_bytes()[j] == b',')
        {
            j += 1;
        }
        if j >= code.len() {
            return (j, out);
        }
        if code[j..].starts_with('}') {
            return (j + 1, out);
        }
        let (end, paths) = path_at(code, j, base.clone());
        out.extend(paths);
        // Skip what follows an item up to the next `,` or `}` (`as name`, `self`).
        j = end;
        while j < code.len() && !matches!(code.as_bytes()[j], b',' | b'}') {
            j += 1;
        }
    }
}

/// The module a source file is: `src/discover/pci.rs` → `[discover, pci]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
    {
        parts.pop();
    }
    parts
}

/// The module circles of one crate: strongly connected groups of sibling modules.
fn circles(src: &Path) -> Vec<Vec<String>> {
    let files = rust_files(src);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .into_iter()
        .filter(|f| !f.starts_with(src.join("bin")))
        .map(|f| (module_of(src, &f), f))
        .collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &modules {
        let last = module.last().map(String::as_str).unwrap_or("");
        if last == "tests" || last.ends_with("_tests") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for path in referenced_paths(&code_of(&text), module) {
            // The longest prefix that is a module of this crate.
            let target = (1..=path.len())
                .rev()
                .map(|k| path[..k].to_vec())
                .find(|p| modules.contains_key(p))
                .unwrap_or_default();
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common < module.len() && common < target.len() {
                edges
                    .entry(module[..=common].to_vec())
                    .or_default()
                    .insert(target[..=common].to_vec());
            }
        }
    }
    strongly_connected(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut names: Vec<String> = c.into_iter().map(|m| m.join("::")).collect();
            names.sort();
            names
        })
        .collect()
}

/// Tarjan's strongly connected components.
fn strongly_connected(
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> Vec<Vec<Vec<String>>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        out: Vec<Vec<Vec<String>>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Vec<String>) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                self.out.push(group);
            }
        }
    }
    let nodes: BTreeSet<&Vec<String>> = edges
        .iter()
        .flat_map(|(k, v)| std::iter::once(k).chain(v.iter()))
        .collect();
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.out
}

/// The source directories of the workspace's crates.
fn crate_sources(meta: &Value) -> Vec<(String, PathBuf)> {
    meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str()?);
            Some((
                p["name"].as_str()?.to_string(),
                manifest.parent()?.join("src"),
            ))
        })
        .collect()
}

#[test]
fn no_crate_has_a_module_circle() {
    let meta = metadata();
    let mut found = Vec::new();
    for (name, src) in crate_sources(&meta) {
        for circle in circles(&src) {
            found.push(format!("{name}: {}", circle.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "module circles:\n{}", found.join("\n"));
}

#[test]
fn the_circle_finder_sees_a_circle_between_siblings_and_not_a_child_using_its_parent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("discover")).expect("mkdir");
    std::fs::write(src.join("lib.rs"), "pub mod discover;\npub struct Root;\n").expect("write");
    std::fs::write(
        src.join("discover/mod.rs"),
        "mod fabric;\nmod pci;\npub use pci::Tree;\n",
    )
    .expect("write");
    std::fs::write(
        src.join("discover/pci.rs"),
        "// crate::discover::fabric in a comment is no edge\nuse super::fabric::Attr;\nuse crate::Root;\npub struct Tree;\n",
    )
    .expect("write");
    std::fs::write(
        src.join("discover/fabric.rs"),
        "pub struct Attr;\nconst DOC: &str = \"crate::discover::pci\";\n",
    )
    .expect("write");
    assert!(circles(src).is_empty(), "{:?}", circles(src));
    std::fs::write(
        src.join("discover/fabric.rs"),
        "pub struct Attr;\nfn f() -> crate::discover::pci::Tree { super::Tree }\n",
    )
    .expect("write");
    assert_eq!(
        circles(src),
        vec![vec![
            "discover::fabric".to_string(),
            "discover::pci".to_string()
        ]]
    );
}

#[test]
fn only_the_kubernetes_layer_and_the_tests_import_kube_runtime() {
    let meta = metadata();
    let mut found = Vec::new();
    for (name, src) in crate_sources(&meta) {
        if name == "railguard-kube" || name == "railguard-tests" {
            continue;
        }
        let files = rust_files(&src);
        for f in files {
            let code = code_of(&std::fs::read_to_string(&f).unwrap_or_default());
            if code.contains("kube::runtime") || code.contains("kube_runtime") {
                found.push(f.display().to_string());
            }
        }
    }
    assert!(found.is_empty(), "kube-runtime imported by {found:?}");
}
