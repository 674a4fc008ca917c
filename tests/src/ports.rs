//! Ports for the servers the tests start, with no window in which another process can take
//! one between choosing it and the server binding it.
//!
//! Two ways, by what the server can do:
//! - railguard's own binaries bind port 0 and log the address the kernel gave them
//!   (`railguard_runtime::bind`'s `listening` line); [`logged_listen_addr`] reads it back.
//! - etcd and the Kubernetes components need their port on the command line. A
//!   [`PortLease`] is a port below the kernel's ephemeral range, so no client socket is ever
//!   given it, and held by no other lease in any process (a lock file per port, released
//!   when the lease drops). [`wait_bound`] tells a server that bound its ports from one that
//!   found a port in use, by reading which ports the process itself listens on
//!   (`/proc/<pid>/fd` against `/proc/net/tcp`), so the caller can start it again on new
//!   ports ([`PORT_ATTEMPTS`] times, each retry logged).
//!
//! `tests/tests/harness_ports.rs` searches the harness for the old pattern (bind port 0,
//! read the port, close the socket, hand the number to a server) and fails where it finds it.

use std::collections::HashSet;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Starts of a server on fresh ports before a port conflict is a failure.
pub const PORT_ATTEMPTS: usize = 5;

/// The lowest port handed out; below it are well-known and registered services (the real
/// node's kubelet on 10250, kube-proxy on 10249/10256).
const LEASE_FLOOR: u16 = 20000;

/// A port reserved for one server of this test run. Dropping it releases the reservation.
#[derive(Debug)]
pub struct PortLease {
    port: u16,
    _lock: File,
}

