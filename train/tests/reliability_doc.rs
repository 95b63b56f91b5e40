//! docs/reliability.md names, in the last column of its tables, the test behind each promise
//! as `path/to/file.rs::function`. This checks every one exists, so the page cannot claim a
//! test that was renamed or removed.

use std::path::Path;

/// The last column's header in the page's tables.
const TEST_COLUMNS: [&str; 2] = ["Test", "Replayed on stable by"];

/// `(path, function)` of every table row's test reference; a row with none is an error.
fn references(doc: &str) -> Result<Vec<(String, String)>, String> {
    let mut refs = vec![];
    for line in doc.lines().filter(|l| l.starts_with('|') && !l.starts_with("| ---")) {
        let last = line.trim_end().trim_end_matches('|').rsplit('|').next().unwrap_or("").trim();
        if TEST_COLUMNS.contains(&last) {
            continue;
        }
        let reference =
            last.strip_prefix('`').and_then(|s| s.strip_suffix('`')).and_then(|s| s.rsplit_once("::"));
        match reference {
            Some((path, function)) => refs.push((path.to_string(), function.to_string())),
            None => return Err(format!("a row names no test as `path.rs::function`: {line}")),
        }
    }
    Ok(refs)
}

#[test]
fn every_test_named_in_the_reliability_page_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let doc = std::fs::read_to_string(root.join("docs/reliability.md")).unwrap();
    let refs = references(&doc).unwrap();
    assert!(refs.len() >= 40, "only {} test references found in the tables", refs.len());
    let mut missing = vec![];
    for (path, function) in &refs {
        let source = std::fs::read_to_string(root.join(path)).unwrap_or_default();
        let defined = source.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with(&format!("fn {function}(")) || l.starts_with(&format!("pub fn {function}("))
        });
        // Indented definitions count: tests inside a module or a per-device test macro.
        if !defined {
            missing.push(format!("{path}::{function}"));
        }
    }
    assert!(missing.is_empty(), "docs/reliability.md names tests that do not exist: {missing:?}");
}

#[test]
fn rows_without_a_test_reference_are_caught() {
    let table = "| a | b | Test |\n| --- | --- | --- |\n| c | d | `x.rs::f` |\n";
    assert_eq!(references(table).unwrap(), vec![("x.rs".to_string(), "f".to_string())]);
    let err = references(&format!("{table}| e | f | by hand |\n")).unwrap_err();
    assert!(err.contains("by hand"), "{err}");
}
