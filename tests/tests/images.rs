//! Real OCI images of railguard's components, built with buildah by
//! tests/scripts/build-images.sh, against `docker/<component>.Dockerfile`: each image's
//! ENTRYPOINT, USER and exposed ports equal what the Dockerfile's runtime stage (the stage a
//! plain `docker build` ends in) declares, read here by a parser of this file's own, and
//! every binary runs inside its image's rootfs (chroot), which proves each shared library it
//! needs is in the image. Needs root (buildah's overlay storage, chroot).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use anyhow::{anyhow, ensure, Context, Result};
use railguard_tests::{workspace_binary, workspace_root};
use serde_json::Value;

// --- Dockerfile runtime stage ---------------------------------------------------------------

/// What the runtime stage of a Dockerfile declares.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RuntimeStage {
    /// The first stage of the `FROM <alias>` chain the last stage resolves to: its alias, or
    /// its 0-based index when it has none (what `docker build --target` takes).
    stage: String,
    /// ENTRYPOINT, exec (JSON) form.
    entrypoint: Vec<String>,
    user: String,
    /// EXPOSE ports of the chain as `port/proto` (`tcp` when not written).
    exposed: BTreeSet<String>,
    /// (source, destination) of every COPY in the chain, in order.
    copies: Vec<(String, String)>,
}

impl RuntimeStage {
    /// Where the stage puts a file named `name` (the COPY whose source ends in it).
    fn copy_destination(&self, name: &str) -> Option<String> {
        self.copies.iter().find_map(|(src, dest)| {
            (src.rsplit('/').next() == Some(name)).then(|| {
                if dest.ends_with('/') {
                    format!("{dest}{name}")
                } else {
                    dest.clone()
                }
            })
        })
    }
}

#[derive(Debug, Default)]
struct Stage {
    base: String,
    alias: Option<String>,
    entrypoint: Option<String>,
    user: Option<String>,
    expose: Vec<String>,
    copies: Vec<(String, String)>,
}

fn normalize_port(port: &str) -> String {
    if port.contains('/') {
        port.to_ascii_lowercase()
    } else {
        format!("{port}/tcp")
    }
}

/// The instructions of a Dockerfile: comment lines dropped, continuation lines joined.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.trim_start().starts_with('#') {
            continue;
        }
        let trimmed = line.trim_end();
        if let Some(head) = trimmed.strip_suffix('\\') {
            buf.push_str(head);
            buf.push(' ');
            continue;
        }
        buf.push_str(line);
        let instr = std::mem::take(&mut buf);
        let instr = instr.trim();
        if instr.is_empty() {
            continue;
        }
        let (kw, rest) = instr.split_once(char::is_whitespace).unwrap_or((instr, ""));
        out.push((kw.to_ascii_uppercase(), rest.trim().to_string()));
    }
    let rest = buf.trim();
    if !rest.is_empty() {
        let (kw, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        out.push((kw.to_ascii_uppercase(), args.trim().to_string()));
    }
    out
}