impl PortLease {
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// Where the lock files live: one directory for every railguard test process on the machine.
fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("railguard-port-leases")
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`), 32768 if unreadable.
fn ephemeral_floor() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// Reserves a port in `[LEASE_FLOOR, ephemeral floor)` that no other lease holds. The start
/// is random so that processes rarely probe the same lock files.
pub fn lease_port() -> Result<PortLease> {
    let (lo, hi) = (LEASE_FLOOR, ephemeral_floor().max(LEASE_FLOOR + 1000));
    let dir = lock_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let span = u32::from(hi - lo);
    let start = rand::random::<u32>() % span;
    for i in 0..span {
        let port = lo + ((start + i) % span) as u16;
        let path = dir.join(format!("{port}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        // flock conflicts between open files even within one process, so two leases of one
        // process never share a port either.
        if file.try_lock().is_ok() && !listening_ports_any().contains(&port) {
            return Ok(PortLease { port, _lock: file });
        }
    }
    bail!("no port in {lo}..{hi} is free of leases and listeners")
}

/// `count` leases at once (a server that needs several ports).
pub fn lease_ports(count: usize) -> Result<Vec<PortLease>> {
    (0..count).map(|_| lease_port()).collect()
}

/// One `/proc/net/tcp{,6}` row in the LISTEN state: (local port, socket inode).
fn listen_rows() -> Vec<(u16, u64)> {
    let mut rows = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        rows.extend(text.lines().skip(1).filter_map(parse_listen_row));
    }
    rows
}

/// `  0: 0100007F:9C41 00000000:0000 0A ... inode ...`: the local port is hex after the
/// colon, state `0A` is LISTEN, the inode is the tenth column.
fn parse_listen_row(line: &str) -> Option<(u16, u64)> {
    let cols: Vec<&str> = line.split_whitespace().collect();
    if cols.get(3) != Some(&"0A") {
        return None;
    }
    let port = u16::from_str_radix(cols.get(1)?.rsplit(':').next()?, 16).ok()?;
    let inode = cols.get(9)?.parse().ok()?;
    Some((port, inode))
}

/// Ports anything in this network namespace listens on.
fn listening_ports_any() -> HashSet<u16> {
    listen_rows().into_iter().map(|(p, _)| p).collect()
}

/// Ports process `pid` itself listens on (its sockets among the LISTEN rows).
pub fn listening_ports_of(pid: u32) -> HashSet<u16> {
    let mut inodes = HashSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|s| s.parse::<u64>().ok())
            {
                inodes.insert(inode);
            }
        }
    }
    listen_rows()
        .into_iter()
        .filter(|(_, inode)| inodes.contains(inode))
        .map(|(port, _)| port)
        .collect()
}

/// How a server start on given ports ended.
#[derive(Debug)]
pub enum Bound {
    /// The process listens on every port.
    Listening,
    /// It exited saying a port was in use: start it again on new ports.
    PortInUse(String),
    /// It exited for another reason.
    Exited(ExitStatus),
}

/// The line of `log` that says a port was taken, if any.
pub fn port_in_use_line(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .find(|l| l.contains("address already in use"))
        .map(|l| l.chars().take(300).collect())
}

/// Waits until `child` listens on every one of `ports`, or exits; fails after `timeout`
/// naming the ports it did and did not yet listen on.
pub async fn wait_bound(
    child: &mut Child,
    ports: &[u16],
    log: &Path,
    timeout: Duration,
) -> Result<Bound> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(match port_in_use_line(log) {
                Some(line) => Bound::PortInUse(line),
                None => Bound::Exited(status),
            });
        }
        let held = listening_ports_of(child.id());
        if ports.iter().all(|p| held.contains(p)) {
            return Ok(Bound::Listening);
        }
        if start.elapsed() > timeout {
            let missing: Vec<_> = ports.iter().filter(|p| !held.contains(p)).collect();
            bail!(
                "process {} listens on {held:?} but not yet on {missing:?} after {timeout:?}; see {}",
                child.id(),
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Logs one retry of a server start on new ports.
pub fn log_port_retry(what: &str, attempt: usize, ports: &[u16], line: &str) {
    eprintln!(
        "railguard-tests: {what} could not bind {ports:?} (attempt {attempt}/{PORT_ATTEMPTS}): {line}; starting it again on new ports"
    );
}

/// A child process of either kind, asked whether it has exited.
pub trait ChildStatus {
    fn exited(&mut self) -> std::io::Result<Option<ExitStatus>>;
}

impl ChildStatus for Child {
    fn exited(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.try_wait()
    }
}

impl ChildStatus for tokio::process::Child {
    fn exited(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.try_wait()
    }
}

/// Waits until the railguard binary `child`, logging to `log`, says where its `flag` listener
/// listens (it was given port 0); fails at once if it exits, and after `timeout` with the
/// log's last lines.
pub async fn logged_listen_addr(
    child: &mut impl ChildStatus,
    log: &Path,
    flag: &str,
    timeout: Duration,
) -> Result<SocketAddr> {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(addr) = railguard_runtime::logged_listen_addr(&text, flag) {
            return Ok(addr);
        }
        if let Some(status) = child.exited()? {
            bail!(
                "{} exited with {status} before listening ({flag}); its log ends:\n{}",
                log.display(),
                tail(&text, 20)
            );
        }
        if start.elapsed() > timeout {
            bail!(
                "no `listening` line for {flag} in {} after {timeout:?}; its log ends:\n{}",
                log.display(),
                tail(&text, 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What a railguard binary under test is told to listen on: port 0, so the kernel chooses
/// and nothing can take the port between choosing and binding; [`logged_listen_addr`] reads
/// the address back from its log.
pub const ANY_LOOPBACK_PORT: &str = "127.0.0.1:0";

/// Starts `cmd` (a railguard server) with `--listen` and `--metrics-listen` on loopback port
/// 0, its output to `log`, and waits until it says where both listen: the child, its listen
/// address and its metrics address. A server that never says so is killed.
pub async fn spawn_serving(
    cmd: &mut std::process::Command,
    log: &Path,
    timeout: Duration,
) -> Result<(Child, SocketAddr, SocketAddr)> {
    let out = std::fs::File::create(log)?;
    let mut child = cmd
        .arg(format!("--listen={}", ANY_LOOPBACK_PORT))
        .arg(format!("--metrics-listen={}", ANY_LOOPBACK_PORT))
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()?;
    let addrs = async {
        let listen = logged_listen_addr(&mut child, log, "--listen", timeout).await?;
        let metrics = logged_listen_addr(&mut child, log, "--metrics-listen", timeout).await?;
        Ok::<_, anyhow::Error>((listen, metrics))
    }
    .await;
    match addrs {
        Ok((listen, metrics)) => Ok((child, listen, metrics)),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_listen_rows_of_proc_net_tcp() {
        let row = "   3: 0100007F:9C41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 100 0 0 10 0";
        assert_eq!(parse_listen_row(row), Some((0x9C41, 123456)));
        let established = "   4: 0100007F:9C41 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 123457 1";
        assert_eq!(parse_listen_row(established), None);
    }

    #[test]
    fn a_listener_of_this_process_is_seen_and_leases_avoid_it() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listening_ports_of(std::process::id()).contains(&port));
        let a = lease_port().unwrap();
        let b = lease_port().unwrap();
        assert_ne!(a.port(), b.port());
        assert!(a.port() >= LEASE_FLOOR && a.port() < ephemeral_floor().max(LEASE_FLOOR + 1000));
        drop(l);
    }
}
