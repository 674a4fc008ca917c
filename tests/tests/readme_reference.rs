//! The command reference in `docs/reference.md` is generated from the binaries' own clap
//! definitions and must be up to date, so it cannot drift: the tables between
//! `<!-- reference:start -->` and `<!-- reference:end -->` are exactly what [`reference`]
//! renders. After changing a flag:
//!
//! ```sh
//! RAILGUARD_UPDATE_README=1 cargo test -p railguard-tests --test readme_reference
//! ```
//!
//! Also checked here: every flag is also a `RAILGUARD_*` variable, every binary and prober
//! subcommand shows an example invocation in `--help`, the "Configuration variables" table
//! of `docs/reference.md` names each variable's real flag, README.md stays a page a newcomer
//! reads to the end (at most [`README_MAX_LINES`] lines, its two set-up commands first), and
//! every relative link of README.md and `docs/*.md` reaches an existing file (and heading).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use clap::{Arg, Command, CommandFactory};
use railguard_tests::workspace_root;

const START: &str = "<!-- reference:start -->";
const END: &str = "<!-- reference:end -->";
/// Where the generated command reference and the "Configuration variables" table live.
const REFERENCE: &str = "docs/reference.md";

fn binaries() -> Vec<Command> {
    let mut cmds = vec![
        railguard_webhook_cli::Cli::command(),
        railguard_extender_cli::Cli::command(),
        railguard_prober_cli::Cli::command(),
    ];
    for c in &mut cmds {
        c.build();
    }
    cmds
}

/// Flags shown in the reference: not hidden, not clap's own help/version.
fn flags(cmd: &Command, with_globals: bool) -> Vec<&Arg> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .filter(|a| with_globals || !a.is_global_set())
        .collect()
}

fn cell(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn row(a: &Arg) -> String {
    let mut flag = match (a.get_long(), a.get_short()) {
        (Some(l), Some(s)) => format!("`-{s}`, `--{l}`"),
        (Some(l), None) => format!("`--{l}`"),
        (None, Some(s)) => format!("`-{s}`"),
        (None, None) => format!("`<{}>`", a.get_id()),
    };
    if let Some(aliases) = a.get_visible_aliases() {
        for al in aliases {
            flag.push_str(&format!(", `--{al}`"));
        }
    }
    let var = a
        .get_env()
        .map(|v| format!("`{}`", v.to_string_lossy()))
        .unwrap_or_default();
    let takes_value = a.get_action().takes_values();
    let defaults: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    let default = if !takes_value {
        "switch".to_string()
    } else if defaults.is_empty() {
        String::new()
    } else {
        format!("`{}`", defaults.join(","))
    };
    let mut meaning = a.get_help().map(|h| h.to_string()).unwrap_or_default();
    if !meaning.is_empty() && !meaning.ends_with(['.', '?', ')']) {
        meaning.push('.');
    }
    let values: Vec<String> = a
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if takes_value && !values.is_empty() {
        meaning.push_str(&format!(" One of {}.", values.join(", ")));
    }
    format!("| {flag} | {var} | {default} | {} |", cell(&meaning))
}

fn table(title: &str, about: &str, args: &[&Arg]) -> String {
    let mut out = format!("{title}\n\n");
    if !about.is_empty() {
        out.push_str(&format!("{}\n\n", cell(about)));
    }
    out.push_str("| flag | variable | default | meaning |\n|---|---|---|---|\n");
    for a in args {
        out.push_str(&row(a));
        out.push('\n');
    }
    out
}

fn about(cmd: &Command) -> String {
    cmd.get_about().map(|a| a.to_string()).unwrap_or_default()
}

/// The generated reference (the text between the markers, markers excluded).
fn reference() -> String {
    let mut out = String::from(
        "\n<!-- Generated from the clap definitions by tests/tests/readme_reference.rs; do not edit. -->\n\n",
    );
    for cmd in binaries() {
        let name = cmd.get_name().to_string();
        out.push_str(&table(
            &format!("### `{name}`"),
            &about(&cmd),
            &flags(&cmd, true),
        ));
        out.push('\n');
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            out.push_str(&table(
                &format!("#### `{name} {}`", sub.get_name()),
                &about(sub),
                &flags(sub, false),
            ));
            out.push('\n');
        }
    }
    out
}

