//! `sidecar/README.md`'s settings table stays true: every environment variable the sidecar
//! reads has a row, and every row names one it reads. A setting added without a row, or a row
//! left behind by a removed or renamed setting, fails here.
//!
//! The names come from the parser itself (`Config`'s clap arguments, each with its `env`),
//! plus the two the binary reads for its log (`LOG_LEVEL`, `LOG_FORMAT`), found in its source.

use clap::CommandFactory;
use realtime_sidecar::config::Config;
use std::collections::BTreeSet;
use std::path::Path;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The first cells of the first table under `## Settings`.
fn documented(readme: &str) -> Vec<String> {
    let section = readme
        .split("\n## Settings\n")
        .nth(1)
        .expect("sidecar/README.md has a `## Settings` section");
    let section = section.split("\n## ").next().unwrap();
    let table: Vec<&str> = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // the header and its |---| line
        .collect();
    table
        .iter()
        .map(|row| {
            let cell = row.split('|').nth(1).unwrap().trim();
            let name = cell.strip_prefix('`').and_then(|c| c.strip_suffix('`'));
            name.unwrap_or_else(|| panic!("a settings row's first cell is not `NAME`: {row}"))
                .to_string()
        })
        .collect()
}

/// What the sidecar reads from its environment.
fn read_by_the_sidecar() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = Config::command()
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    let bin = read("src/bin/realtime-sidecar.rs");
    for name in ["LOG_LEVEL", "LOG_FORMAT"] {
        assert!(
            bin.contains(&format!("\"{name}\"")),
            "the binary no longer reads {name}: its row and this list go"
        );
        names.insert(name.to_string());
    }
    names
}

#[test]
fn every_setting_has_one_row_and_every_row_is_a_setting() {
    let rows = documented(&read("README.md"));
    let unique: BTreeSet<String> = rows.iter().cloned().collect();
    assert_eq!(unique.len(), rows.len(), "a setting has two rows: {rows:?}");
    let names = read_by_the_sidecar();
    assert!(names.len() > 50, "too few settings read: {names:?}");
    let missing: Vec<_> = names.difference(&unique).collect();
    let stale: Vec<_> = unique.difference(&names).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "sidecar/README.md's settings table: no row for {missing:?}; rows for no setting: {stale:?}"
    );
}