/// Parses a Dockerfile and resolves its runtime stage: the last stage, then the stage its
/// `FROM` names (by alias), and so on; instructions apply from the first stage of that
/// chain on (ENTRYPOINT and USER: the last one wins; EXPOSE and COPY: accumulate).
fn runtime_stage(text: &str) -> Result<RuntimeStage> {
    let mut stages: Vec<Stage> = Vec::new();
    for (kw, rest) in instructions(text) {
        let words: Vec<&str> = rest.split_whitespace().collect();
        let args: Vec<&str> = words
            .iter()
            .copied()
            .skip_while(|w| w.starts_with("--"))
            .collect();
        if kw == "FROM" {
            let base = args
                .first()
                .ok_or_else(|| anyhow!("FROM without an image"))?;
            let alias = match args.get(1) {
                Some(a) if a.eq_ignore_ascii_case("as") => Some(
                    args.get(2)
                        .ok_or_else(|| anyhow!("FROM {base} AS without a name"))?
                        .to_ascii_lowercase(),
                ),
                _ => None,
            };
            stages.push(Stage {
                base: base.to_ascii_lowercase(),
                alias,
                ..Stage::default()
            });
            continue;
        }
        let Some(stage) = stages.last_mut() else {
            // ARG before the first FROM
            continue;
        };
        match kw.as_str() {
            "ENTRYPOINT" => stage.entrypoint = Some(rest),
            "USER" => stage.user = Some(rest),
            "EXPOSE" => stage.expose.extend(words.iter().map(|p| normalize_port(p))),
            "COPY" => {
                if let Some((dest, sources)) = args.split_last() {
                    for src in sources {
                        stage.copies.push((src.to_string(), dest.to_string()));
                    }
                }
            }
            _ => {}
        }
    }
    ensure!(!stages.is_empty(), "no FROM instruction");
    let mut chain = vec![stages.len() - 1];
    loop {
        let cur = chain[chain.len() - 1];
        let base = &stages[cur].base;
        match (0..cur)
            .rev()
            .find(|&k| stages[k].alias.as_deref() == Some(base.as_str()))
        {
            Some(k) => chain.push(k),
            None => break,
        }
    }
    let first = chain[chain.len() - 1];
    let name = stages[first]
        .alias
        .clone()
        .unwrap_or_else(|| first.to_string());
    let (mut entrypoint, mut user) = (None, None);
    let mut exposed = BTreeSet::new();
    let mut copies = Vec::new();
    for &i in chain.iter().rev() {
        let s = &stages[i];
        if s.entrypoint.is_some() {
            entrypoint.clone_from(&s.entrypoint);
        }
        if s.user.is_some() {
            user.clone_from(&s.user);
        }
        exposed.extend(s.expose.iter().cloned());
        copies.extend(s.copies.iter().cloned());
    }
    let entrypoint = entrypoint.ok_or_else(|| anyhow!("stage {name}: no ENTRYPOINT"))?;
    let entrypoint: Vec<String> = serde_json::from_str(&entrypoint).with_context(|| {
        format!("stage {name}: ENTRYPOINT {entrypoint} is not exec (JSON) form")
    })?;
    let user = user.ok_or_else(|| anyhow!("stage {name}: no USER"))?;
    Ok(RuntimeStage {
        stage: name,
        entrypoint,
        user,
        exposed,
        copies,
    })
}

fn dockerfile_stage(component: &str) -> Result<RuntimeStage> {
    let path = workspace_root().join(format!("docker/{component}.Dockerfile"));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    runtime_stage(&text).with_context(|| format!("{}", path.display()))
}

// --- the script -----------------------------------------------------------------------------

fn script() -> PathBuf {
    workspace_root().join("tests/scripts/build-images.sh")
}

/// The script's own reading of a Dockerfile (`build-images.sh --runtime-stage`).
fn script_stage(dockerfile: &Path) -> Result<RuntimeStage> {
    let out = Command::new("bash")
        .arg(script())
        .arg("--runtime-stage")
        .arg(dockerfile)
        .output()
        .context("running build-images.sh --runtime-stage")?;
    ensure!(
        out.status.success(),
        "build-images.sh --runtime-stage {} failed: {}",
        dockerfile.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut kv = BTreeMap::new();
    let mut copies = Vec::new();
    for line in text.lines() {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| anyhow!("unexpected line {line:?}"))?;
        if k == "copy" {
            let (src, dest) = v
                .split_once(' ')
                .ok_or_else(|| anyhow!("unexpected line {line:?}"))?;
            copies.push((src.to_string(), dest.to_string()));
        } else {
            kv.insert(k.to_string(), v.to_string());
        }
    }
    let get = |k: &str| {
        kv.get(k)
            .cloned()
            .ok_or_else(|| anyhow!("no {k}= in {text:?}"))
    };
    Ok(RuntimeStage {
        stage: get("stage")?,
        entrypoint: serde_json::from_str(&get("entrypoint")?)?,
        user: get("user")?,
        exposed: get("expose")?
            .split_whitespace()
            .map(normalize_port)
            .collect(),
        copies,
    })
}

fn is_root() -> Result<bool> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or_else(|| anyhow!("no Uid: in /proc/self/status"))?;
    Ok(uid == "0")
}

/// Directory holding kube-scheduler, if one is there: `RAILGUARD_KUBE_BIN_DIR` (then it must
/// be), else the control plane cache that tests/scripts/control-plane.sh fills.
fn kube_bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("RAILGUARD_KUBE_BIN_DIR") {
        return Some(PathBuf::from(dir));
    }
    let cache = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok()?;
    let dir = cache.join("railguard/kube-1.20");
    dir.join("kube-scheduler").is_file().then_some(dir)
}

