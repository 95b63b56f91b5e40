//! docs/reliability.md names, in the last column of its tables, the test behind each promise
//! as `path/to/file.rs::function`. This checks every one exists, so the page cannot claim a
//! test that was renamed or removed.

use std::path::Path;

/// The last column's header in the page's tables.
const TEST_COLUMNS: [&str; 2] = ["Test", "Replayed on stable by"];

/// `(path, function)` of every row's test reference in the tables whose last column is a
/// test column; a row there without one is an error. Other tables (figures) are not read.
fn references(doc: &str) -> Result<Vec<(String, String)>, String> {
    let mut refs = vec![];
    let (mut in_table, mut test_table) = (false, false);
    for line in doc.lines() {
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        let last = line.trim_end().trim_end_matches('|').rsplit('|').next().unwrap_or("").trim();
        if !in_table {
            // The header row.
            (in_table, test_table) = (true, TEST_COLUMNS.contains(&last));
            continue;
        }
        if !test_table || line.starts_with("| ---") {
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
    // A table of figures is not a table of tests.
    assert_eq!(references("| target | runs |\n| --- | --- |\n| x | 5 |\n").unwrap(), vec![]);
}
