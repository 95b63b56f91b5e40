//! The train crate's shape, read from its source: the top-level modules depend on each other
//! one way only (the vocabulary - config, runtime, checkpoint, metrics - below the tasks, the
//! tasks below the loop and eval), read from every `crate::module` path outside comments; no
//! function is over 80 lines, and `fit` is a short loop over the `Trainer`'s steps.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `module -> modules it names`, over the library's files (main.rs and bench.rs belong to the
/// binary, whose `crate` is another crate).
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in rust_files(src) {
        let rel = path.strip_prefix(src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
        let module = first.trim_end_matches(".rs").to_string();
        if ["lib", "main", "bench"].contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let named = edges.entry(module.clone()).or_default();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for target in crate_paths(line) {
                if target != module {
                    named.insert(target);
                }
            }
        }
    }
    edges
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let (mut files, mut stack) = (Vec::new(), vec![dir.to_path_buf()]);
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The first segment of every `crate::...` path in `line`, `crate::{a, b::c}` included.
fn crate_paths(line: &str) -> Vec<String> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut found = Vec::new();
    for part in line.split("crate::").skip(1) {
        if let Some(group) = part.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            found.extend(group.split(',').map(|p| ident(p.trim())).filter(|p| !p.is_empty()));
        } else {
            found.push(ident(part));
        }
    }
    found.retain(|m| !m.is_empty() && m.chars().next().is_some_and(|c| c.is_lowercase()));
    found
}

/// A cycle through `node`, as the path of modules, if any.
fn cycle(
    node: &str,
    edges: &BTreeMap<String, BTreeSet<String>>,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|n| n == node) {
        let mut c = path[at..].to_vec();
        c.push(node.to_string());
        return Some(c);
    }
    if done.contains(node) {
        return None;
    }
    path.push(node.to_string());
    for next in edges.get(node).into_iter().flatten() {
        if let Some(c) = cycle(next, edges, path, done) {
            return Some(c);
        }
    }
    path.pop();
    done.insert(node.to_string());
    None
}

#[test]
fn the_train_crates_modules_form_no_import_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = graph(&src);
    assert!(edges.len() >= 8 && edges["trainer"].contains("tasks"), "the graph was read: {edges:?}");
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        if let Some(c) = cycle(node, &edges, &mut vec![], &mut done) {
            panic!("import cycle between train/src modules: {}\n{edges:#?}", c.join(" -> "));
        }
    }
}

#[test]
fn crate_paths_are_read_from_plain_and_grouped_uses() {
    assert_eq!(crate_paths("use crate::config::{Config, X};"), ["config"]);
    assert_eq!(crate_paths("use crate::{tasks, runtime::Strategy};"), ["tasks", "runtime"]);
    assert_eq!(crate_paths("let x = crate::trainer::f(crate::tasks::g());"), ["trainer", "tasks"]);
    assert!(crate_paths("pub use crate::{Error, Result};").is_empty(), "types at the root are no module");
}

/// `(file, function, lines)` of every `fn` in train/src, from its line to the closing brace at
/// its indentation.
fn function_lengths(src: &Path) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    for path in rust_files(src) {
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let body = line.trim_start();
            let indent = &line[..line.len() - body.len()];
            let Some(name) = ["fn ", "pub fn ", "pub(crate) fn ", "pub(super) fn "]
                .iter()
                .find_map(|p| body.strip_prefix(p))
                .map(|rest| {
                    rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>()
                })
            else {
                continue;
            };
            if body.ends_with(';') {
                continue;
            }
            let close = format!("{indent}}}");
            if let Some(end) = lines[i..].iter().position(|l| l.trim_end() == close) {
                out.push((path.display().to_string(), name, end + 1));
            }
        }
    }
    out
}

#[test]
fn no_function_is_over_80_lines_and_fit_is_short() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lengths = function_lengths(&src);
    assert!(lengths.len() > 300, "the functions were read: {}", lengths.len());
    let long: Vec<_> = lengths.iter().filter(|(_, _, n)| *n > 80).collect();
    assert!(long.is_empty(), "functions over 80 lines: {long:?}");
    let fit = lengths.iter().find(|(f, n, _)| f.ends_with("trainer/mod.rs") && n == "fit").expect("fit");
    assert!(fit.2 <= 40, "fit is {} lines", fit.2);
}