fn run_script(
    out_dir: &Path,
    bin_dir: &Path,
    kube: Option<&Path>,
    images: &[&str],
) -> Result<String> {
    let mut cmd = Command::new("bash");
    cmd.arg(script())
        .arg(out_dir)
        .args(images)
        .env("RAILGUARD_BIN_DIR", bin_dir);
    if let Some(kube) = kube {
        cmd.env("RAILGUARD_KUBE_BIN_DIR", kube);
    }
    let out = cmd.output().context("running build-images.sh")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "build-images.sh failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

// --- OCI archives ---------------------------------------------------------------------------

struct Image {
    /// `config` of the image config blob (Entrypoint, User, ExposedPorts, Env, ...).
    config: Value,
    rootfs: PathBuf,
}

fn tar_extract(archive: &Path, into: &Path) -> Result<()> {
    std::fs::create_dir_all(into)?;
    let out = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .output()
        .context("running tar")?;
    ensure!(
        out.status.success(),
        "tar -xf {} failed: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn blob(oci: &Path, digest: &str) -> Result<PathBuf> {
    let (alg, hex) = digest
        .split_once(':')
        .ok_or_else(|| anyhow!("bad digest {digest}"))?;
    Ok(oci.join("blobs").join(alg).join(hex))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Unpacks an OCI archive: index.json -> the manifest named `reference` -> config and layers
/// (layers extracted in order into `<work>/rootfs`).
fn open_archive(archive: &Path, reference: &str, work: &Path) -> Result<Image> {
    let oci = work.join("oci");
    tar_extract(archive, &oci)?;
    let index = read_json(&oci.join("index.json"))?;
    let manifests = index["manifests"]
        .as_array()
        .ok_or_else(|| anyhow!("index.json has no manifests"))?;
    let names: Vec<&str> = manifests
        .iter()
        .filter_map(|m| m["annotations"]["org.opencontainers.image.ref.name"].as_str())
        .collect();
    let entry = manifests
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == reference)
        .ok_or_else(|| {
            anyhow!(
                "{} holds no {reference} (it holds {names:?})",
                archive.display()
            )
        })?;
    let digest = entry["digest"].as_str().unwrap_or_default();
    let manifest = read_json(&blob(&oci, digest)?)?;
    let config_digest = manifest["config"]["digest"].as_str().unwrap_or_default();
    let config = read_json(&blob(&oci, config_digest)?)?;
    ensure!(config["os"] == "linux", "image os is {}", config["os"]);
    let rootfs = work.join("rootfs");
    std::fs::create_dir_all(&rootfs)?;
    let layers = manifest["layers"]
        .as_array()
        .ok_or_else(|| anyhow!("manifest has no layers"))?;
    ensure!(!layers.is_empty(), "image has no layers");
    for layer in layers {
        tar_extract(
            &blob(&oci, layer["digest"].as_str().unwrap_or_default())?,
            &rootfs,
        )?;
    }
    Ok(Image {
        config: config["config"].clone(),
        rootfs,
    })
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `args` inside `rootfs` with chroot and an empty environment (only PATH).
fn chroot(rootfs: &Path, args: &[&str]) -> Result<Output> {
    // Looked up here: the child's PATH (set below) is the one inside the rootfs.
    let chroot = ["/usr/sbin/chroot", "/sbin/chroot", "/usr/bin/chroot"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .unwrap_or("chroot");
    Command::new(chroot)
        .arg(rootfs)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .with_context(|| format!("chroot {} {args:?}", rootfs.display()))
}

const LOADER_ERROR: &str = "error while loading shared libraries";

fn mode(path: &Path) -> Result<u32> {
    use std::os::unix::fs::PermissionsExt;
    Ok(std::fs::symlink_metadata(path)
        .with_context(|| format!("{}", path.display()))?
        .permissions()
        .mode()
        & 0o7777)
}

/// The uid-65532 line of `/etc/passwd` and of `/etc/group` name `name`.
fn check_users(rootfs: &Path, name: &str) -> Result<()> {
    for file in ["etc/passwd", "etc/group"] {
        let text = std::fs::read_to_string(rootfs.join(file))?;
        let line = text
            .lines()
            .find(|l| l.split(':').nth(2) == Some("65532"))
            .ok_or_else(|| anyhow!("/{file} has no id 65532:\n{text}"))?;
        ensure!(
            line.starts_with(&format!("{name}:")),
            "/{file}: 65532 is {line:?}, not {name}"
        );
        ensure!(
            text.lines().any(|l| l.starts_with("root:x:0:")),
            "/{file} has no root"
        );
    }
    Ok(())
}

/// The image of a railguard component equals its Dockerfile's runtime stage, and its binary
/// runs in the image's rootfs.
fn check_railguard_image(
    work: &Path,
    archive: &Path,
    reference: &str,
    component: &str,
    binary: &str,
    user_name: &str,
) -> Result<Image> {
    let want = dockerfile_stage(component)?;
    let image = open_archive(archive, reference, work)?;
    let cfg = &image.config;
    let ctx = format!(
        "{reference} vs docker/{component}.Dockerfile stage {}",
        want.stage
    );
    ensure!(
        strings(&cfg["Entrypoint"]) == want.entrypoint,
        "{ctx}: Entrypoint {} != {:?}",
        cfg["Entrypoint"],
        want.entrypoint
    );
    ensure!(
        cfg["User"].as_str() == Some(want.user.as_str()),
        "{ctx}: User {} != {}",
        cfg["User"],
        want.user
    );
    let exposed: BTreeSet<String> = cfg["ExposedPorts"]
        .as_object()
        .map(|m| m.keys().map(|p| normalize_port(p)).collect())
        .unwrap_or_default();
    ensure!(
        exposed == want.exposed,
        "{ctx}: ExposedPorts {exposed:?} != EXPOSE {:?}",
        want.exposed
    );
    let dest = want
        .copy_destination(binary)
        .ok_or_else(|| anyhow!("{ctx}: the stage copies no {binary}"))?;
    ensure!(
        dest == format!("/usr/local/bin/{binary}"),
        "{ctx}: {binary} goes to {dest}"
    );
    ensure!(
        want.entrypoint.first() == Some(&dest),
        "{ctx}: the entrypoint is not {dest}"
    );
    let bin = image.rootfs.join(dest.trim_start_matches('/'));
    ensure!(
        mode(&bin)? & 0o111 != 0,
        "{ctx}: {} is not executable",
        bin.display()
    );
    check_users(&image.rootfs, user_name).with_context(|| ctx.clone())?;
    ensure!(
        mode(&image.rootfs.join("tmp"))? == 0o1777,
        "{ctx}: /tmp is not 1777"
    );
    if Path::new("/etc/ssl/certs/ca-certificates.crt").is_file() {
        ensure!(
            image
                .rootfs
                .join("etc/ssl/certs/ca-certificates.crt")
                .is_file(),
            "{ctx}: no CA certificates"
        );
    }

    let out = chroot(&image.rootfs, &[&dest, "--version"])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() && stdout.contains(binary),
        "{ctx}: {dest} --version in the rootfs: {}\n{stdout}{stderr}",
        out.status
    );
    ensure!(
        stdout.contains(env!("CARGO_PKG_VERSION")),
        "{ctx}: {dest} --version printed {stdout:?}"
    );
    Ok(image)
}

/// rdma-core's userspace and the prober's discovery in the prober's rootfs.
fn check_prober_rootfs(rootfs: &Path, ctx: &str) -> Result<()> {
    ensure!(
        rootfs.join("etc/libibverbs.d/mlx5.driver").is_file(),
        "{ctx}: no /etc/libibverbs.d/mlx5.driver"
    );
    let providers = rootfs.join("usr/lib/x86_64-linux-gnu/libibverbs");
    let has_mlx5 = std::fs::read_dir(&providers)
        .with_context(|| format!("{ctx}: {}", providers.display()))?
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with("libmlx5-"));
    ensure!(
        has_mlx5,
        "{ctx}: no mlx5 provider in {}",
        providers.display()
    );
    // libibverbs dlopens its providers at run time; the image's loader resolves each
    // provider's own libraries inside the rootfs.
    let loader = "/lib64/ld-linux-x86-64.so.2";
    for entry in std::fs::read_dir(&providers)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let provider = format!("/usr/lib/x86_64-linux-gnu/libibverbs/{name}");
        let out = chroot(rootfs, &[loader, "--list", &provider])?;
        let listed = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && !listed.contains("not found"),
            "{ctx}: {loader} --list {provider}: {}\n{listed}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every provider's own libraries are there: loading one with the image's loader works.
    let out = chroot(
        rootfs,
        &[
            "/usr/local/bin/railguard-prober",
            "discover",
            "--sysfs-root",
            "/",
        ],
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !stderr.contains(LOADER_ERROR),
        "{ctx}: discover in the rootfs: {stderr}"
    );
    Ok(())
}

/// The image's own loader finds every library the shared object `dest` needs.
fn check_loader_resolves(rootfs: &Path, dest: &str, ctx: &str) -> Result<()> {
    let out = chroot(rootfs, &["/lib64/ld-linux-x86-64.so.2", "--list", dest])?;
    let listed = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && !listed.contains("not found"),
        "{ctx}: the loader --list {dest}: {}\n{listed}",
        out.status
    );
    Ok(())
}

/// The NCCL environment plugin where the Dockerfile puts it: a shared object exporting NCCL's
/// entry points, whose libraries the image's loader resolves.
fn check_nccl_plugin(rootfs: &Path, ctx: &str) -> Result<()> {
    let name = "libnccl-env-railguard.so";
    let dest = dockerfile_stage("prober")?
        .copy_destination(name)
        .ok_or_else(|| anyhow!("docker/prober.Dockerfile copies no {name}"))?;
    let bytes = std::fs::read(rootfs.join(dest.trim_start_matches('/')))
        .with_context(|| format!("{ctx}: {dest}"))?;
    ensure!(
        bytes.starts_with(b"\x7fELF"),
        "{ctx}: {dest} is not an ELF file"
    );
    for symbol in [&b"ncclEnvPlugin_v2"[..], &b"ncclEnvPlugin_v1"[..]] {
        ensure!(
            bytes.windows(symbol.len()).any(|w| w == symbol),
            "{ctx}: {dest} names no {}",
            String::from_utf8_lossy(symbol)
        );
    }
    check_loader_resolves(rootfs, &dest, ctx)?;
    Ok(())
}

/// The version and sha256 pins of the nvidia-nccl-cu12 wheel in tests/scripts/nccl-wheel.sh:
/// (version, [x86_64 sha256, aarch64 sha256]).
fn wheel_script_pins() -> Result<(String, Vec<String>)> {
    let text = std::fs::read_to_string(workspace_root().join("tests/scripts/nccl-wheel.sh"))?;
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("version="))
        .ok_or_else(|| anyhow!("nccl-wheel.sh sets no version="))?
        .trim()
        .to_string();
    let hashes = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("sha256="))
        .map(|h| h.trim_end_matches(" ;;").trim().to_string())
        .collect();
    Ok((version, hashes))
}

