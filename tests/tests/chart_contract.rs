//! The chart and the binaries agree, without a cluster: every container the chart renders
//! (`helm template` for a 1.20 cluster, with every values set of
//! `railguard_tests::chart_values`; images are matched by the repositories of the set's
//! values merged over values.yaml) is parsed with the clap
//! definition of the binary its image runs, the way Kubernetes and clap would run it:
//!
//! - `$(VAR)` in `command`/`args` is expanded from the container's `env` (values from
//!   `valueFrom` are placeholders such as `node-a`) and the kubelet's service environment of
//!   the pod's namespace (`<SERVICE>_SERVICE_HOST`/`_PORT`), as the kubelet does;
//! - each env variable that an argument of the selected (sub)command declares as its `env`
//!   becomes the equivalent `--long=value` (a flag: `--long` when its own value parser reads
//!   the value as true), unless the argument is on the command line (clap then ignores the
//!   variable) — the process environment is never touched, and never read;
//! - the result must parse (`try_get_matches_from`);
//! - a `RAILGUARD_*` variable that no argument of that (sub)command reads is an error (it
//!   would be silently ignored), as is one shadowed by a different command-line value;
//! - every value of a path argument (`value_hint` FilePath/DirPath/ExecutablePath/AnyPath,
//!   which clap also infers for `PathBuf` arguments) is an absolute path under one of the
//!   container's volumeMounts, or an image path under `/usr/local/bin`;
//! - the prober subcommands the chart runs take `--profile NAME` (env `RAILGUARD_PROFILE`)
//!   and, where a file may be given instead, `--profile-file PATH` (env
//!   `RAILGUARD_PROFILE_FILE`). `peer-endpoint` and `fleet` take no file: `fleet` (the fleet
//!   controller) covers every profile unless `--profile` names one, and reads the
//!   FabricProfiles from the cluster. `peer-token` (an init container that fills the
//!   campaign's token Secret) serves no profile and takes neither.
//!
//! The kube-scheduler container is not ours: only its `--config` must be a mounted file.
//! Containers map to binaries by image repository (values `webhook.image`, `extender.image`,
//! `prober.image`, `scheduler.image`). All problems are collected and reported at once, as
//! `<values set>: <kind>/<name> container <c>: <problem>`.

use std::collections::BTreeMap;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory, ValueHint};
use railguard_tests::chart_values::{ValuesSet, ALL_SETS, DEFAULT};
use railguard_tests::workspace_root;
use serde_json::Value as Json;

/// One of railguard's binaries: where values.yaml names its image, and its clap definition.
struct Binary {
    values_key: &'static str,
    name: &'static str,
    command: fn() -> Command,
}

const BINARIES: [Binary; 3] = [
    Binary {
        values_key: "webhook",
        name: "railguard-webhook",
        command: railguard_webhook_cli::Cli::command,
    },
    Binary {
        values_key: "extender",
        name: "railguard-extender",
        command: railguard_extender_cli::Cli::command,
    },
    Binary {
        values_key: "prober",
        name: "railguard-prober",
        command: railguard_prober_cli::Cli::command,
    },
];

/// Variables a binary reads outside clap (so setting them is not "ignored"):
/// binary, subcommand (`None`: all of them), variable.
const READ_OUTSIDE_CLAP: [(&str, Option<&str>, &str); 4] = [
    // railguard_runtime::init_logging: the tracing filter, in every binary.
    ("railguard-prober", None, "RAILGUARD_LOG"),
    ("railguard-webhook", None, "RAILGUARD_LOG"),
    ("railguard-extender", None, "RAILGUARD_LOG"),
    // prober/src/preflight.rs: the expected /dev/shm size, set by the webhook.
    ("railguard-prober", Some("preflight"), "RAILGUARD_SHM_SIZE"),
];

/// How prober subcommands select a FabricProfile: `--profile NAME` everywhere, and where a
/// file may be given instead, `--profile-file PATH`.
const PROFILE_ARGS: [(&str, &str, bool); 2] = [
    // long, env, is a path
    ("profile", "RAILGUARD_PROFILE", false),
    ("profile-file", "RAILGUARD_PROFILE_FILE", true),
];

/// Prober subcommands the chart runs that serve no one profile, so take no `--profile`:
/// `peer-token` (the init container that fills and writes the campaign's shared token),
/// `upgrade-crd` (the CRD hook), `cleanup` (the uninstall hook, every Node) and
/// `verify-install` (`helm test`).
const PROFILE_FREE_SUBCOMMANDS: &[&str] =
    &["peer-token", "upgrade-crd", "cleanup", "verify-install"];

/// Where images put our binaries (the Dockerfiles' ENTRYPOINT directory).
const IMAGE_BIN_DIR: &str = "/usr/local/bin";

// ---------------------------------------------------------------------------- the model

/// A container of a rendered pod template, reduced to what the contract needs.
#[derive(Debug, Clone, Default)]
struct Container {
    name: String,
    image: String,
    command: Option<Vec<String>>,
    args: Vec<String>,
    /// In declaration order, `valueFrom` as placeholders, `$(VAR)` expanded.
    env: Vec<(String, String)>,
    mounts: Vec<Mount>,
}

#[derive(Debug, Clone, PartialEq)]
struct Mount {
    path: String,
    /// A subPath mount may be a single file at `path`.
    sub_path: bool,
}

impl Container {
    fn from_json(c: &Json, namespace: &str) -> Container {
        Container::with_service_links(c, namespace, &BTreeMap::new())
    }

    /// [`Container::from_json`] in a pod that gets the kubelet's service environment
    /// (`links`, see [`service_links`]).
    fn with_service_links(
        c: &Json,
        namespace: &str,
        links: &BTreeMap<String, String>,
    ) -> Container {
        let strs = |v: &Json| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .map(|x| match x {
                    Json::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        };
        let mounts = c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| Mount {
                path: m["mountPath"].as_str().unwrap_or_default().to_string(),
                sub_path: m["subPath"].as_str().is_some_and(|s| !s.is_empty())
                    || m["subPathExpr"].as_str().is_some_and(|s| !s.is_empty()),
            })
            .collect();
        Container {
            name: c["name"].as_str().unwrap_or_default().to_string(),
            image: c["image"].as_str().unwrap_or_default().to_string(),
            command: c.get("command").filter(|v| !v.is_null()).map(strs),
            args: strs(&c["args"]),
            env: resolve_env(&c["env"], namespace, links),
            mounts,
        }
    }

    fn env_map(&self) -> BTreeMap<String, String> {
        self.env.iter().cloned().collect()
    }
}

/// Kubernetes' `$(VAR)` expansion (the kubelet's, for command, args and env values):
/// `$(NAME)` is NAME's value when defined and stays as written otherwise, `$$` is `$`, any
/// other `$` is kept.
fn expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let mut chars = after.chars();
        match chars.next() {
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after.find(')') {
                Some(close) => {
                    let name = &after[1..close];
                    match vars.get(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(c) => {
                out.push('$');
                out.push(c);
                rest = chars.as_str();
            }
        }
    }
    out.push_str(rest);
    out
}

/// A stand-in for a value Kubernetes fills in at run time.
fn placeholder(value_from: &Json, namespace: &str) -> String {
    if let Some(path) = value_from["fieldRef"]["fieldPath"].as_str() {
        return match path {
            "spec.nodeName" => "node-a".into(),
            "metadata.name" => "pod-a".into(),
            "metadata.namespace" => namespace.into(),
            "spec.serviceAccountName" => "service-account-a".into(),
            "status.podIP" | "status.hostIP" => "10.0.0.1".into(),
            _ => "field-value".into(),
        };
    }
    if value_from.get("resourceFieldRef").is_some() {
        return "1".into();
    }
    if value_from.get("secretKeyRef").is_some() {
        return "secret-value".into();
    }
    "configmap-value".into()
}

/// The container's variables in order: values expanded against the ones before them and the
/// service environment `links` (as the kubelet does), `valueFrom` as placeholders.
fn resolve_env(
    env: &Json,
    namespace: &str,
    links: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut known = links.clone();
    let mut out = Vec::new();
    for e in env.as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap_or_default().to_string();
        let value = match e.get("valueFrom").filter(|v| !v.is_null()) {
            Some(from) => placeholder(from, namespace),
            None => expand(e["value"].as_str().unwrap_or_default(), &known),
        };
        known.insert(name.clone(), value.clone());
        out.push((name, value));
    }
    out
}

// ------------------------------------------------------------------- clap, hermetically

