//! The layout the architecture promises, checked on the source tree itself: no two files of
//! `src/` import each other (directly or around a loop), and every file ARCHITECTURE.md's
//! "where new work goes" names exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file under `src/` (`src/equilibrium/session.rs` → `[equilibrium, session]`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Paths after `crate::` / `super::` in code (comments and `#[cfg(test)]` modules dropped).
fn references(code: &str) -> Vec<(bool, Vec<String>)> {
    let code = code.split("#[cfg(test)]").next().unwrap();
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = vec![];
    for start in ["crate::", "super::"] {
        let mut rest = code.as_str();
        while let Some(i) = rest.find(start) {
            let before = rest[..i].chars().last();
            let tail = &rest[i + start.len()..];
            rest = tail;
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let mut segs = vec![];
            let mut t = tail;
            loop {
                let end = t
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(t.len());
                if end == 0 {
                    break;
                }
                segs.push(t[..end].to_string());
                match t[end..].strip_prefix("::") {
                    Some(next) => t = next,
                    None => break,
                }
            }
            out.push((start == "super::", segs));
        }
    }
    out
}

/// file → the other files of `src/` it names (module files `mod.rs`/`lib.rs` excluded: they
/// only gather their children).
fn import_graph() -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    rust_files(&src, &mut files);
    let by_module: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(&src, f), f.clone()))
        .collect();
    let is_gatherer = |f: &Path| {
        matches!(
            f.file_name().and_then(|n| n.to_str()),
            Some("mod.rs" | "lib.rs")
        )
    };
    let mut graph = BTreeMap::new();
    for f in &files {
        let me = module_of(&src, f);
        let base: Vec<String> = if is_gatherer(f) {
            me.clone()
        } else {
            me[..me.len().saturating_sub(1)].to_vec()
        };
        let code = std::fs::read_to_string(f).unwrap();
        let mut edges = BTreeSet::new();
        for (is_super, mut segs) in references(&code) {
            let mut target = if is_super {
                let mut b = base.clone();
                b.pop();
                while segs.first().map(String::as_str) == Some("super") {
                    segs.remove(0);
                    b.pop();
                }
                b
            } else {
                vec![]
            };
            target.extend(segs);
            // The longest prefix that is a file of its own.
            for n in (1..=target.len()).rev() {
                if let Some(t) = by_module.get(&target[..n]) {
                    if t != f && !is_gatherer(t) {
                        edges.insert(t.clone());
                    }
                    break;
                }
            }
        }
        graph.insert(f.clone(), edges);
    }
    graph
}

#[test]
fn no_two_files_of_src_import_each_other() {
    let graph = import_graph();
    assert!(graph.len() > 50, "found only {} files", graph.len());
    // Depth-first search for a back edge; report the loop it closes.
    fn visit(
        f: &PathBuf,
        g: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        state: &mut BTreeMap<PathBuf, u8>,
        stack: &mut Vec<PathBuf>,
        loops: &mut Vec<Vec<PathBuf>>,
    ) {
        state.insert(f.clone(), 1);
        stack.push(f.clone());
        for t in &g[f] {
            match state.get(t).copied().unwrap_or(0) {
                0 => visit(t, g, state, stack, loops),
                1 => {
                    let at = stack.iter().position(|s| s == t).unwrap();
                    loops.push(stack[at..].to_vec());
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(f.clone(), 2);
    }
    let (mut state, mut loops) = (BTreeMap::new(), vec![]);
    for f in graph.keys() {
        if !state.contains_key(f) {
            visit(f, &graph, &mut state, &mut vec![], &mut loops);
        }
    }
    assert!(loops.is_empty(), "import loops between files: {loops:#?}");
}

/// The checker finds a loop when there is one (two files that name each other).
#[test]
fn the_loop_finder_sees_references() {
    let refs = references("use super::session::ElmSession;\nlet x = crate::solver::SolverConfig::anderson(); // crate::io\n");
    assert_eq!(
        refs,
        vec![
            (
                false,
                vec!["solver".into(), "SolverConfig".into(), "anderson".into()]
            ),
            (true, vec!["session".into(), "ElmSession".into()]),
        ]
    );
}

#[test]
fn architecture_names_only_files_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let section = text
        .split("## Where new work goes")
        .nth(1)
        .expect("ARCHITECTURE.md has a 'Where new work goes' section");
    let section = section.split("\n## ").next().unwrap();
    let mut named = 0;
    for quoted in section.split('`').skip(1).step_by(2) {
        let path = quoted.split_whitespace().next().unwrap_or("");
        let looks_like_file = path.ends_with(".rs") || path.ends_with(".cu") || path.ends_with('/');
        if !looks_like_file || path.contains('<') || path.contains('*') {
            continue;
        }
        named += 1;
        assert!(
            root.join(path).exists(),
            "ARCHITECTURE.md names `{path}`, which does not exist"
        );
    }
    assert!(named >= 8, "only {named} files named");
}