#[test]
fn command_reference_matches_the_clap_definitions() {
    let path = workspace_root().join(REFERENCE);
    let doc = std::fs::read_to_string(&path).expect(REFERENCE);
    let (Some(start), Some(end)) = (doc.find(START), doc.find(END)) else {
        panic!("{REFERENCE} has no {START} ... {END} block");
    };
    let current = &doc[start + START.len()..end];
    let wanted = reference();
    if current == wanted {
        return;
    }
    if std::env::var_os("RAILGUARD_UPDATE_README").is_some() {
        let updated = format!("{}{wanted}{}", &doc[..start + START.len()], &doc[end..]);
        std::fs::write(&path, updated).expect("write the reference");
        return;
    }
    let first_difference = current
        .lines()
        .zip(wanted.lines())
        .find(|(a, b)| a != b)
        .map(|(a, b)| format!("{REFERENCE}: {a}\nclap:   {b}"))
        .unwrap_or_else(|| "(one is a prefix of the other)".into());
    panic!(
        "the command reference in {REFERENCE} is stale; run\n  RAILGUARD_UPDATE_README=1 cargo test -p railguard-tests --test readme_reference\nfirst difference:\n{first_difference}"
    );
}

/// The generated reference lives in docs/reference.md only: README links to it instead.
#[test]
fn readme_holds_no_generated_reference() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).expect("README.md");
    assert!(
        !readme.contains(START) && !readme.contains(END),
        "README.md has a generated reference block; it belongs in {REFERENCE}"
    );
    assert!(
        readme.contains(&format!("]({REFERENCE}#command-reference)")),
        "README.md does not link {REFERENCE}#command-reference"
    );
}

#[test]
fn every_flag_is_also_a_railguard_variable() {
    let mut missing = Vec::new();
    for cmd in binaries() {
        let name = cmd.get_name().to_string();
        let mut check = |path: &str, c: &Command| {
            for a in flags(c, true) {
                let var = a.get_env().map(|v| v.to_string_lossy().into_owned());
                if !var.as_deref().is_some_and(|v| v.starts_with("RAILGUARD_")) {
                    missing.push(format!("`{path}` --{}", a.get_long().unwrap_or_default()));
                }
            }
        };
        check(&name, &cmd);
        for sub in cmd.get_subcommands() {
            check(&format!("{name} {}", sub.get_name()), sub);
        }
    }
    assert!(
        missing.is_empty(),
        "flags without a RAILGUARD_ variable:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_help_shows_an_example_invocation() {
    for mut cmd in binaries() {
        let name = cmd.get_name().to_string();
        let help = cmd.render_long_help().to_string();
        assert!(
            help.contains("Example") && help.contains(&format!("  {name} ")),
            "{name} --help has no example:\n{help}"
        );
        assert!(
            help.contains("Exit status"),
            "{name} --help: no exit status"
        );
        for sub in cmd.get_subcommands_mut().filter(|s| s.get_name() != "help") {
            let sub_name = sub.get_name().to_string();
            let help = sub.render_long_help().to_string();
            assert!(
                help.contains(&format!("{name} {sub_name} ")),
                "{name} {sub_name} --help has no example:\n{help}"
            );
        }
    }
}

/// The "Configuration variables" table of docs/reference.md: each variable is the flag it says, wherever
/// the binaries read it; variables not read by clap are named in [`OUTSIDE_CLAP`].
const OUTSIDE_CLAP: [&str; 1] = ["RAILGUARD_LOG"];

#[test]
fn configuration_variables_table_names_the_real_flags() {
    let doc = std::fs::read_to_string(workspace_root().join(REFERENCE)).expect(REFERENCE);
    let start = doc
        .find("\n## Configuration variables\n")
        .expect("a Configuration variables section");
    let section = &doc[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let mut flags_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for cmd in binaries() {
        let mut all = vec![cmd.clone()];
        all.extend(cmd.get_subcommands().cloned());
        for c in &all {
            for a in c.get_arguments() {
                if let (Some(var), Some(long)) = (a.get_env(), a.get_long()) {
                    flags_of
                        .entry(var.to_string_lossy().into_owned())
                        .or_default()
                        .push(format!("--{long}"));
                }
            }
        }
    }
    let mut rows = 0;
    let mut problems = Vec::new();
    for line in section[..end].lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 || !cells[1].starts_with('`') {
            continue;
        }
        rows += 1;
        let vars: Vec<String> = cells[1]
            .split(" / ")
            .map(|v| v.trim_matches('`').to_string())
            .collect();
        let flags: Vec<String> = cells[2]
            .split(" / ")
            .map(|v| v.trim_matches('`').to_string())
            .collect();
        for (i, var) in vars.iter().enumerate() {
            if OUTSIDE_CLAP.contains(&var.as_str()) {
                continue;
            }
            let Some(want) = flags.get(i).or(flags.last()) else {
                problems.push(format!("{var}: no flag in the table"));
                continue;
            };
            match flags_of.get(var) {
                None => problems.push(format!("{var}: no binary reads it")),
                Some(real) if real.iter().any(|f| f != want) => problems.push(format!(
                    "{var}: {REFERENCE} says {want}, clap says {real:?}"
                )),
                Some(_) => {}
            }
        }
    }
    assert!(rows >= 8, "only {rows} rows found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// README.md is the page a newcomer reads to the end; the rest is in docs/.
const README_MAX_LINES: usize = 320;

/// The two set-up commands README.md opens with, exactly.
const SET_UP: [&str; 2] = [
    "./demo.sh                  # the demo: real kube-apiserver + kube-scheduler, webhook, extender, six simulated DGX H100 nodes",
    "tests/scripts/test-all.sh  # all tests (installs prerequisites with apt, builds and caches the local control plane)",
];

#[test]
fn readme_is_short_and_opens_with_its_two_set_up_commands() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).expect("README.md");
    let lines: Vec<&str> = readme.lines().collect();
    assert!(
        lines.len() <= README_MAX_LINES,
        "README.md has {} lines, more than {README_MAX_LINES}: move detail into docs/ and link it",
        lines.len()
    );
    assert_eq!(
        lines.get(..5),
        Some(&["# railguard", "", "```", SET_UP[0], SET_UP[1]][..]),
        "README.md no longer opens with its two set-up commands"
    );
    assert_eq!(lines.get(5), Some(&"```"));
}

/// The text outside fenced code blocks, with inline code spans blanked: what renders as
/// Markdown, where headings and links are. A code span may go on over a line break, never
/// over a blank line.
fn prose(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            in_code = false;
            continue;
        }
        if fenced {
            continue;
        }
        if line.trim().is_empty() {
            in_code = false;
        }
        let kept: String = line
            .chars()
            .map(|c| {
                if c == '`' {
                    in_code = !in_code;
                    ' '
                } else if in_code {
                    ' '
                } else {
                    c
                }
            })
            .collect();
        out.push(kept);
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// turned into `-` (inline code and emphasis marks go with the punctuation).
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The anchors a Markdown file's headings give (a repeated heading gets `-1`, `-2`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let base = slug(title.trim());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// Every `[text](target)` and `![alt](target)` target of the rendered text.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(close) = rest.find(')') else { break };
            out.push(rest[..close].trim().to_string());
            rest = &rest[close + 1..];
        }
    }
    out
}