/// The definition with every `env` removed, so parsing reads nothing from this process's
/// environment (clap reads it when `env` is set); the container's env is passed as arguments.
fn without_env(cmd: Command) -> Command {
    cmd.mut_args(|a| a.env(None::<&'static str>))
        .mut_subcommands(without_env)
}

/// The subcommand the arguments select: the first one not starting with `-`, and its index.
fn subcommand_index(cmd: &Command, args: &[String]) -> Option<(usize, String)> {
    if !cmd.has_subcommands() {
        return None;
    }
    args.iter()
        .position(|a| !a.starts_with('-'))
        .map(|i| (i, args[i].clone()))
}

/// Whether `arg` is on the command line in `tokens` (the tokens of its own (sub)command).
fn given_on_command_line(arg: &Arg, tokens: &[String]) -> bool {
    let longs: Vec<&str> = arg
        .get_long()
        .into_iter()
        .chain(arg.get_all_aliases().unwrap_or_default())
        .collect();
    let shorts: Vec<char> = arg
        .get_short()
        .into_iter()
        .chain(arg.get_all_short_aliases().unwrap_or_default())
        .collect();
    for t in tokens {
        if t == "--" {
            break;
        }
        if let Some(long) = t.strip_prefix("--") {
            let name = long.split_once('=').map_or(long, |(n, _)| n);
            if longs.contains(&name) {
                return true;
            }
        } else if let Some(cluster) = t.strip_prefix('-') {
            if cluster.chars().next().is_some_and(|c| shorts.contains(&c)) {
                return true;
            }
        }
    }
    false
}

/// How `arg`'s own value parser reads `value` for a flag (what clap does with a flag's env).
fn flag_value(arg: &Arg, value: &str) -> Result<bool, String> {
    let id = arg.get_id().clone();
    let probe = Command::new("probe").arg(
        Arg::new(id.clone())
            .action(ArgAction::Set)
            .allow_hyphen_values(true)
            .value_parser(arg.get_value_parser().clone()),
    );
    let m = probe
        .try_get_matches_from(["probe", value])
        .map_err(|e| clap_message(&e).replace(&format!("'[{id}]'"), &describe(arg)))?;
    m.try_get_one::<bool>(id.as_str())
        .map_err(|e| e.to_string())?
        .copied()
        .ok_or_else(|| "no value".to_string())
}

fn clap_message(e: &clap::Error) -> String {
    match e.kind() {
        clap::error::ErrorKind::DisplayHelp
        | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            "would print its help and exit".into()
        }
        clap::error::ErrorKind::DisplayVersion => "would print its version and exit".into(),
        _ => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            first.strip_prefix("error: ").unwrap_or(first).to_string()
        }
    }
}

fn describe(arg: &Arg) -> String {
    match (arg.get_long(), arg.get_short()) {
        (Some(l), _) => format!("--{l}"),
        (None, Some(s)) => format!("-{s}"),
        (None, None) => format!("<{}>", arg.get_id()),
    }
}

/// The container's variables that clap would apply to `cmd`'s arguments, as arguments.
#[derive(Debug, Default, PartialEq)]
struct EnvArgs {
    /// Arguments equivalent to the variables.
    args: Vec<String>,
    /// (variable, arg id) of the arguments these came from.
    from_env: Vec<(String, String)>,
    /// (variable, arg id) of variables clap ignores: the argument is on the command line.
    shadowed: Vec<(String, String)>,
    problems: Vec<String>,
}

fn env_as_args(cmd: &Command, cli: &[String], env: &[(String, String)]) -> EnvArgs {
    let env: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut out = EnvArgs::default();
    for arg in cmd.get_arguments() {
        let Some(var) = arg.get_env().and_then(|v| v.to_str()) else {
            continue;
        };
        let Some(&value) = env.get(var) else {
            continue;
        };
        let id = arg.get_id().to_string();
        if given_on_command_line(arg, cli) {
            out.shadowed.push((var.to_string(), id));
            continue;
        }
        if arg.get_action().takes_values() {
            match (arg.get_long(), arg.get_short()) {
                (Some(long), _) => out.args.push(format!("--{long}={value}")),
                (None, Some(short)) => out.args.push(format!("-{short}{value}")),
                (None, None) => {
                    out.problems.push(format!(
                        "{var}: sets the positional {} (not checked here)",
                        describe(arg)
                    ));
                    continue;
                }
            }
            out.from_env.push((var.to_string(), id));
            continue;
        }
        let flag = describe(arg);
        match (arg.get_action(), flag_value(arg, value)) {
            (ArgAction::SetTrue, Ok(true)) | (ArgAction::SetFalse, Ok(false)) => {
                out.args.push(flag);
                out.from_env.push((var.to_string(), id));
            }
            (ArgAction::SetTrue | ArgAction::SetFalse, Ok(_)) => {}
            (ArgAction::SetTrue | ArgAction::SetFalse, Err(e)) => out
                .problems
                .push(format!("{var}={value}: clap rejects it: {e}")),
            (action, _) => out.problems.push(format!(
                "{var}: sets {flag} with action {action:?} (not checked here)"
            )),
        }
    }
    out
}

/// `RAILGUARD_*` variables that no argument of `cmds` (the command and its selected
/// subcommand) reads.
fn unread_vars(
    bin: &str,
    sub: Option<&str>,
    cmds: &[&Command],
    env: &[(String, String)],
) -> Vec<String> {
    env.iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| k.starts_with("RAILGUARD_"))
        .filter(|k| {
            !cmds.iter().any(|c| {
                c.get_arguments()
                    .any(|a| a.get_env().is_some_and(|e| e == std::ffi::OsStr::new(k)))
            })
        })
        .filter(|k| {
            !READ_OUTSIDE_CLAP
                .iter()
                .any(|(b, s, v)| *b == bin && v == k && (s.is_none() || *s == sub))
        })
        .map(str::to_string)
        .collect()
}

// ------------------------------------------------------------------------------- paths

#[derive(Debug, Clone, Copy, PartialEq)]
enum PathKind {
    File,
    Dir,
    Any,
}

fn path_kind(arg: &Arg) -> Option<PathKind> {
    match arg.get_value_hint() {
        ValueHint::FilePath | ValueHint::ExecutablePath => Some(PathKind::File),
        ValueHint::DirPath => Some(PathKind::Dir),
        ValueHint::AnyPath => Some(PathKind::Any),
        _ => None,
    }
}