/// The Dockerfile's `ARG NAME=value`.
fn dockerfile_arg(text: &str, name: &str) -> Result<String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("ARG {name}=")))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| anyhow!("docker/prober.Dockerfile has no ARG {name}="))
}

/// The default image's NCCL and the test images' are one wheel: the Dockerfile downloads the
/// version and hashes tests/scripts/nccl-wheel.sh caches.
#[test]
fn the_dockerfile_pins_the_wheel_that_nccl_wheel_sh_caches() -> Result<()> {
    let text = std::fs::read_to_string(workspace_root().join("docker/prober.Dockerfile"))?;
    let (version, hashes) = wheel_script_pins()?;
    assert_eq!(dockerfile_arg(&text, "NCCL_WHEEL_VERSION")?, version);
    assert_eq!(
        vec![
            dockerfile_arg(&text, "NCCL_WHEEL_SHA256_AMD64")?,
            dockerfile_arg(&text, "NCCL_WHEEL_SHA256_ARM64")?,
        ],
        hashes
    );
    // The stage the default image copies it from, to where the prober loads it by default.
    let stage = dockerfile_stage("prober")?;
    assert_eq!(
        stage.copy_destination("libnccl.so.2").as_deref(),
        Some(railguard_gpu::BUNDLED_NCCL_LIBRARY)
    );
    assert!(
        stage
            .copies
            .iter()
            .any(|(src, dest)| src == "/out/libnccl.so.2" && dest.starts_with("/usr/lib/")),
        "{:?}",
        stage.copies
    );
    Ok(())
}

