//! README's command reference is generated from the binaries' own clap definitions and must
//! be up to date, so it cannot drift: the tables between `<!-- reference:start -->` and
//! `<!-- reference:end -->` are exactly what [`reference`] renders. After changing a flag:
//!
//! ```sh
//! RAILGUARD_UPDATE_README=1 cargo test -p railguard-tests --test readme_reference
//! ```
//!
//! Also checked here: every flag is also a `RAILGUARD_*` variable, every binary and prober
//! subcommand shows an example invocation in `--help`, and the "Configuration variables"
//! table names each variable's real flag.

use std::collections::BTreeMap;

use clap::{Arg, Command, CommandFactory};
use railguard_tests::workspace_root;

const START: &str = "<!-- reference:start -->";
const END: &str = "<!-- reference:end -->";

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
fn readme_reference_matches_the_clap_definitions() {
    let path = workspace_root().join("README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md");
    let (Some(start), Some(end)) = (readme.find(START), readme.find(END)) else {
        panic!("README.md has no {START} ... {END} block");
    };
    let current = &readme[start + START.len()..end];
    let wanted = reference();
    if current == wanted {
        return;
    }
    if std::env::var_os("RAILGUARD_UPDATE_README").is_some() {
        let updated = format!(
            "{}{wanted}{}",
            &readme[..start + START.len()],
            &readme[end..]
        );
        std::fs::write(&path, updated).expect("write README.md");
        return;
    }
    let first_difference = current
        .lines()
        .zip(wanted.lines())
        .find(|(a, b)| a != b)
        .map(|(a, b)| format!("README: {a}\nclap:   {b}"))
        .unwrap_or_else(|| "(one is a prefix of the other)".into());
    panic!(
        "README's command reference is stale; run\n  RAILGUARD_UPDATE_README=1 cargo test -p railguard-tests --test readme_reference\nfirst difference:\n{first_difference}"
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

/// README's "Configuration variables" table: each variable is the flag it says, wherever
/// the binaries read it; variables not read by clap are named in [`OUTSIDE_CLAP`].
const OUTSIDE_CLAP: [&str; 1] = ["RAILGUARD_LOG"];

#[test]
fn configuration_variables_table_names_the_real_flags() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).expect("README.md");
    let start = readme
        .find("\n## Configuration variables\n")
        .expect("a Configuration variables section");
    let section = &readme[start + 1..];
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
                Some(real) if real.iter().any(|f| f != want) => {
                    problems.push(format!("{var}: README says {want}, clap says {real:?}"))
                }
                Some(_) => {}
            }
        }
    }
    assert!(rows >= 8, "only {rows} rows found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
