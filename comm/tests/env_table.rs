//! Every `OXTRAIN_*` variable of comm is read only by its options type and is in the README's
//! table, and the table names no variable the sources no longer know. Unit-test modules (at the
//! end of a file, as `#[cfg(test)] mod tests`) are left out: their variables are CI's switches.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The types that read the environment (see the README's "Environment variables").
const READERS: [&str; 3] = ["src/options.rs", "src/shm/options.rs", "src/nvshmem/options.rs"];

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs" || e == "cu") {
            out.push(path);
        }
    }
}

/// The `OXTRAIN_*` names in `text` (a name ending in `_` is a prefix, as in `OXTRAIN_SHM_*`).
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("OXTRAIN_") {
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !name.ends_with('_') {
            out.insert(name);
        }
    }
    out
}

#[test]
fn every_variable_is_read_by_its_options_type_and_listed_in_the_readme() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let table: BTreeSet<String> =
        readme.lines().filter(|l| l.starts_with("| `OXTRAIN_")).flat_map(names).collect();

    let mut sources = Vec::new();
    files(&root.join("src"), &mut sources);
    let mut used = BTreeSet::new();
    let mut misplaced = Vec::new();
    for path in &sources {
        let whole = std::fs::read_to_string(path).unwrap();
        // A unit-test module's own switches (OXTRAIN_REQUIRE_*, set by CI) are not options.
        let text = whole.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
        used.extend(names(text));
        let rel = path.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
        // A variable is read through a literal that is its whole name; messages that mention one
        // start with other words, and tests look for it in messages with `contains`.
        if READERS.contains(&rel.as_str()) {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            for name in names(line) {
                let literal = format!("\"{name}\"");
                let read = line.match_indices(&literal).any(|(i, _)| !line[..i].ends_with("contains("));
                if read {
                    misplaced.push(format!("{rel}:{}: {name}", n + 1));
                }
            }
        }
    }
    assert!(misplaced.is_empty(), "read outside the options types ({READERS:?}): {misplaced:#?}");
    let missing: Vec<_> = used.difference(&table).collect();
    assert!(missing.is_empty(), "variables the README's table lacks: {missing:?}");
    let stale: Vec<_> = table.difference(&used).collect();
    assert!(stale.is_empty(), "the README's table lists variables no source mentions: {stale:?}");
}