/// The wheel's NCCL where the Dockerfile puts it, which the prober loads by default: an ELF
/// shared object exporting `ncclGetVersion`, whose libraries the image's loader resolves, and
/// which railguard's own loader opens as the pinned version.
fn check_nccl(rootfs: &Path, ctx: &str) -> Result<()> {
    let dest = dockerfile_stage("prober")?
        .copy_destination("libnccl.so.2")
        .ok_or_else(|| anyhow!("docker/prober.Dockerfile copies no libnccl.so.2"))?;
    ensure!(
        dest == railguard_gpu::BUNDLED_NCCL_LIBRARY,
        "{ctx}: NCCL at {dest}, the prober loads {}",
        railguard_gpu::BUNDLED_NCCL_LIBRARY
    );
    let lib = rootfs.join(dest.trim_start_matches('/'));
    let mut magic = [0u8; 4];
    std::io::Read::read_exact(
        &mut std::fs::File::open(&lib).with_context(|| format!("{ctx}: {dest}"))?,
        &mut magic,
    )?;
    ensure!(&magic == b"\x7fELF", "{ctx}: {dest} is not an ELF file");
    let symbols = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .context("running nm (binutils)")?;
    let symbols = String::from_utf8_lossy(&symbols.stdout);
    // NCCL defines it weak, over pncclGetVersion (its profiling-interface alias).
    ensure!(
        symbols
            .lines()
            .any(|l| l.ends_with(" T ncclGetVersion") || l.ends_with(" W ncclGetVersion")),
        "{ctx}: {dest} exports no ncclGetVersion"
    );
    check_loader_resolves(rootfs, &dest, ctx)?;
    // Held for the test's life: NCCL is not meant to be unloaded.
    static LOADED: std::sync::OnceLock<std::sync::Arc<railguard_gpu::Nccl>> =
        std::sync::OnceLock::new();
    let nccl = match LOADED.get() {
        Some(n) => n,
        None => {
            let n =
                railguard_gpu::Nccl::load(Some(&lib)).with_context(|| format!("{ctx}: {dest}"))?;
            LOADED.get_or_init(|| n)
        }
    };
    let (version, _) = wheel_script_pins()?;
    ensure!(
        nccl.version_string() == version,
        "{ctx}: {dest} is NCCL {}, the pinned wheel's is {version}",
        nccl.version_string()
    );
    Ok(())
}