/// `path` without `.` components and trailing slashes; `None` when it is relative or climbs.
fn normalize(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => return None,
            p => parts.push(p),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

fn is_under(path: &str, dir: &str) -> bool {
    dir == "/"
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether `value` names something the container has: under one of its mounts (a file
/// strictly below the mount point, or a subPath mount itself; a directory may also be a
/// mount point or one of its parents, which exist), or an image path under /usr/local/bin.
fn check_path(kind: PathKind, value: &str, mounts: &[Mount]) -> Result<(), String> {
    let Some(path) = normalize(value) else {
        return Err(if value.starts_with('/') {
            format!("`{value}` climbs with `..`")
        } else {
            format!("`{value}` is not an absolute path")
        });
    };
    if is_under(&path, IMAGE_BIN_DIR) {
        return Ok(());
    }
    for m in mounts {
        let Some(mount) = normalize(&m.path) else {
            continue;
        };
        if is_under(&path, &mount) {
            return Ok(());
        }
        if path == mount && (kind != PathKind::File || m.sub_path) {
            return Ok(());
        }
        if kind != PathKind::File && is_under(&mount, &path) {
            return Ok(());
        }
    }
    let have: Vec<&str> = mounts.iter().map(|m| m.path.as_str()).collect();
    Err(format!(
        "`{value}` is not under a volumeMount ({}) nor {IMAGE_BIN_DIR}",
        if have.is_empty() {
            "none".to_string()
        } else {
            have.join(", ")
        }
    ))
}

// ------------------------------------------------------------------------ the contract

/// What the container's own binary would make of its command line and environment.
fn check_container(bin: &str, make: fn() -> Command, c: &Container) -> Vec<String> {
    let mut problems = Vec::new();
    let mut intro = make();
    intro.build();
    let vars = c.env_map();
    let mut cli: Vec<String> = Vec::new();
    if let Some(command) = &c.command {
        let command: Vec<String> = command.iter().map(|s| expand(s, &vars)).collect();
        match command.first() {
            Some(first) if first == bin || first == &format!("{IMAGE_BIN_DIR}/{bin}") => {
                cli.extend(command[1..].iter().cloned())
            }
            Some(first) => {
                problems.push(format!("command runs `{first}`, not {IMAGE_BIN_DIR}/{bin}"));
                return problems;
            }
            None => {}
        }
    }
    cli.extend(c.args.iter().map(|s| expand(s, &vars)));

    // The (sub)command the arguments select, and the tokens of each level.
    let sub = subcommand_index(&intro, &cli);
    let leaf = sub
        .as_ref()
        .and_then(|(_, name)| intro.find_subcommand(name));
    let sub_name = leaf.map(|l| l.get_name().to_string());
    let (top_tokens, leaf_tokens) = match &sub {
        Some((i, _)) => (&cli[..*i], &cli[*i + 1..]),
        None => (&cli[..], &cli[..0]),
    };
    let program = match &sub_name {
        Some(s) => format!("{bin} {s}"),
        None => bin.to_string(),
    };
    let mut levels: Vec<&Command> = vec![&intro];
    levels.extend(leaf);

    // Without a known subcommand clap's own error says enough.
    let resolved = !intro.has_subcommands() || leaf.is_some();
    for var in unread_vars(bin, sub_name.as_deref(), &levels, &c.env)
        .into_iter()
        .filter(|_| resolved)
    {
        problems.push(format!(
            "env {var} is read by no argument of `{program}` (silently ignored)"
        ));
    }

    // The environment, as clap would apply it, becomes arguments of its level.
    let top_env = env_as_args(&intro, top_tokens, &c.env);
    let leaf_env = leaf.map(|l| env_as_args(l, leaf_tokens, &c.env));
    let mut argv = vec![bin.to_string()];
    argv.extend(top_tokens.iter().cloned());
    argv.extend(top_env.args.iter().cloned());
    if let Some((i, _)) = &sub {
        argv.push(cli[*i].clone());
        let end = leaf_tokens
            .iter()
            .position(|t| t == "--")
            .unwrap_or(leaf_tokens.len());
        argv.extend(leaf_tokens[..end].iter().cloned());
        argv.extend(leaf_env.iter().flat_map(|e| e.args.iter().cloned()));
        argv.extend(leaf_tokens[end..].iter().cloned());
    }
    for e in std::iter::once(&top_env).chain(leaf_env.iter()) {
        problems.extend(e.problems.iter().map(|p| format!("`{program}`: {p}")));
    }

    let matches = match without_env(make()).try_get_matches_from(&argv) {
        Ok(m) => m,
        Err(e) => {
            problems.push(format!(
                "`{program}` rejects `{}`: {}",
                argv[1..].join(" "),
                clap_message(&e)
            ));
            return problems;
        }
    };
    let leaf_matches = sub_name
        .as_deref()
        .and_then(|s| matches.subcommand_matches(s));

    let mut checked: Vec<(&Command, &ArgMatches, &EnvArgs)> = vec![(&intro, &matches, &top_env)];
    if let (Some(l), Some(m), Some(e)) = (leaf, leaf_matches, leaf_env.as_ref()) {
        checked.push((l, m, e));
    }
    for (cmd, m, env) in checked {
        // A variable shadowed by a different command-line value is misread.
        for (var, id) in &env.shadowed {
            let Some(arg) = cmd.get_arguments().find(|a| a.get_id() == id.as_str()) else {
                continue;
            };
            let value = &vars[var];
            let differs = if arg.get_action().takes_values() {
                let given: Vec<String> = m
                    .get_raw(id)
                    .into_iter()
                    .flatten()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect();
                let from_env: Vec<String> = match arg.get_value_delimiter() {
                    Some(d) => value.split(d).map(str::to_string).collect(),
                    None => vec![value.clone()],
                };
                (given != from_env).then(|| given.join(","))
            } else {
                let on = matches!(arg.get_action(), ArgAction::SetTrue);
                (flag_value(arg, value) != Ok(on)).then(|| describe(arg))
            };
            if let Some(given) = differs {
                problems.push(format!(
                    "`{program}`: env {var}={value} is ignored: {} is on the command line ({given})",
                    describe(arg)
                ));
            }
        }
        // Every path the chart gives must exist in the container.
        for arg in cmd.get_arguments() {
            let Some(kind) = path_kind(arg) else {
                continue;
            };
            let id = arg.get_id().as_str();
            if m.value_source(id) != Some(ValueSource::CommandLine) {
                continue;
            }
            let source = match env.from_env.iter().find(|(_, i)| i == id) {
                Some((var, _)) => format!("{} (env {var})", describe(arg)),
                None => describe(arg),
            };
            for v in m.get_raw(id).into_iter().flatten() {
                if let Err(e) = check_path(kind, &v.to_string_lossy(), &c.mounts) {
                    problems.push(format!("`{program}` {source}: {e}"));
                }
            }
        }
    }

    // The prober subcommands the chart runs name their profile both ways.
    if bin == "railguard-prober" {
        if let Some(l) = leaf.filter(|l| !PROFILE_FREE_SUBCOMMANDS.contains(&l.get_name())) {
            for (long, var, is_path) in PROFILE_ARGS {
                match l.get_arguments().find(|a| a.get_long() == Some(long)) {
                    // A profile file is optional (peer-endpoint only needs the name; fleet
                    // reads every FabricProfile from the cluster).
                    None if is_path => {}
                    None => problems.push(format!("`{program}` has no --{long} (env {var})")),
                    Some(a) => {
                        if a.get_env() != Some(std::ffi::OsStr::new(var)) {
                            problems.push(format!(
                                "`{program}` --{long} reads env {:?}, not {var}",
                                a.get_env()
                            ));
                        }
                        if path_kind(a).is_some() != is_path {
                            problems.push(format!(
                                "`{program}` --{long} {} a path",
                                if is_path { "is not" } else { "is" }
                            ));
                        }
                    }
                }
            }
        }
    }
    problems
}

/// The scheduler is not ours: its `--config` must be a mounted file.
fn check_scheduler(c: &Container) -> Vec<String> {
    let vars = c.env_map();
    let tokens: Vec<String> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter())
        .map(|s| expand(s, &vars))
        .collect();
    let config = tokens.iter().enumerate().find_map(|(i, t)| {
        t.strip_prefix("--config=")
            .map(str::to_string)
            .or_else(|| (t == "--config").then(|| tokens.get(i + 1).cloned().unwrap_or_default()))
    });
    match config {
        None => vec!["kube-scheduler runs without --config".to_string()],
        Some(path) => match check_path(PathKind::File, &path, &c.mounts) {
            Ok(()) => Vec::new(),
            Err(e) => vec![format!("kube-scheduler --config: {e}")],
        },
    }
}

/// The repository of an image reference (no tag, no digest).
fn image_repository(image: &str) -> &str {
    let image = image.split_once('@').map_or(image, |(r, _)| r);
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => &image[..i],
        _ => image,
    }
}

fn repository_matches(image: &str, repository: &str) -> bool {
    let repo = image_repository(image);
    !repository.is_empty() && (repo == repository || repo.ends_with(&format!("/{repository}")))
}

/// The kubelet's service environment for a pod in `namespace` that has `enableServiceLinks`
/// (the default): `<NAME>_SERVICE_HOST` and `<NAME>_SERVICE_PORT` of every Service of the
/// namespace, the name upper-cased with `-` as `_` (pkg/kubelet/envvars), the host a
/// placeholder cluster IP.
fn service_links(docs: &[Json], spec: &Json, namespace: &str) -> BTreeMap<String, String> {
    let mut links = BTreeMap::new();
    if spec["enableServiceLinks"] == Json::Bool(false) {
        return links;
    }
    for svc in docs.iter().filter(|d| d["kind"] == "Service") {
        if svc["metadata"]["namespace"].as_str().unwrap_or(namespace) != namespace {
            continue;
        }
        let Some(name) = svc["metadata"]["name"].as_str() else {
            continue;
        };
        let var = name.to_uppercase().replace('-', "_");
        links.insert(format!("{var}_SERVICE_HOST"), "10.96.0.10".into());
        if let Some(port) = svc["spec"]["ports"][0]["port"].as_u64() {
            links.insert(format!("{var}_SERVICE_PORT"), port.to_string());
        }
    }
    links
}

/// The pod specs of a rendered object, if it has any.
fn pod_spec(obj: &Json) -> Option<&Json> {
    let spec = match obj["kind"].as_str()? {
        "Pod" => &obj["spec"],
        "Deployment" | "DaemonSet" | "StatefulSet" | "ReplicaSet" | "Job" => {
            &obj["spec"]["template"]["spec"]
        }
        "CronJob" => &obj["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => return None,
    };
    spec.is_object().then_some(spec)
}

/// Every object `helm template` renders with `set` for a 1.20 cluster, as JSON.
fn rendered_objects(set: &ValuesSet) -> Vec<Json> {
    set.objects_1_20()
        .unwrap_or_else(|e| panic!("{}: does not render: {e:#}", set.label))
}

/// Every problem of every container the chart renders with `set`, and how many containers.
fn contract_problems(set: &ValuesSet) -> (Vec<String>, usize) {
    let docs = match set.objects_1_20() {
        Ok(d) => d,
        Err(e) => return (vec![format!("{}: does not render: {e:#}", set.label)], 0),
    };
    let values = match set.values() {
        Ok(v) => v,
        Err(e) => return (vec![format!("{}: values: {e:#}", set.label)], 0),
    };
    let repo = |key: &str| {
        values[key]["image"]["repository"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let scheduler_repo = repo("scheduler");
    let mut problems = Vec::new();
    let mut containers = 0;
    for obj in &docs {
        let Some(spec) = pod_spec(obj) else {
            continue;
        };
        let kind = obj["kind"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let namespace = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or(set.namespace);
        let links = service_links(&docs, spec, namespace);
        for json in ["initContainers", "containers"]
            .iter()
            .flat_map(|k| spec[*k].as_array().into_iter().flatten())
        {
            let c = Container::with_service_links(json, namespace, &links);
            containers += 1;
            let found = BINARIES
                .iter()
                .find(|b| repository_matches(&c.image, &repo(b.values_key)));
            let found_problems = match found {
                Some(b) => check_container(b.name, b.command, &c),
                None if repository_matches(&c.image, &scheduler_repo) => check_scheduler(&c),
                None => vec![format!("image {} is none of the chart's images", c.image)],
            };
            problems.extend(
                found_problems
                    .into_iter()
                    .map(|p| format!("{}: {kind}/{name} container {}: {p}", set.label, c.name)),
            );
        }
    }
    (problems, containers)
}

#[test]
fn every_container_of_every_values_set_parses_with_its_binarys_own_clap_definition() {
    let mut containers = 0;
    let mut problems = Vec::new();
    for set in ALL_SETS {
        let (p, n) = contract_problems(set);
        problems.extend(p);
        containers += n;
    }
    assert!(containers >= 10, "only {containers} containers rendered");
    assert!(
        problems.is_empty(),
        "{} chart/binary contract problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The fleet controller's container is checked like every other, against `fleet`: it runs
/// without `--profile` (every profile) and `fleet` has no `--profile-file` (profiles come
/// from the cluster), which the profile rule allows; what `fleet` would not read is caught.
#[test]
fn the_fleet_controller_is_checked_against_the_fleet_subcommand() {
    let deployment = rendered_objects(&DEFAULT)
        .into_iter()
        .find(|d: &Json| d["kind"] == "Deployment" && d["metadata"]["name"] == "railguard-fleet")
        .expect("the fleet controller's Deployment");
    let spec = pod_spec(&deployment).unwrap();
    let c = Container::from_json(&spec["containers"][0], DEFAULT.namespace);
    assert_eq!(c.args, ["fleet", "--watch"]);
    let prober: fn() -> Command = railguard_prober_cli::Cli::command;
    assert_eq!(
        check_container("railguard-prober", prober, &c),
        Vec::<String>::new()
    );
    let cli = prober();
    let fleet = cli.find_subcommand("fleet").expect("a fleet subcommand");
    let profile = fleet
        .get_arguments()
        .find(|a| a.get_long() == Some("profile"))
        .expect("fleet --profile");
    assert!(!profile.is_required_set(), "every profile by default");
    assert!(fleet
        .get_arguments()
        .all(|a| a.get_long() != Some("profile-file")));

    let mut bad = c.clone();
    bad.env.push((
        "RAILGUARD_PROFILE_FILE".into(),
        "/etc/railguard/profile.yaml".into(),
    ));
    assert_eq!(
        check_container("railguard-prober", prober, &bad),
        ["env RAILGUARD_PROFILE_FILE is read by no argument of `railguard-prober fleet` (silently ignored)"]
    );
    let mut bad = c.clone();
    for (k, v) in &mut bad.env {
        if k == "RAILGUARD_FLEET_INTERVAL_SECS" {
            *v = "1m".into();
        }
    }
    let problems = check_container("railguard-prober", prober, &bad);
    assert!(
        problems.len() == 1
            && problems[0].starts_with("`railguard-prober fleet` rejects")
            && problems[0].contains("--interval-secs"),
        "{problems:?}"
    );
}

/// Every argument of a command tree, with the command path it belongs to.
fn all_arguments(cmd: &Command, path: &str, out: &mut Vec<(String, Arg)>) {
    for a in cmd.get_arguments() {
        out.push((path.to_string(), a.clone()));
    }
    for sub in cmd.get_subcommands() {
        all_arguments(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

/// One meaning per `RAILGUARD_*` variable: wherever a variable is read (any subcommand of
/// any of the three binaries), it is the same flag, and a path everywhere or nowhere.
#[test]
fn each_railguard_variable_has_one_meaning_across_binaries_and_subcommands() {
    let mut seen: BTreeMap<String, Vec<(String, String, bool)>> = BTreeMap::new();
    for b in &BINARIES {
        let mut args = Vec::new();
        all_arguments(&(b.command)(), b.name, &mut args);
        for (path, a) in args {
            let Some(var) = a.get_env().and_then(|e| e.to_str()) else {
                continue;
            };
            let long = a.get_long().unwrap_or_default().to_string();
            seen.entry(var.to_string())
                .or_default()
                .push((path, long, path_kind(&a).is_some()));
        }
    }
    let mut problems = Vec::new();
    for (var, uses) in &seen {
        let (_, long, is_path) = &uses[0];
        if uses.iter().any(|(_, l, p)| l != long || p != is_path) {
            let list: Vec<String> = uses
                .iter()
                .map(|(c, l, p)| format!("`{c}` --{l}{}", if *p { " (path)" } else { "" }))
                .collect();
            problems.push(format!("{var}: {}", list.join(", ")));
        }
    }
    assert!(seen.len() > 40, "only {} variables found", seen.len());
    assert!(
        problems.is_empty(),
        "variables with more than one meaning:\n{}",
        problems.join("\n")
    );
}

// ------------------------------------------------------------------- the helpers' tests

fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

#[test]
fn expansion_follows_the_kubelet() {
    let v = vars(&[("NODE_NAME", "node-a"), ("EMPTY", "")]);
    assert_eq!(expand("$(NODE_NAME)", &v), "node-a");
    assert_eq!(expand("--node=$(NODE_NAME)/x", &v), "--node=node-a/x");
    assert_eq!(expand("$(NODE_NAME)$(NODE_NAME)", &v), "node-anode-a");
    assert_eq!(expand("a$(EMPTY)b", &v), "ab");
    // Undefined stays as written; `$$` escapes; other `$` are kept.
    assert_eq!(expand("$(MISSING)", &v), "$(MISSING)");
    assert_eq!(expand("$$(NODE_NAME)", &v), "$(NODE_NAME)");
    assert_eq!(expand("cost: 5$ or $x", &v), "cost: 5$ or $x");
    assert_eq!(expand("$(NODE_NAME", &v), "$(NODE_NAME");
    assert_eq!(expand("trailing $", &v), "trailing $");
    assert_eq!(expand("ünï$(NODE_NAME)çødé", &v), "ünïnode-açødé");
}

#[test]
fn env_values_expand_against_earlier_variables_and_value_from_is_a_placeholder() {
    let e: Json = serde_json::json!([
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "DIR", "value": "/var/$(NODE_NAME)"},
        {"name": "EARLY", "value": "$(LATE)"},
        {"name": "LATE", "value": "x"},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    ]);
    assert_eq!(
        resolve_env(&e, "ns-a", &BTreeMap::new()),
        env(&[
            ("NODE_NAME", "node-a"),
            ("DIR", "/var/node-a"),
            ("EARLY", "$(LATE)"),
            ("LATE", "x"),
            ("NS", "ns-a"),
            ("TOKEN", "secret-value"),
        ])
    );
}

#[test]
fn service_links_are_the_namespaces_services_unless_disabled() {
    let docs = vec![
        serde_json::json!({"kind": "Service", "metadata": {"name": "rg-webhook", "namespace": "ns-a"},
                           "spec": {"ports": [{"port": 443}]}}),
        serde_json::json!({"kind": "Service", "metadata": {"name": "other", "namespace": "ns-b"},
                           "spec": {"ports": [{"port": 80}]}}),
    ];
    let links = service_links(&docs, &serde_json::json!({}), "ns-a");
    assert_eq!(
        links.keys().collect::<Vec<_>>(),
        ["RG_WEBHOOK_SERVICE_HOST", "RG_WEBHOOK_SERVICE_PORT"]
    );
    let c = Container::with_service_links(
        &serde_json::json!({"name": "c", "image": "i",
            "env": [{"name": "ADDR", "value": "$(RG_WEBHOOK_SERVICE_HOST):$(RG_WEBHOOK_SERVICE_PORT)"}]}),
        "ns-a",
        &links,
    );
    assert_eq!(c.env, env(&[("ADDR", "10.96.0.10:443")]));
    let off = serde_json::json!({"enableServiceLinks": false});
    assert!(service_links(&docs, &off, "ns-a").is_empty());
}

/// A small stand-in binary with the shapes the real ones use.
fn toy() -> Command {
    Command::new("toy")
        .subcommand(
            Command::new("serve")
                .arg(Arg::new("listen").long("listen").env("TOY_LISTEN"))
                .arg(
                    Arg::new("config")
                        .long("config")
                        .env("TOY_CONFIG")
                        .value_hint(ValueHint::FilePath),
                )
                .arg(
                    Arg::new("data")
                        .long("data")
                        .env("TOY_DATA")
                        .value_parser(clap::value_parser!(std::path::PathBuf)),
                )
                .arg(
                    Arg::new("verbose")
                        .long("verbose")
                        .short('v')
                        .env("TOY_VERBOSE")
                        .action(ArgAction::SetTrue),
                )
                .arg(
                    Arg::new("quiet")
                        .long("quiet")
                        .env("TOY_QUIET")
                        .action(ArgAction::SetTrue)
                        .value_parser(clap::builder::FalseyValueParser::new()),
                )
                .arg(
                    Arg::new("names")
                        .long("names")
                        .env("TOY_NAMES")
                        .value_delimiter(','),
                ),
        )
        .subcommand(Command::new("other"))
}

fn built(mut cmd: Command) -> Command {
    cmd.build();
    cmd
}

#[test]
fn subcommand_is_the_first_positional() {
    let t = built(toy());
    assert_eq!(
        subcommand_index(&t, &strings(&["serve", "--listen", "x"])),
        Some((0, "serve".into()))
    );
    assert_eq!(
        subcommand_index(&t, &strings(&["--help", "other"])),
        Some((1, "other".into()))
    );
    assert_eq!(subcommand_index(&t, &[]), None);
    let flat = built(Command::new("flat").arg(Arg::new("a").long("a")));
    assert_eq!(subcommand_index(&flat, &strings(&["x"])), None);
}

#[test]
fn env_maps_to_arguments_unless_given_on_the_command_line() {
    let t = built(toy());
    let serve = t.find_subcommand("serve").unwrap();
    let e = env_as_args(
        serve,
        &strings(&["--listen=0.0.0.0:1"]),
        &env(&[
            ("TOY_LISTEN", "0.0.0.0:2"),
            ("TOY_CONFIG", "/etc/toy/config.yaml"),
            ("TOY_VERBOSE", "true"),
            ("TOY_QUIET", "off"),
            ("TOY_NAMES", "a,b"),
            ("UNRELATED", "x"),
        ]),
    );
    assert_eq!(
        e.args,
        ["--config=/etc/toy/config.yaml", "--verbose", "--names=a,b"]
    );
    assert_eq!(e.shadowed, [("TOY_LISTEN".into(), "listen".into())]);
    assert!(e.problems.is_empty(), "{:?}", e.problems);
    assert_eq!(e.from_env.len(), 3);

    // A flag's value goes through its own value parser: bool rejects `yes`, falsey reads it.
    let e = env_as_args(
        serve,
        &strings(&["-v"]),
        &env(&[("TOY_VERBOSE", "yes"), ("TOY_QUIET", "yes")]),
    );
    assert_eq!(e.args, ["--quiet"]);
    assert_eq!(e.shadowed, [("TOY_VERBOSE".into(), "verbose".into())]);
    let e = env_as_args(serve, &[], &env(&[("TOY_VERBOSE", "yes")]));
    assert!(e.args.is_empty());
    assert_eq!(
        e.problems,
        ["TOY_VERBOSE=yes: clap rejects it: invalid value 'yes' for --verbose"]
    );

    assert!(given_on_command_line(
        serve
            .get_arguments()
            .find(|a| a.get_id() == "verbose")
            .unwrap(),
        &strings(&["-vq"])
    ));
    assert!(!given_on_command_line(
        serve
            .get_arguments()
            .find(|a| a.get_id() == "listen")
            .unwrap(),
        &strings(&["--", "--listen=x"])
    ));
    assert!(!given_on_command_line(
        serve
            .get_arguments()
            .find(|a| a.get_id() == "listen")
            .unwrap(),
        &strings(&["--listener=x"])
    ));
}

#[test]
fn unread_variables_are_found_per_subcommand() {
    let t = built(toy());
    let serve = t.find_subcommand("serve").unwrap();
    let other = t.find_subcommand("other").unwrap();
    let e = env(&[
        ("TOY_LISTEN", "x"),
        ("RAILGUARD_LOG", "debug"),
        ("RAILGUARD_SHM_SIZE", "1Gi"),
        ("NODE_NAME", "n"),
    ]);
    assert_eq!(
        unread_vars("toy", Some("serve"), &[&t, serve], &e),
        ["RAILGUARD_LOG", "RAILGUARD_SHM_SIZE"]
    );
    // Variables the prober reads outside clap.
    assert!(unread_vars("railguard-prober", Some("other"), &[&t, other], &e[1..2]).is_empty());
    assert_eq!(
        unread_vars("railguard-prober", Some("daemon"), &[&t, other], &e),
        ["RAILGUARD_SHM_SIZE"]
    );
    assert!(unread_vars("railguard-prober", Some("preflight"), &[&t, other], &e).is_empty());
}

#[test]
fn path_values_must_be_mounted_or_in_the_image() {
    let mounts = [
        Mount {
            path: "/etc/railguard/tls".into(),
            sub_path: false,
        },
        Mount {
            path: "/host/sys".into(),
            sub_path: false,
        },
        Mount {
            path: "/etc/app.yaml".into(),
            sub_path: true,
        },
    ];
    let ok = |k, v: &str| check_path(k, v, &mounts).is_ok();
    assert!(ok(PathKind::File, "/etc/railguard/tls/tls.crt"));
    assert!(ok(PathKind::File, "/etc/railguard/tls/./tls.crt"));
    assert!(ok(PathKind::File, "/etc/app.yaml"), "a subPath file mount");
    assert!(ok(PathKind::File, "/usr/local/bin/all_reduce_perf"));
    assert!(
        !ok(PathKind::File, "/etc/railguard/tls"),
        "the mount is a directory"
    );
    assert!(!ok(PathKind::File, "/etc/railguard/tlsx/tls.crt"));
    assert!(!ok(PathKind::File, "/etc/railguard/tls/../secret"));
    assert!(!ok(PathKind::Any, "/var/lib/x"));
    // A directory may be a mount point or a parent of one (sysfs root /host with /host/sys).
    assert!(ok(PathKind::Dir, "/host"));
    assert!(ok(PathKind::Dir, "/host/sys/"));
    assert!(ok(PathKind::Any, "/etc/railguard/tls"));
    assert!(!ok(PathKind::Dir, "/hos"));
    assert_eq!(
        check_path(PathKind::File, "h100-ndr", &mounts),
        Err("`h100-ndr` is not an absolute path".into())
    );
    assert_eq!(
        check_path(PathKind::File, "/data/x", &[]),
        Err("`/data/x` is not under a volumeMount (none) nor /usr/local/bin".into())
    );
    let t = built(toy());
    let serve = t.find_subcommand("serve").unwrap();
    let kind = |id: &str| path_kind(serve.get_arguments().find(|a| a.get_id() == id).unwrap());
    assert_eq!(kind("config"), Some(PathKind::File));
    assert_eq!(
        kind("data"),
        Some(PathKind::Any),
        "clap infers it for PathBuf"
    );
    assert_eq!(kind("listen"), None);
}

#[test]
fn images_map_by_repository() {
    assert!(repository_matches(
        "ghcr.io/railguard/railguard-webhook:0.1.0",
        "railguard-webhook"
    ));
    assert!(repository_matches(
        "registry.k8s.io/kube-scheduler:v1.20.2",
        "registry.k8s.io/kube-scheduler"
    ));
    assert!(repository_matches(
        "localhost:5000/railguard-prober@sha256:abc",
        "railguard-prober"
    ));
    assert!(!repository_matches(
        "ghcr.io/railguard/railguard-prober-sim:0.1.0",
        "railguard-prober"
    ));
    assert!(!repository_matches(
        "ghcr.io/x/not-railguard-webhook:1",
        "railguard-webhook"
    ));
    assert_eq!(image_repository("localhost:5000/a"), "localhost:5000/a");
}

fn webhook_container(args: &[&str], env_pairs: &[(&str, &str)]) -> Container {
    Container {
        name: "webhook".into(),
        image: "ghcr.io/railguard/railguard-webhook:0.1.0".into(),
        command: None,
        args: strings(args),
        env: env(env_pairs),
        mounts: vec![Mount {
            path: "/etc/railguard/tls".into(),
            sub_path: false,
        }],
    }
}

#[test]
fn a_deliberately_wrong_container_is_reported() {
    let webhook: fn() -> Command = railguard_webhook_cli::Cli::command;
    let good = webhook_container(
        &[
            "--tls-cert=/etc/railguard/tls/tls.crt",
            "--namespace=$(POD_NAMESPACE)",
        ],
        &[
            ("POD_NAMESPACE", "ns-a"),
            ("RAILGUARD_TLS_KEY", "/etc/railguard/tls/tls.key"),
            ("RAILGUARD_LOG_FORMAT", "json"),
        ],
    );
    assert_eq!(
        check_container("railguard-webhook", webhook, &good),
        Vec::<String>::new()
    );

    // A path argument given a bare name, an unknown variable, a shadowed different value.
    let bad = webhook_container(
        &["--tls-cert=tls.crt", "--failure-mode=open"],
        &[
            ("RAILGUARD_TLS_KEY", "/etc/railguard/tls/tls.key"),
            ("RAILGUARD_PROFILE", "h100-ndr"),
            ("RAILGUARD_FAILURE_MODE", "closed"),
        ],
    );
    let problems = check_container("railguard-webhook", webhook, &bad);
    assert_eq!(
        problems,
        [
            "env RAILGUARD_PROFILE is read by no argument of `railguard-webhook` (silently ignored)",
            "`railguard-webhook`: env RAILGUARD_FAILURE_MODE=closed is ignored: --failure-mode is on the command line (open)",
            "`railguard-webhook` --tls-cert: `tls.crt` is not an absolute path",
        ]
    );

    // An unknown flag; a key path from the environment that is not mounted.
    let bad = webhook_container(
        &["--tls-cert=/etc/railguard/tls/tls.crt", "--no-such-flag"],
        &[("RAILGUARD_TLS_KEY", "/tls.key")],
    );
    let problems = check_container("railguard-webhook", webhook, &bad);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with(
            "`railguard-webhook` rejects `--tls-cert=/etc/railguard/tls/tls.crt --no-such-flag --tls-key=/tls.key`: unexpected argument '--no-such-flag'"
        ),
        "{problems:?}"
    );
    // (The deprecated, hidden --log-json flag: a flag's variable is read by its own parser.)
    let bad = webhook_container(
        &["--tls-cert=/etc/railguard/tls/tls.crt"],
        &[
            ("RAILGUARD_TLS_KEY", "/tls.key"),
            ("RAILGUARD_LOG_JSON", "1"),
        ],
    );
    assert_eq!(
        check_container("railguard-webhook", webhook, &bad),
        [
            "`railguard-webhook`: RAILGUARD_LOG_JSON=1: clap rejects it: invalid value '1' for --log-json",
            "`railguard-webhook` --tls-key (env RAILGUARD_TLS_KEY): `/tls.key` is not under a volumeMount (/etc/railguard/tls) nor /usr/local/bin",
        ]
    );

    // A command that runs something else; the scheduler's config must be mounted.
    let mut other = good.clone();
    other.command = Some(strings(&["/bin/sh", "-c", "railguard-webhook"]));
    assert_eq!(
        check_container("railguard-webhook", webhook, &other),
        ["command runs `/bin/sh`, not /usr/local/bin/railguard-webhook"]
    );
    let mut sched = good.clone();
    sched.command = Some(strings(&[
        "kube-scheduler",
        "--config=/etc/sched/config.yaml",
    ]));
    assert_eq!(
        check_scheduler(&sched),
        ["kube-scheduler --config: `/etc/sched/config.yaml` is not under a volumeMount (/etc/railguard/tls) nor /usr/local/bin"]
    );
    sched.command = Some(strings(&[
        "kube-scheduler",
        "--config",
        "/etc/railguard/tls/c.yaml",
    ]));
    assert!(check_scheduler(&sched).is_empty());
}

#[test]
fn the_process_environment_is_not_read() {
    // clap reads `env` when the definition is built: the parsing copy has none.
    let cmd = without_env(toy());
    for sub in cmd.get_subcommands() {
        assert!(sub.get_arguments().all(|a| a.get_env().is_none()));
    }
}

/// The webhook mounts the NCCL plugin and its node file from where the prober daemon puts
/// them: `--nccl-plugin-path` is `libnccl-env-railguard.so` in the daemon's
/// `RAILGUARD_NCCL_PLUGIN_INSTALL_DIR`, `--nccl-config-path` is its
/// `RAILGUARD_NCCL_CONFIG_FILE`, in every values set (for each daemon that installs the
/// plugin: see the next test) and with the directories moved.
#[test]
fn the_webhooks_nccl_paths_are_where_the_prober_installs_and_writes() {
    let moved = ValuesSet {
        label: "ncclPlugin moved",
        values: "ncclPlugin: {hostDir: /var/lib/rg/nccl-plugin, configDir: /var/run/rg}\n\
                 fabricProfiles: {h100-ndr: {spec: {nccl: {delivery: Plugin}}}}\n",
        ..DEFAULT
    };
    let mut checked = 0;
    for set in ALL_SETS.into_iter().chain([&moved]) {
        let docs = rendered_objects(set);
        let webhook = docs
            .iter()
            .find(|d| {
                d["kind"] == "Deployment"
                    && d["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"
            })
            .expect("the webhook's Deployment");
        let args =
            Container::from_json(&pod_spec(webhook).unwrap()["containers"][0], set.namespace).args;
        let flag = |name: &str| {
            args.iter()
                .find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_string))
                .unwrap_or_else(|| panic!("{}: the webhook has no --{name}", set.label))
        };
        let (plugin_path, config_path) = (flag("nccl-plugin-path"), flag("nccl-config-path"));
        let daemons: Vec<Container> = docs
            .iter()
            .filter(|d| d["kind"] == "DaemonSet")
            .filter_map(pod_spec)
            .flat_map(|s| s["containers"].as_array().cloned().unwrap_or_default())
            .map(|c| Container::from_json(&c, set.namespace))
            .filter(|c| c.args.first().is_some_and(|a| a == "daemon"))
            .collect();
        assert!(!daemons.is_empty(), "{}: no prober daemon", set.label);
        for d in daemons {
            let env = d.env_map();
            let Some(install_dir) = env.get("RAILGUARD_NCCL_PLUGIN_INSTALL_DIR") else {
                continue;
            };
            assert_eq!(
                plugin_path,
                format!("{install_dir}/libnccl-env-railguard.so"),
                "{}: --nccl-plugin-path and the prober's install dir drifted apart",
                set.label
            );
            assert_eq!(
                config_path, env["RAILGUARD_NCCL_CONFIG_FILE"],
                "{}: --nccl-config-path and the prober's node file drifted apart",
                set.label
            );
            checked += 1;
        }
        if set.label == moved.label {
            assert_eq!(
                plugin_path,
                "/var/lib/rg/nccl-plugin/libnccl-env-railguard.so"
            );
            assert_eq!(config_path, "/var/run/rg/nccl.json");
        }
    }
    // The moved set's Plugin profile, the real-node set's `install: always` (2 profiles).
    assert!(checked >= 3, "{checked} daemons checked");
}

/// The NCCL plugin's host directories (`ncclPlugin.hostDir`, `configDir`: hostPath volumes
/// the daemon writes the plugin library and the node file into) go only to the prober
/// DaemonSet of a profile whose `spec.nccl.delivery` is `Plugin`: with the default values
/// (no Plugin profile) no prober writes the host at all; with one Plugin profile only its
/// DaemonSet mounts them and gets `RAILGUARD_NCCL_PLUGIN_INSTALL_DIR` and
/// `RAILGUARD_NCCL_CONFIG_FILE`; `ncclPlugin.install: always` gives them to every one.
#[test]
fn the_nccl_plugin_is_written_to_the_host_only_for_plugin_profiles() {
    /// The plugin's volumes, the daemon's mounts of them and its plugin variables.
    type Parts = (Vec<String>, Vec<String>, Vec<String>);
    /// Per prober DaemonSet, its [`Parts`].
    fn plugin_parts(docs: &[Json]) -> BTreeMap<String, Parts> {
        let strings = |v: &Json, key: &str| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x[key].as_str())
                .filter(|n| n.starts_with("nccl-") || n.starts_with("RAILGUARD_NCCL_"))
                .filter(|n| *n != "RAILGUARD_NCCL_LIBRARY")
                .map(str::to_string)
                .collect()
        };
        docs.iter()
            .filter(|d| d["kind"] == "DaemonSet")
            .map(|d| {
                let spec = pod_spec(d).unwrap();
                let daemon = spec["containers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["name"] == "daemon")
                    .unwrap();
                for c in spec["containers"].as_array().unwrap() {
                    if c["name"] != "daemon" {
                        assert!(
                            strings(&c["volumeMounts"], "name").is_empty(),
                            "only the daemon writes the plugin: {c}"
                        );
                    }
                }
                (
                    d["metadata"]["name"].as_str().unwrap().to_string(),
                    (
                        strings(&spec["volumes"], "name"),
                        strings(&daemon["volumeMounts"], "name"),
                        strings(&daemon["env"], "name"),
                    ),
                )
            })
            .collect()
    }
    let none = || (Vec::new(), Vec::new(), Vec::new());
    let all = || {
        (
            vec!["nccl-plugin".to_string(), "nccl-config".to_string()],
            vec!["nccl-plugin".to_string(), "nccl-config".to_string()],
            vec![
                "RAILGUARD_NCCL_PLUGIN_INSTALL_DIR".to_string(),
                "RAILGUARD_NCCL_CONFIG_FILE".to_string(),
            ],
        )
    };
    let cases = [
        (DEFAULT, [none(), none()]),
        (
            ValuesSet {
                label: "h100-ndr delivers through the plugin",
                values: "fabricProfiles: {h100-ndr: {spec: {nccl: {delivery: Plugin}}}}\n",
                ..DEFAULT
            },
            [none(), all()],
        ),
        (
            ValuesSet {
                label: "both profiles say Env",
                values: "fabricProfiles: {h100-ndr: {spec: {nccl: {delivery: Env}}}}\n",
                ..DEFAULT
            },
            [none(), none()],
        ),
        (
            ValuesSet {
                label: "ncclPlugin.install always",
                values: "ncclPlugin: {install: always}\n",
                ..DEFAULT
            },
            [all(), all()],
        ),
    ];
    for (set, [a100, h100]) in cases {
        let docs = rendered_objects(&set);
        let parts = plugin_parts(&docs);
        let want = BTreeMap::from([
            ("railguard-prober-a100-hdr".to_string(), a100),
            ("railguard-prober-h100-ndr".to_string(), h100),
        ]);
        assert_eq!(parts, want, "{}", set.label);
    }
    // A profile that is Plugin but disabled puts nothing anywhere.
    let docs = rendered_objects(&ValuesSet {
        label: "the RoCE profile is Plugin, and off",
        values: "fabricProfiles: {roce-cloud: {spec: {nccl: {delivery: Plugin}}}}\n",
        ..DEFAULT
    });
    assert!(plugin_parts(&docs).values().all(|p| *p == none()));
    // The schema knows the two modes only.
    let out = railguard_tests::helm::shared()
        .template_output(
            &ValuesSet {
                label: "install typo",
                values: "ncclPlugin: {install: sometimes}\n",
                ..DEFAULT
            },
            &railguard_tests::helm::kube_1_20_api_versions(),
            railguard_tests::helm::KUBE_1_20_VERSION,
        )
        .unwrap();
    assert!(!out.status.success(), "install: sometimes rendered");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ncclPlugin") && err.contains("install"),
        "{err}"
    );
}

/// The prober containers of `docs`: (DaemonSet name, container, the pod's volumes).
fn prober_containers(docs: &[Json], namespace: &str) -> Vec<(String, Container, Json)> {
    docs.iter()
        .filter(|d| d["kind"] == "DaemonSet")
        .filter_map(|d| {
            let spec = pod_spec(d)?;
            Some((d["metadata"]["name"].as_str()?.to_string(), spec.clone()))
        })
        .flat_map(|(name, spec)| {
            spec["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |c| {
                    (
                        name.clone(),
                        Container::from_json(&c, namespace),
                        spec["volumes"].clone(),
                    )
                })
        })
        .collect()
}

/// Which NCCL certifies a node is the chart's `prober.gpuLibraries.ncclLibrary`: left empty,
/// no prober container names a library, so the binary loads the image's
/// (`railguard_gpu::BUNDLED_NCCL_LIBRARY`, where docker/prober.Dockerfile puts the wheel's
/// libnccl.so.2); set with `hostPath`, the daemon and the peer endpoint of every profile
/// load the node's file through the read-only mount of that directory, and still parse.
#[test]
fn the_probers_nccl_is_the_images_unless_the_values_choose_the_nodes() {
    let dockerfile = std::fs::read_to_string(workspace_root().join("docker/prober.Dockerfile"))
        .expect("docker/prober.Dockerfile");
    let bundled = railguard_gpu::BUNDLED_NCCL_LIBRARY;
    assert!(
        dockerfile
            .lines()
            .any(|l| l.starts_with("COPY --from=") && l.ends_with(&format!(" {bundled}"))),
        "the default image puts no libnccl.so.2 at {bundled}"
    );
    let images = rendered_objects(&DEFAULT);
    let probers = prober_containers(&images, DEFAULT.namespace);
    assert!(probers.len() >= 2, "{} prober containers", probers.len());
    for (ds, c, _) in &probers {
        let env = c.env_map();
        assert!(
            !env.contains_key("RAILGUARD_NCCL_LIBRARY")
                && !env.contains_key("RAILGUARD_CUDA_LIBRARY"),
            "{ds}/{}: the image's NCCL by default, got {env:?}",
            c.name
        );
        assert!(
            !c.args.iter().any(|a| a.starts_with("--nccl-library")),
            "{ds}/{}: no --nccl-library on the command line",
            c.name
        );
    }

    let node = ValuesSet {
        label: "the node's NCCL",
        values: "prober:\n  gpuLibraries: {hostPath: /usr/lib/x86_64-linux-gnu, ncclLibrary: libnccl.so.2}\n",
        ..DEFAULT
    };
    let (problems, _) = contract_problems(&node);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let docs = rendered_objects(&node);
    let probers = prober_containers(&docs, node.namespace);
    let mut daemons = 0;
    for (ds, c, volumes) in &probers {
        let env = c.env_map();
        assert_eq!(
            env.get("RAILGUARD_NCCL_LIBRARY").map(String::as_str),
            Some("/run/railguard/gpu-libs/libnccl.so.2"),
            "{ds}/{}",
            c.name
        );
        assert!(
            !env.contains_key("RAILGUARD_CUDA_LIBRARY"),
            "{ds}/{}: only NCCL was chosen",
            c.name
        );
        assert!(
            c.mounts.iter().any(|m| m.path == "/run/railguard/gpu-libs"),
            "{ds}/{}: {:?}",
            c.name,
            c.mounts
        );
        let lib_dir = volumes
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == "gpu-libs")
            .map(|v| v["hostPath"]["path"].clone());
        assert_eq!(
            lib_dir,
            Some(Json::from("/usr/lib/x86_64-linux-gnu")),
            "{ds}: the node's directory"
        );
        daemons += usize::from(c.args.first().is_some_and(|a| a == "daemon"));
    }
    assert!(daemons >= 1 && probers.len() >= 2 * daemons, "{probers:?}");
}

/// The chart is released with the binaries: its `version` and `appVersion` (the default image
/// tag) are the workspace's version, so a release bumps both or this fails.
#[test]
fn chart_version_and_app_version_are_the_workspace_version() {
    let text = std::fs::read_to_string(workspace_root().join("charts/railguard/Chart.yaml"))
        .expect("Chart.yaml");
    let chart: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("Chart.yaml parses");
    let field = |k: &str| chart[k].as_str().map(str::to_string);
    let workspace = env!("CARGO_PKG_VERSION");
    assert_eq!(
        field("version").as_deref(),
        Some(workspace),
        "Chart.yaml version"
    );
    assert_eq!(
        field("appVersion").as_deref(),
        Some(workspace),
        "Chart.yaml appVersion"
    );
}

/// `--name=N` among a container's args.
fn seconds_arg(container: &Json, name: &str) -> Option<u64> {
    container["args"]
        .as_array()?
        .iter()
        .filter_map(Json::as_str)
        .find_map(|a| a.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
}

/// A draining webhook or extender is never killed by the kubelet before it has drained and
/// finished its requests: the pod's terminationGracePeriodSeconds exceeds every draining
/// container's `--shutdown-delay-seconds` + `--shutdown-grace-seconds` (issue #43).
#[test]
fn every_draining_container_gets_its_delay_and_grace_before_the_kubelet_kills_it() {
    let mut checked = 0;
    for set in ALL_SETS {
        for obj in rendered_objects(set) {
            let Some(spec) = pod_spec(&obj) else { continue };
            // The kubelet's default when the field is absent.
            let termination = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
            for c in spec["containers"].as_array().into_iter().flatten() {
                let delay = seconds_arg(c, "--shutdown-delay-seconds");
                let grace = seconds_arg(c, "--shutdown-grace-seconds");
                let (Some(delay), Some(grace)) = (delay, grace) else {
                    continue;
                };
                checked += 1;
                assert!(
                    delay >= 5 && termination > delay + grace,
                    "{}: {} {} container {}: delay {delay} s, grace {grace} s, terminationGracePeriodSeconds {termination}",
                    set.label,
                    obj["kind"],
                    obj["metadata"]["name"],
                    c["name"]
                );
            }
        }
    }
    // The webhook and the extender (sidecar or Deployment) of every values set.
    assert!(
        checked >= 2 * ALL_SETS.len(),
        "{checked} draining containers checked"
    );
}

/// What makes a pod a GPU pod for the probers and the campaign is one list: the chart's
/// `prober.gpuResources` is rendered as RAILGUARD_GPU_RESOURCES of every prober and campaign
/// container, and equals the binaries' `--gpu-resources` default (MIG and time-sliced
/// patterns included), so a pod the chart counts is counted by a hand-run daemon too.
#[test]
fn the_gpu_resource_patterns_are_the_binaries_defaults() {
    let cli = railguard_prober_cli::Cli::command();
    let default_of = |sub: &str| -> String {
        let arg = cli
            .find_subcommand(sub)
            .unwrap_or_else(|| panic!("no {sub} subcommand"))
            .get_arguments()
            .find(|a| a.get_long() == Some("gpu-resources"))
            .unwrap_or_else(|| panic!("{sub} has no --gpu-resources"))
            .clone();
        arg.get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(",")
    };
    let daemon = default_of("daemon");
    assert!(daemon.contains("nvidia.com/mig-*"), "{daemon}");
    assert_eq!(default_of("campaign"), daemon);
    assert_eq!(default_of("peer-endpoint"), daemon);
    let mut seen = 0;
    for obj in rendered_objects(&DEFAULT) {
        let Some(spec) = pod_spec(&obj) else { continue };
        for c in spec["containers"].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                if e["name"] == "RAILGUARD_GPU_RESOURCES" {
                    assert_eq!(e["value"], daemon.as_str(), "{}", c["name"]);
                    seen += 1;
                }
            }
        }
    }
    assert!(
        seen >= 2,
        "the daemon and the peer endpoint at least: {seen}"
    );
}

/// The daemon runs the same whether the chart or a hand-run daemon starts it: each of these
/// env vars of the daemon container (from `prober.telemetry.*`) equals its flag's default in
/// the binary, and no other container sets it.
#[test]
fn the_daemons_chart_env_is_the_binarys_default() {
    for (flag, env, expected) in [
        (
            "telemetry-interval-ms",
            "RAILGUARD_TELEMETRY_INTERVAL_MS",
            "1000",
        ),
        ("grey-rails", "RAILGUARD_GREY_RAILS", "observe"),
    ] {
        daemon_env_is_the_default(flag, env, expected);
    }
}

fn daemon_env_is_the_default(flag: &str, env: &str, expected: &str) {
    let cli = railguard_prober_cli::Cli::command();
    let default: String = cli
        .find_subcommand("daemon")
        .unwrap_or_else(|| panic!("no daemon subcommand"))
        .get_arguments()
        .find(|a| a.get_long() == Some(flag))
        .unwrap_or_else(|| panic!("daemon has --{flag}"))
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    assert_eq!(default, expected);
    let mut seen = 0;
    for obj in rendered_objects(&DEFAULT) {
        let Some(spec) = pod_spec(&obj) else { continue };
        for c in spec["containers"].as_array().into_iter().flatten() {
            let value = c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["name"] == env)
                .map(|e| e["value"].clone());
            if c["name"] == "daemon" {
                assert_eq!(
                    value,
                    Some(default.as_str().into()),
                    "{}",
                    obj["metadata"]["name"]
                );
                seen += 1;
            } else {
                assert_eq!(value, None, "{}: only the daemon reads {env}", c["name"]);
            }
        }
    }
    assert!(seen >= 1, "no daemon container rendered");
}

/// The daemon and the peer endpoint exclude each other's tests through one lock file
/// (`--test-lock-file`): the chart must give both containers the same path, on a volume both
/// mount at the same place, or each would lock a file of its own and the exclusion be void.
#[test]
fn the_daemon_and_the_peer_endpoint_share_one_test_lock() {
    let mut probers = 0;
    for obj in rendered_objects(&DEFAULT) {
        if obj["kind"] != "DaemonSet" {
            continue;
        }
        let Some(spec) = pod_spec(&obj) else { continue };
        let containers = spec["containers"].as_array().unwrap();
        let of = |name: &str| containers.iter().find(|c| c["name"] == name);
        let (Some(daemon), Some(endpoint)) = (of("daemon"), of("peer-endpoint")) else {
            continue;
        };
        probers += 1;
        let lock = |c: &Json| -> (String, String) {
            let path = c["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "RAILGUARD_TEST_LOCK_FILE")
                .and_then(|e| e["value"].as_str())
                .unwrap_or_else(|| panic!("{}: no RAILGUARD_TEST_LOCK_FILE", c["name"]))
                .to_string();
            // The innermost mount holding the path (mounts may nest).
            let volume = c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| path.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap())))
                .max_by_key(|m| m["mountPath"].as_str().unwrap().len())
                .unwrap_or_else(|| panic!("{}: {path} is on no mounted volume", c["name"]))["name"]
                .as_str()
                .unwrap()
                .to_string();
            (path, volume)
        };
        let (path, volume) = lock(daemon);
        assert_eq!(lock(endpoint), (path, volume.clone()));
        let v = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == volume.as_str())
            .expect("the lock's volume");
        assert!(v.get("emptyDir").is_some(), "{v}");
    }
    assert!(probers >= 1, "no prober DaemonSet rendered");
}

