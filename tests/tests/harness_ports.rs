//! No test harness chooses a port by binding port 0, reading the port and closing the socket
//! before a server binds it: between the close and the bind any other process (a test of the
//! same binary running in parallel, a client given an ephemeral port) can take it, which is
//! how `kube-apiserver` once failed CI with "address already in use". Servers get port 0 and
//! report what they bound, or a leased port with a retry (`tests/src/ports.rs`).
//!
//! The search covers the harness (`tests/src`, `tests/tests`) and every crate's `tests/` and
//! `benches/`: a `TcpListener` bound to port 0 whose variable is used for nothing but its
//! address (so it is dropped and the port handed on), a bind chained straight into
//! `local_addr()`, and any helper named like the old `free_port`/`free_addr`.

#![allow(clippy::unwrap_used)] // a test: a failure stops it where it happens

use std::path::{Path, PathBuf};

use railguard_tests::{rust_files, workspace_root};

/// Where the pattern is found: `path:line: text`.
fn bind_then_close(path: &Path, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let at = |why: &str| format!("{}:{}: {why}: {}", path.display(), i + 1, line.trim());
        if line.contains("fn free_port") || line.contains("fn free_addr") {
            found.push(at("a port-picking helper"));
            continue;
        }
        if !line.contains("TcpListener::bind(") || !binds_port_zero(line) {
            continue;
        }
        if line.contains("local_addr()") {
            found.push(at("bound and read in one expression"));
            continue;
        }
        let Some(name) = let_name(line) else {
            continue;
        };
        // The rest of the enclosing block: the lines indented at least as far as the `let`.
        let indent = line.len() - line.trim_start().len();
        let rest = lines[i + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent)
            .copied()
            .collect::<Vec<_>>()
            .join("\n");
        if !used_beyond_its_address(&rest, &name) {
            found.push(at("a listener used only for its port"));
        }
    }
    found
}

fn binds_port_zero(line: &str) -> bool {
    line.contains(":0\"") || line.contains(":0\")") || line.contains(", 0)")
}

/// `NAME` of `let NAME = ...` / `let mut NAME = ...` on the line.
fn let_name(line: &str) -> Option<String> {
    let after = line.trim_start().strip_prefix("let ")?;
    let after = after.strip_prefix("mut ").unwrap_or(after);
    let name: String = after
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Whether `name` appears in `text` other than as `name.local_addr()`.
fn used_beyond_its_address(text: &str, name: &str) -> bool {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(pos) = text[from..].find(name) {
        let start = from + pos;
        let end = start + name.len();
        from = end;
        let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let bounded =
            (start == 0 || !ident(bytes[start - 1])) && (end == bytes.len() || !ident(bytes[end]));
        if bounded && !text[end..].starts_with(".local_addr()") {
            return true;
        }
    }
    false
}

/// The harness: this crate's sources and tests, and every crate's `tests/` and `benches/`.
fn harness_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = rust_files(&root.join("tests/src"));
    files.extend(rust_files(&root.join("tests/tests")));
    for krate in [
        "api",
        "runtime",
        "kube",
        "webhook",
        "webhook/cli",
        "extender",
        "extender/cli",
        "prober",
        "prober/cli",
        "campaign",
        "fleet",
        "sim",
        "gpu",
    ] {
        for sub in ["tests", "benches"] {
            files.extend(rust_files(&root.join(krate).join(sub)));
        }
    }
    files
}

#[test]
fn no_harness_picks_a_port_by_binding_and_closing_it() {
    let files = harness_files();
    assert!(
        files.len() > 40,
        "the search found only {} files",
        files.len()
    );
    let me = Path::new(file!()).file_name().map(|n| n.to_os_string());
    let found: Vec<String> = files
        .iter()
        .filter(|p| p.file_name().map(|n| n.to_os_string()) != me)
        .flat_map(|p| bind_then_close(p, &std::fs::read_to_string(p).unwrap_or_default()))
        .collect();
    assert!(
        found.is_empty(),
        "bind-then-close ports left:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_search_finds_the_old_patterns_and_spares_listeners_that_are_handed_on() {
    let p = Path::new("x.rs");
    let old = "fn free_port() -> u16 {\n    let l = TcpListener::bind(\"127.0.0.1:0\").unwrap();\n    l.local_addr().unwrap().port()\n}\n";
    assert_eq!(
        bind_then_close(p, old).len(),
        2,
        "{:?}",
        bind_then_close(p, old)
    );
    let block = "    let addr = {\n        let l = std::net::TcpListener::bind(\"127.0.0.1:0\")?;\n        l.local_addr()?.to_string()\n    };\n    spawn(&addr);\n";
    assert_eq!(bind_then_close(p, block).len(), 1);
    let chained = "    let port = TcpListener::bind((\"127.0.0.1\", 0)).unwrap().local_addr().unwrap().port();\n";
    assert_eq!(bind_then_close(p, chained).len(), 1);
    let handed_on = "fn serve() {\n    let listener = TcpListener::bind(\"127.0.0.1:0\").unwrap();\n    let url = listener.local_addr().unwrap();\n    spawn_serve(listener, router);\n}\n";
    assert!(bind_then_close(p, handed_on).is_empty());
    let held = "fn taken() -> (TcpListener, String) {\n    let l = TcpListener::bind(\"127.0.0.1:0\").unwrap();\n    let addr = l.local_addr().unwrap().to_string();\n    (l, addr)\n}\n";
    assert!(bind_then_close(p, held).is_empty());
}

/// etcd (the control planes' first server) started on `client` and `peer`, logging to `log`.
fn etcd(client: u16, peer: u16, dir: &Path, log: &Path) -> std::process::Child {
    let out = std::fs::File::create(log).unwrap();
    std::process::Command::new("etcd")
        .arg("--data-dir")
        .arg(dir.join("etcd"))
        .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
        ))
        .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}"))
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// The retry's two outcomes, with the real etcd: a port another process holds is seen as
/// "in use" (start again), leased free ports as listening by that very process.
#[tokio::test]
async fn a_taken_port_is_told_apart_from_a_bound_one() {
    use railguard_tests::ports::{lease_ports, wait_bound, Bound};
    let dir = tempfile::tempdir().unwrap();
    let leases = lease_ports(3).unwrap();
    let (taken, peer, other) = (leases[0].port(), leases[1].port(), leases[2].port());
    let holder = std::net::TcpListener::bind(("127.0.0.1", taken)).unwrap();
    let log = dir.path().join("taken.log");
    let mut child = etcd(taken, peer, dir.path(), &log);
    let timeout = std::time::Duration::from_secs(60);
    match wait_bound(&mut child, &[taken, peer], &log, timeout)
        .await
        .unwrap()
    {
        Bound::PortInUse(line) => assert!(line.contains("address already in use"), "{line}"),
        other => panic!("etcd on a held port: {other:?}"),
    }
    drop(holder);

    let log = dir.path().join("free.log");
    let _ = std::fs::remove_dir_all(dir.path().join("etcd"));
    let mut child = etcd(other, peer, dir.path(), &log);
    let bound = wait_bound(&mut child, &[other, peer], &log, timeout).await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(matches!(bound, Ok(Bound::Listening)), "{bound:?}");
}