#[test]
fn images_match_their_dockerfiles_and_their_binaries_run() -> Result<()> {
    ensure!(
        is_root()?,
        "this test builds images with buildah and runs their binaries with chroot: run it as root"
    );
    let bins = [
        ("railguard-webhook-cli", "railguard-webhook"),
        ("railguard-extender-cli", "railguard-extender"),
        ("railguard-prober-cli", "railguard-prober"),
        ("railguard-sim", "all_reduce_perf_sim"),
    ];
    let mut bin_dir: Option<PathBuf> = None;
    for (package, name) in bins {
        let path = workspace_binary(package, name)?;
        let dir = path
            .parent()
            .ok_or_else(|| anyhow!("{} has no parent", path.display()))?
            .to_path_buf();
        if let Some(d) = &bin_dir {
            ensure!(
                *d == dir,
                "{name} is in {}, not {}",
                dir.display(),
                d.display()
            );
        }
        bin_dir = Some(dir);
    }
    let bin_dir = bin_dir.ok_or_else(|| anyhow!("no binaries"))?;
    let kube = kube_bin_dir();
    let mut images = vec![
        "webhook",
        "extender",
        "prober",
        "prober-sim",
        "pause",
        "testbox",
    ];
    if kube.is_some() {
        images.push("kube-scheduler");
    } else {
        eprintln!("no kube-scheduler built yet (tests/scripts/control-plane.sh): its image is not checked");
    }

    let tmp = tempfile::tempdir()?;
    let out_dir = tmp.path().join("images");
    let t0 = Instant::now();
    let cold = run_script(&out_dir, &bin_dir, kube.as_deref(), &images)?;
    eprintln!("build-images.sh (cold, {:?}):\n{cold}", t0.elapsed());
    let t1 = Instant::now();
    let warm = run_script(&out_dir, &bin_dir, kube.as_deref(), &images)?;
    eprintln!("build-images.sh (warm, {:?}):\n{warm}", t1.elapsed());
    ensure!(
        warm.lines().count() == images.len() && warm.lines().all(|l| l.contains("up to date")),
        "a second run rebuilt images:\n{warm}"
    );

    let listed = std::fs::read_to_string(out_dir.join("images.txt"))?;
    let listed: BTreeMap<String, PathBuf> = listed
        .lines()
        .map(|l| {
            l.split_once(' ')
                .map(|(r, a)| (r.to_string(), PathBuf::from(a)))
                .ok_or_else(|| anyhow!("bad images.txt line {l:?}"))
        })
        .collect::<Result<_>>()?;
    let archive = |reference: &str| -> Result<PathBuf> {
        let a = listed
            .get(reference)
            .ok_or_else(|| anyhow!("images.txt lists no {reference}: {listed:?}"))?;
        ensure!(a.is_file(), "{} is missing", a.display());
        Ok(a.clone())
    };
    let open_image = |reference: &str, work: &Path| -> Result<Image> {
        open_archive(&archive(reference)?, reference, work)
    };
    ensure!(listed.len() == images.len(), "images.txt: {listed:?}");

    for (short, component, binary, user) in [
        ("webhook", "webhook", "railguard-webhook", "nonroot"),
        ("extender", "extender", "railguard-extender", "nonroot"),
        ("prober", "prober", "railguard-prober", "railguard"),
        ("prober-sim", "prober", "railguard-prober", "railguard"),
    ] {
        let reference = format!("localhost/railguard-{short}:dev");
        let image = check_railguard_image(
            &tmp.path().join(short),
            &archive(&reference)?,
            &reference,
            component,
            binary,
            user,
        )?;
        if component == "prober" {
            check_prober_rootfs(&image.rootfs, &reference)?;
            check_nccl_plugin(&image.rootfs, &reference)?;
        }
        let nccl = image
            .rootfs
            .join(railguard_gpu::BUNDLED_NCCL_LIBRARY.trim_start_matches('/'));
        if short == "prober" {
            check_nccl(&image.rootfs, &reference)?;
        } else {
            // A simulated node loads the test doubles; 470 MB it does not need.
            ensure!(!nccl.exists(), "{reference} holds the wheel's NCCL");
        }
        let sim = image.rootfs.join("usr/local/bin/all_reduce_perf_sim");
        if short == "prober-sim" {
            // Runs, and says what it misses (no simulated node here).
            let out = chroot(&image.rootfs, &["/usr/local/bin/all_reduce_perf_sim"])?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            ensure!(
                stderr.contains("RAILGUARD_SIM_ROOT") && !stderr.contains(LOADER_ERROR),
                "{reference}: all_reduce_perf_sim in the rootfs: {stderr}"
            );
        } else {
            ensure!(
                !sim.exists(),
                "{reference} holds the simulated all_reduce_perf"
            );
        }
    }

    let pause = open_image("k8s.gcr.io/pause:3.2", &tmp.path().join("pause"))?;
    ensure!(
        strings(&pause.config["Entrypoint"]) == ["/pause"],
        "pause entrypoint {}",
        pause.config["Entrypoint"]
    );
    let out = chroot(&pause.rootfs, &["/pause", "-v"])?;
    ensure!(out.status.success(), "/pause -v: {out:?}");

    let testbox = open_image(
        "localhost/railguard-testbox:dev",
        &tmp.path().join("testbox"),
    )?;
    ensure!(
        strings(&testbox.config["Cmd"]) == ["/bin/sh"],
        "testbox cmd {}",
        testbox.config["Cmd"]
    );
    let out = chroot(
        &testbox.rootfs,
        &["/bin/sh", "-c", "for a in env sleep cat ls grep df id wget nc echo hostname mount; do [ -x /bin/$a ] || { echo no $a; exit 1; }; done; echo $PATH | grep -q / && id -u"],
    )?;
    ensure!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "0",
        "testbox applets: {out:?}"
    );

    if kube.is_some() {
        let reference = "localhost/kube-scheduler:v1.20.2";
        let image = open_image(reference, &tmp.path().join("kube-scheduler"))?;
        let out = chroot(
            &image.rootfs,
            &["/usr/local/bin/kube-scheduler", "--version"],
        )?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && stdout.contains("v1.20"),
            "kube-scheduler --version in the rootfs: {out:?}"
        );
        ensure!(
            strings(&image.config["Env"])
                .iter()
                .any(|e| e == "PATH=/usr/local/bin:/bin"),
            "kube-scheduler env {}",
            image.config["Env"]
        );
    }
    Ok(())
}