/// Taints named in `prober.holdTaints` hold the daemon's invasive runs and the campaign's
/// tests: the chart renders them, comma-separated as the binaries read `--hold-taints`, into
/// both containers, and by default renders none, as the binaries default to none.
#[test]
fn the_hold_taints_reach_the_daemon_and_the_campaign_as_the_binaries_read_them() {
    let cli = railguard_prober_cli::Cli::command();
    for sub in ["daemon", "campaign"] {
        let arg = cli
            .find_subcommand(sub)
            .unwrap_or_else(|| panic!("no {sub} subcommand"))
            .get_arguments()
            .find(|a| a.get_long() == Some("hold-taints"))
            .unwrap_or_else(|| panic!("{sub} has no --hold-taints"))
            .clone();
        assert!(arg.get_default_values().is_empty(), "{sub}");
        assert_eq!(arg.get_value_delimiter(), Some(','), "{sub}");
        assert_eq!(
            arg.get_env().map(|e| e.to_string_lossy().into_owned()),
            Some("RAILGUARD_HOLD_TAINTS".to_string()),
            "{sub}"
        );
    }
    let holds = |set: &ValuesSet| -> Vec<(String, String)> {
        let mut out = Vec::new();
        for obj in rendered_objects(set) {
            let Some(spec) = pod_spec(&obj) else { continue };
            for c in spec["containers"].as_array().into_iter().flatten() {
                for e in c["env"].as_array().into_iter().flatten() {
                    if e["name"] == "RAILGUARD_HOLD_TAINTS" {
                        out.push((
                            c["name"].as_str().unwrap_or_default().to_string(),
                            e["value"].as_str().unwrap_or_default().to_string(),
                        ));
                    }
                }
            }
        }
        out
    };
    let default = holds(&DEFAULT);
    assert!(!default.is_empty());
    assert!(default.iter().all(|(_, v)| v.is_empty()), "{default:?}");
    const HELD: ValuesSet = ValuesSet {
        label: "hold taints and a campaign",
        values: "prober:\n  holdTaints: [nvidia.com/gpu-health, \"*.example.com/quarantine=true\"]\n  campaign:\n    enabled: true\n",
        ..DEFAULT
    };
    let held = holds(&HELD);
    let containers: std::collections::BTreeSet<&str> =
        held.iter().map(|(c, _)| c.as_str()).collect();
    assert!(
        containers.len() >= 2,
        "the daemon and the campaign: {held:?}"
    );
    assert!(
        held.iter()
            .all(|(_, v)| v == "nvidia.com/gpu-health,*.example.com/quarantine=true"),
        "{held:?}"
    );
}
