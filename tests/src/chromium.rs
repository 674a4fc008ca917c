//! Headless Chromium for the tests of the pages railguard writes (the fleet report): the DOM
//! the browser built from a file, and a screenshot of it.
//!
//! The browser is `$RAILGUARD_CHROMIUM`, else `chromium` or `chromium-browser` on `PATH`
//! (Debian's package `chromium`, installed by `tests/scripts/install-deps.sh`). Every run
//! gets its own profile directory, so runs neither share state nor touch `$HOME`.

use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The environment variable naming the browser binary.
pub const CHROMIUM_ENV: &str = "RAILGUARD_CHROMIUM";

/// A cold start on a busy two-core machine takes seconds; this is for a hung browser only.
pub const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(180);

/// The browser: `$RAILGUARD_CHROMIUM`, else the first of `chromium`, `chromium-browser` on
/// `PATH`.
pub fn find() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(CHROMIUM_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!(
            "{CHROMIUM_ENV}={} is not a file (install Debian's chromium package, or point \
             {CHROMIUM_ENV} at a Chromium binary)",
            p.display()
        );
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["chromium", "chromium-browser"] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    bail!(
        "no chromium or chromium-browser on PATH and {CHROMIUM_ENV} unset: install Debian's \
         chromium package (tests/scripts/install-deps.sh does) or set {CHROMIUM_ENV}"
    )
}

/// The DOM Chromium built from `html` (`--dump-dom`), serialized.
pub fn dump_dom(html: &Path) -> Result<String> {
    let out = run(html, &["--dump-dom".to_string()])?;
    let dom = String::from_utf8(out).context("chromium's --dump-dom is not UTF-8")?;
    if dom.trim().is_empty() {
        bail!("chromium dumped an empty DOM for {}", html.display());
    }
    Ok(dom)
}

/// A `width` × `height` PNG of `html` at `png`.
pub fn screenshot(html: &Path, png: &Path, width: u32, height: u32) -> Result<()> {
    let png = absolute(png)?;
    run(
        html,
        &[
            format!("--screenshot={}", png.display()),
            format!("--window-size={width},{height}"),
            "--hide-scrollbars".to_string(),
        ],
    )?;
    let len = std::fs::metadata(&png)
        .with_context(|| format!("chromium wrote no screenshot at {}", png.display()))?
        .len();
    if len == 0 {
        bail!("chromium wrote an empty screenshot at {}", png.display());
    }
    Ok(())
}

fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(p))
    }
}

/// `file://` URL of an existing file, its path percent-encoded.
pub fn file_url(path: &Path) -> Result<String> {
    let path = path
        .canonicalize()
        .with_context(|| format!("no page at {}", path.display()))?;
    let mut url = String::from("file://");
    for b in path.as_os_str().as_encoded_bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                url.push(char::from(*b))
            }
            _ => url.push_str(&format!("%{b:02X}")),
        }
    }
    Ok(url)
}

/// Runs the browser headless on `html` with `extra` flags; its stdout. Output goes to files
/// (a large DOM would fill a pipe), and a browser past [`CHROMIUM_TIMEOUT`] is killed with
/// its whole process group (renderer, zygote).
fn run(html: &Path, extra: &[String]) -> Result<Vec<u8>> {
    let browser = find()?;
    let url = file_url(html)?;
    let work = tempfile::tempdir().context("temp dir for chromium")?;
    let stdout_path = work.path().join("stdout");
    let stderr_path = work.path().join("stderr");
    let mut child = Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-dev-shm-usage",
            "--disable-extensions",
            "--disable-background-networking",
        ])
        .arg(format!(
            "--user-data-dir={}",
            work.path().join("profile").display()
        ))
        .args(extra)
        .arg(&url)
        .current_dir(work.path())
        .stdin(Stdio::null())
        .stdout(File::create(&stdout_path)?)
        .stderr(File::create(&stderr_path)?)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", browser.display()))?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > CHROMIUM_TIMEOUT {
            // The negative pid is the group process_group(0) made.
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            bail!(
                "{} did not finish {url} within {CHROMIUM_TIMEOUT:?}; stderr:\n{}",
                browser.display(),
                tail(&stderr_path)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if !status.success() {
        bail!(
            "{} {url} failed ({status}); stderr:\n{}",
            browser.display(),
            tail(&stderr_path)
        );
    }
    std::fs::read(&stdout_path).context("reading chromium's output")
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