// --- the parser, without buildah ------------------------------------------------------------

const TWO_STAGES: &str = r#"# syntax=docker/dockerfile:1
ARG BASE=debian:bookworm-slim
FROM rust:1.85 AS build
USER builder
EXPOSE 1
RUN cargo build \
      --release
FROM ${BASE} AS Runtime
COPY --from=build /out/app \
     /usr/local/bin/app
# a comment inside the stage
USER 65532:65532
EXPOSE 8443 \
    53/udp
ENTRYPOINT ["/usr/local/bin/app", "serve"]
FROM runtime AS metrics
EXPOSE 9090
FROM metrics
"#;

#[test]
fn parser_follows_the_alias_chain_of_the_default_stage() -> Result<()> {
    let stage = runtime_stage(TWO_STAGES)?;
    let want = RuntimeStage {
        stage: "runtime".into(),
        entrypoint: vec!["/usr/local/bin/app".into(), "serve".into()],
        user: "65532:65532".into(),
        exposed: ["8443/tcp", "53/udp", "9090/tcp"]
            .into_iter()
            .map(String::from)
            .collect(),
        copies: vec![("/out/app".into(), "/usr/local/bin/app".into())],
    };
    assert_eq!(stage, want);
    assert_eq!(
        stage.copy_destination("app").as_deref(),
        Some("/usr/local/bin/app")
    );
    // The script reads it the same way.
    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("Dockerfile");
    std::fs::write(&path, TWO_STAGES)?;
    assert_eq!(script_stage(&path)?, want);
    Ok(())
}