/// README.md and every `docs/*.md`: each relative link (and image) reaches an existing
/// file, and a `#anchor` into a Markdown file one of its headings.
#[test]
fn every_relative_link_of_readme_and_docs_reaches_a_file() {
    let root = workspace_root();
    let mut problems = Vec::new();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "no docs/*.md");
    files.extend(docs);
    let mut links = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a Markdown file");
        let name = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let dir = file.parent().expect("a directory").to_path_buf();
        for target in link_targets(&text) {
            if target.is_empty() {
                problems.push(format!("{name}: an empty link"));
                continue;
            }
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            links += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved: PathBuf = if path.is_empty() {
                file.clone()
            } else if path.starts_with('/') {
                problems.push(format!(
                    "{name}: `{target}` is absolute; link relative to the file"
                ));
                continue;
            } else {
                dir.join(path)
            };
            let Ok(resolved) = resolved.canonicalize() else {
                problems.push(format!("{name}: `{target}` does not exist"));
                continue;
            };
            let Some(anchor) = anchor else { continue };
            if resolved.extension().is_some_and(|e| e == "md") {
                let linked = std::fs::read_to_string(&resolved).expect("the linked file");
                if !anchors(&linked).contains(anchor) {
                    problems.push(format!("{name}: `{target}`: no heading gives #{anchor}"));
                }
            }
        }
    }
    assert!(links >= 20, "only {links} relative links found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_link_checker_finds_links_and_anchors() {
    let text = "# Top\n\n## `certify --json`\n\n## Rails → devices (`a::b`)\n\n## Top\n\n```sh\n# not a heading\n[no](link.md)\n```\nSee [a](x.md#y), ![b](c.png) and `[code](z.md)`, `a\nspan` [d](e.md).\n";
    assert_eq!(link_targets(text), ["x.md#y", "c.png", "e.md"]);
    let got = anchors(text);
    let want: BTreeSet<String> = ["top", "certify---json", "rails--devices-ab", "top-1"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(got, want);
}