#[test]
fn parser_reports_a_runtime_stage_without_user() -> Result<()> {
    let text = "FROM rust AS build\nUSER builder\nFROM scratch\nCOPY --from=build /app /app\nENTRYPOINT [\"/app\"]\n";
    let err = runtime_stage(text).expect_err("no USER in the runtime stage");
    assert!(err.to_string().contains("no USER"), "{err:#}");
    let err = runtime_stage("FROM scratch\nUSER 1\nENTRYPOINT /app --flag\n")
        .expect_err("shell-form ENTRYPOINT");
    assert!(err.to_string().contains("exec (JSON) form"), "{err:#}");
    assert!(runtime_stage("# nothing\n").is_err());
    // The script refuses them too.
    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("Dockerfile");
    std::fs::write(&path, text)?;
    assert!(script_stage(&path).is_err());
    Ok(())
}

#[test]
fn script_and_test_read_the_real_dockerfiles_alike() -> Result<()> {
    for component in ["webhook", "extender", "prober"] {
        let stage = dockerfile_stage(component)?;
        let path = workspace_root().join(format!("docker/{component}.Dockerfile"));
        assert_eq!(script_stage(&path)?, stage, "{component}");
        let binary = format!("/usr/local/bin/railguard-{component}");
        assert_eq!(stage.entrypoint.first(), Some(&binary), "{component}");
        assert!(!stage.exposed.is_empty(), "{component}");
    }
    // The prober's default image is the `prober` stage, not `with-nccl-tests`.
    assert_eq!(dockerfile_stage("prober")?.stage, "prober");
    Ok(())
}

/// `ARG RUST_VERSION=<v>` of a Dockerfile (the toolchain of its build stage).
fn dockerfile_rust_version(text: &str) -> Option<String> {
    instructions(text).into_iter().find_map(|(kw, rest)| {
        (kw == "ARG")
            .then(|| rest.strip_prefix("RUST_VERSION=").map(str::to_string))
            .flatten()
    })
}

/// `1.89` and `1.89.0` alike, for comparing.
fn version_key(v: &str) -> [u64; 3] {
    let mut key = [0; 3];
    for (k, p) in key.iter_mut().zip(v.split('.')) {
        *k = p.parse().unwrap_or(0);
    }
    key
}

/// The Dockerfiles' Rust toolchain can build the locked dependencies of their binary
/// (`cargo build --locked` refuses a crate whose rust-version is newer than the compiler).
#[test]
fn dockerfiles_rust_version_builds_the_locked_dependencies() -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version=1",
            "--locked",
            "--offline",
            "--filter-platform=x86_64-unknown-linux-gnu",
        ])
        .current_dir(workspace_root())
        .output()
        .context("running cargo metadata")?;
    ensure!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout)?;
    let packages: BTreeMap<&str, &Value> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: BTreeMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    for component in ["webhook", "extender", "prober"] {
        let path = workspace_root().join(format!("docker/{component}.Dockerfile"));
        let text = std::fs::read_to_string(&path)?;
        let rust = dockerfile_rust_version(&text)
            .ok_or_else(|| anyhow!("{}: no ARG RUST_VERSION=", path.display()))?;
        // The package the Dockerfile builds (`cargo build ... -p NAME`), so the check
        // follows the binary's own dependencies, shell included.
        let mut words = text.split_whitespace();
        let name = words
            .by_ref()
            .skip_while(|w| *w != "-p")
            .nth(1)
            .map(str::to_string)
            .ok_or_else(|| anyhow!("{}: no `cargo build -p PACKAGE`", path.display()))?;
        let root = packages
            .iter()
            .find(|(_, p)| p["name"] == name.as_str())
            .map(|(id, _)| *id)
            .ok_or_else(|| anyhow!("no package {name}"))?;
        // Normal and build dependencies, transitively (dev-dependencies are not built).
        let mut seen = BTreeSet::from([root]);
        let mut todo = vec![root];
        while let Some(id) = todo.pop() {
            for dep in nodes
                .get(id)
                .and_then(|n| n["deps"].as_array())
                .into_iter()
                .flatten()
            {
                let built = dep["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"] != "dev");
                if let Some(pkg) = dep["pkg"].as_str() {
                    if built && seen.insert(pkg) {
                        todo.push(pkg);
                    }
                }
            }
        }
        let newest = seen
            .iter()
            .filter_map(|id| {
                let p = packages.get(id)?;
                Some((p["rust_version"].as_str()?, p["name"].as_str()?))
            })
            .max_by_key(|(v, _)| version_key(v))
            .ok_or_else(|| anyhow!("no rust-version among {name}'s dependencies"))?;
        ensure!(
            version_key(&rust) >= version_key(newest.0),
            "{}: RUST_VERSION={rust}, but {} needs rustc {}",
            path.display(),
            newest.1,
            newest.0
        );
    }
    Ok(())
}
