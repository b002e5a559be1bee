//! The layout the architecture promises, checked on the source trees themselves (`src/`,
//! `crates/elm-solver/src/`, `paper_repro/src/`):
//!
//! - **folders only point down**: every top-level module (a folder or a file directly under the
//!   root) imports only modules on a lower line of ARCHITECTURE.md's "Layer order" list, read
//!   from the file; a module missing from the list fails too, so a new folder must be placed;
//! - **no file loops**: no two files import each other, directly or around a loop;
//! - every file ARCHITECTURE.md's "where new work goes" names exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

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

/// The module path of a file under its crate root (`src/equilibrium/session.rs` →
/// `[equilibrium, session]`; `mod.rs`, `lib.rs` and `main.rs` name their folder).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
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

/// `mod.rs`, `lib.rs`, `main.rs`: files that gather their children (their own imports are
/// their children's).
fn is_gatherer(f: &Path) -> bool {
    matches!(
        f.file_name().and_then(|n| n.to_str()),
        Some("mod.rs" | "lib.rs" | "main.rs")
    )
}

/// The paths of a use-tree starting at `text` (`a::b`, `a::{b, c::{d, e}}`, `a::*`), each as
/// its segments; `rest` is what follows the tree.
fn use_tree(text: &str) -> (Vec<Vec<String>>, &str) {
    fn ident(t: &str) -> (&str, &str) {
        let end = t
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(t.len());
        (&t[..end], &t[end..])
    }
    fn tree<'a>(t: &'a str, prefix: &[String], out: &mut Vec<Vec<String>>) -> &'a str {
        let t = t.trim_start();
        if let Some(inner) = t.strip_prefix('{') {
            let mut t = inner;
            loop {
                t = t.trim_start();
                if let Some(after) = t.strip_prefix('}') {
                    return after;
                }
                if t.is_empty() {
                    return t;
                }
                t = tree(t, prefix, out);
                t = t.trim_start();
                t = t.strip_prefix(',').unwrap_or(t);
            }
        }
        let (name, after) = ident(t);
        if name.is_empty() {
            // `*` or the end of a path.
            out.push(prefix.to_vec());
            return t.strip_prefix('*').unwrap_or(t);
        }
        let mut path = prefix.to_vec();
        path.push(name.to_string());
        match after.strip_prefix("::") {
            Some(next) => tree(next, &path, out),
            None => {
                out.push(path);
                after
            }
        }
    }
    let mut out = vec![];
    let rest = tree(text, &[], &mut out);
    (out, rest)
}

/// Code of a source file without comments and `#[cfg(test)]` modules.
fn code_of(text: &str) -> String {
    text.split("#[cfg(test)]")
        .next()
        .unwrap()
        .lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paths after `crate::` / `super::` in code (comments and `#[cfg(test)]` modules dropped),
/// brace groups expanded: `(is_super, segments)`.
fn references(code: &str) -> Vec<(bool, Vec<String>)> {
    let code = code_of(code);
    let mut out = vec![];
    for start in ["crate::", "super::"] {
        let mut rest = code.as_str();
        while let Some(i) = rest.find(start) {
            let before = rest[..i].chars().last();
            let tail = &rest[i + start.len()..];
            rest = tail;
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            for segs in use_tree(tail).0 {
                out.push((start == "super::", segs));
            }
        }
    }
    out
}

/// A crate's source tree: every file's module path and the other files it names (gatherers
/// excluded: they only gather their children).
struct Tree {
    root: PathBuf,
    graph: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    module: BTreeMap<PathBuf, Vec<String>>,
}

fn tree(root: &Path) -> Tree {
    let mut files = vec![];
    rust_files(root, &mut files);
    let by_module: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "main.rs"))
        .map(|f| (module_of(root, f), f.clone()))
        .collect();
    let mut graph = BTreeMap::new();
    for f in &files {
        let me = module_of(root, f);
        let code = std::fs::read_to_string(f).unwrap();
        let mut edges = BTreeSet::new();
        for (is_super, mut segs) in references(&code) {
            // `super` of module `a::b` (file or folder alike) is `a`.
            let mut target = if is_super {
                let mut b = me.clone();
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
    let module = files
        .iter()
        .map(|f| (f.clone(), module_of(root, f)))
        .collect();
    Tree {
        root: root.to_path_buf(),
        graph,
        module,
    }
}

/// Every import loop between files of `t` (depth-first search for back edges).
fn file_loops(t: &Tree) -> Vec<Vec<PathBuf>> {
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
    for f in t.graph.keys() {
        if !state.contains_key(f) {
            visit(f, &t.graph, &mut state, &mut vec![], &mut loops);
        }
    }
    loops
}

/// ARCHITECTURE.md's "Layer order": for each source root, its top-level modules line by line,
/// highest first (a line's modules are siblings that must not import each other).
fn layer_order() -> BTreeMap<String, Vec<Vec<String>>> {
    let text = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap();
    let section = text
        .split("## Layer order")
        .nth(1)
        .expect("ARCHITECTURE.md has a 'Layer order' section");
    let block = section
        .split("```text")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the 'Layer order' section holds a ```text block");
    let mut roots: BTreeMap<String, Vec<Vec<String>>> = BTreeMap::new();
    let mut current = None;
    for line in block.lines() {
        let line = line.split('#').next().unwrap();
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(' ') {
            let root = line.trim().trim_end_matches(':').to_string();
            roots.entry(root.clone()).or_default();
            current = Some(root);
            continue;
        }
        let root = current.clone().expect("a layer line before any root line");
        let units: Vec<String> = line
            .split(|c: char| c == '·' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        roots.get_mut(&root).unwrap().push(units);
    }
    roots
}

/// The top-level module a file belongs to (`""` for the crate root's own file).
fn unit_of(t: &Tree, f: &Path) -> String {
    t.module[f].first().cloned().unwrap_or_default()
}

/// Every import of `t` that does not point down the layer list `layers` (highest first), as
/// `(from file, to file, why)`, plus the top-level modules the list does not place.
fn layer_violations(t: &Tree, layers: &[Vec<String>]) -> Vec<String> {
    let mut level = BTreeMap::new();
    for (i, line) in layers.iter().enumerate() {
        for u in line {
            // Highest first: the first line gets the largest number.
            level.insert(u.clone(), layers.len() - i);
        }
    }
    let mut out = vec![];
    let units: BTreeSet<String> = t
        .graph
        .keys()
        .map(|f| unit_of(t, f))
        .filter(|u| !u.is_empty())
        .collect();
    for u in &units {
        if !level.contains_key(u) {
            out.push(format!(
                "{}: `{u}` is not in ARCHITECTURE.md's layer order",
                t.root.display()
            ));
        }
    }
    for u in level.keys() {
        if !units.contains(u) {
            out.push(format!(
                "{}: ARCHITECTURE.md's layer order names `{u}`, which is not a module there",
                t.root.display()
            ));
        }
    }
    for (f, edges) in &t.graph {
        let from = unit_of(t, f);
        for e in edges {
            let to = unit_of(t, e);
            if from == to || from.is_empty() || to.is_empty() {
                continue;
            }
            let (Some(a), Some(b)) = (level.get(&from), level.get(&to)) else {
                continue;
            };
            if b >= a {
                out.push(format!(
                    "{} imports {}: `{from}` may import only modules below it, and `{to}` is {}",
                    f.strip_prefix(workspace()).unwrap_or(f).display(),
                    e.strip_prefix(workspace()).unwrap_or(e).display(),
                    if a == b {
                        "on the same line"
                    } else {
                        "above it"
                    }
                ));
            }
        }
    }
    out
}

const ROOTS: [&str; 3] = ["src", "crates/elm-solver/src", "paper_repro/src"];

#[test]
fn folders_import_only_the_layers_below_them() {
    let order = layer_order();
    let mut problems = vec![];
    for root in ROOTS {
        let layers = order
            .get(root)
            .unwrap_or_else(|| panic!("ARCHITECTURE.md's layer order has no `{root}:` list"));
        problems.extend(layer_violations(&tree(&workspace().join(root)), layers));
    }
    assert!(
        problems.is_empty(),
        "imports against ARCHITECTURE.md's layer order:\n{}",
        problems.join("\n")
    );
}

#[test]
fn no_two_files_import_each_other() {
    for root in ROOTS {
        let t = tree(&workspace().join(root));
        assert!(
            t.graph.len() > 10,
            "{root}: found only {} files",
            t.graph.len()
        );
        let loops = file_loops(&t);
        assert!(
            loops.is_empty(),
            "{root}: import loops between files: {loops:#?}"
        );
    }
}

/// The checker sees what it must: brace groups, `super` from a file (its folder) and from a
/// folder's `mod.rs` (the parent), a planted upward import, a loop.
#[test]
fn the_checker_sees_references_layers_and_loops() {
    let refs = references(
        "use super::session::ElmSession;\nuse crate::{io::read_json, model::{config::A, B}};\nlet x = crate::solver::SolverConfig::anderson(); // crate::io\n",
    );
    let want: Vec<(bool, Vec<String>)> = vec![
        (false, vec!["io".into(), "read_json".into()]),
        (false, vec!["model".into(), "config".into(), "A".into()]),
        (false, vec!["model".into(), "B".into()]),
        (
            false,
            vec!["solver".into(), "SolverConfig".into(), "anderson".into()],
        ),
        (true, vec!["session".into(), "ElmSession".into()]),
    ];
    assert_eq!(refs, want);
    // A tiny crate: `low/a.rs` names its sibling through `super`, `high.rs` imports `low`, and
    // a planted `low/b.rs → high` import goes up the layers and closes a file loop.
    let dir = std::env::temp_dir().join(format!("elm-arch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("low")).unwrap();
    std::fs::write(dir.join("lib.rs"), "pub mod low;\npub mod high;\n").unwrap();
    std::fs::write(dir.join("low/mod.rs"), "pub mod a;\npub mod b;\n").unwrap();
    std::fs::write(dir.join("low/a.rs"), "use super::b::B;\n").unwrap();
    std::fs::write(dir.join("low/b.rs"), "pub struct B;\n").unwrap();
    std::fs::write(dir.join("high.rs"), "use crate::low::a::A;\n").unwrap();
    let layers = vec![vec!["high".to_string()], vec!["low".to_string()]];
    let t = tree(&dir);
    assert!(t.graph[&dir.join("low/a.rs")].contains(&dir.join("low/b.rs")));
    assert!(layer_violations(&t, &layers).is_empty());
    assert!(file_loops(&t).is_empty());
    std::fs::write(dir.join("low/b.rs"), "use crate::high::H;\npub struct B;\n").unwrap();
    let t = tree(&dir);
    let v = layer_violations(&t, &layers);
    assert!(v.len() == 1 && v[0].contains("above it"), "{v:?}");
    assert_eq!(file_loops(&t).len(), 1);
    // A module the list does not place, and a listed one that does not exist.
    let v = layer_violations(&t, &[vec!["high".into()], vec!["gone".into()]]);
    assert!(
        v.iter().any(|m| m.contains("`low` is not in"))
            && v.iter().any(|m| m.contains("names `gone`")),
        "{v:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn architecture_names_only_files_that_exist() {
    let root = workspace();
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

/// What names a family in code: its `Arch` variant, and the names its files give it (the
/// tokenizer kinds `"llama"` and `"qwen2"` of GGUF's `tokenizer.ggml.*` share two of these
/// names without being families, so the GGUF architecture names are caught through `Arch::`).
const FAMILY_NEEDLES: &[&str] = &[
    "Arch::Llama",
    "Arch::Qwen2",
    "Arch::Gemma3",
    "\"gemma3\"",
    "\"gemma3_text\"",
    "\"LlamaForCausalLM\"",
    "\"Qwen2ForCausalLM\"",
    "\"Gemma3ForCausalLM\"",
    "\"gelu_pytorch_tanh\"",
];

/// Files outside `src/model_data/family/` that may name a family, each with why.
const FAMILY_NAMED_ELSEWHERE: &[(&str, &str)] = &[
    (
        "src/equilibrium/interchange.rs",
        "the official ELM code's integrated checkpoint format is Qwen2 only: a fact of that \
         format, not of the family",
    ),
    (
        "src/cuda/bench.rs",
        "the shapes of the named checkpoints (SmolLM2-135M, Qwen2.5-1.5B) the GPU benchmark \
         builds with random weights",
    ),
];

fn family_mentions(code: &str) -> Vec<&'static str> {
    FAMILY_NEEDLES
        .iter()
        .copied()
        .filter(|n| code.contains(n))
        .collect()
}

/// Issue 60 item 2: a family's facts live in its file of `src/model_data/family/` (names in
/// each format, permutations, norms, activation, windows, RoPE rules), reached through
/// `Arch::family()`; everywhere else decides by those facts, so a new family cannot be
/// forgotten by a comparison the compiler does not see.
#[test]
fn family_facts_live_in_their_files() {
    let root = workspace();
    let mut files = vec![];
    rust_files(&root.join("src"), &mut files);
    let family_dir = root.join("src/model_data/family");
    let mut outside = vec![];
    let mut allowed_seen = BTreeSet::new();
    for f in &files {
        if f.starts_with(&family_dir) {
            continue;
        }
        let rel = f.strip_prefix(root).unwrap().to_str().unwrap().to_string();
        let found = family_mentions(&code_of(&std::fs::read_to_string(f).unwrap()));
        if found.is_empty() {
            continue;
        }
        if FAMILY_NAMED_ELSEWHERE.iter().any(|(p, _)| *p == rel) {
            allowed_seen.insert(rel);
        } else {
            outside.push(format!("{rel}: {found:?}"));
        }
    }
    assert!(
        outside.is_empty(),
        "a family named outside src/model_data/family/ (decide by `cfg.family()` facts, or \
         add the file with its reason to FAMILY_NAMED_ELSEWHERE):\n{}",
        outside.join("\n")
    );
    // The allow-list cannot go stale: each file on it still names a family.
    for (p, why) in FAMILY_NAMED_ELSEWHERE {
        assert!(
            allowed_seen.contains(*p),
            "{p} no longer names a family; drop it from the list ({why})"
        );
    }
    // The checker sees a planted mention, and not one in a comment.
    assert_eq!(
        family_mentions(&code_of("let a = Arch::Gemma3; // Arch::Qwen2")),
        ["Arch::Gemma3"]
    );
}

/// Every family the enum has is in `Arch::ALL` and found by its names in both formats.
#[test]
fn every_family_is_listed_and_found_by_its_names() {
    use elm::model_data::Arch;
    for a in Arch::ALL {
        let f = a.family();
        assert_eq!(f.arch, a);
        assert_eq!(Arch::from_gguf_name(f.gguf_name), Some(a));
        assert_eq!(Arch::from_hf_model_type(f.hf_model_type), Some(a));
        assert_eq!(elm::model_data::ModelConfig::tiny(a).arch, a);
    }
}

/// Issue 62 item 2: one way to write a generated README block. Scripts (`scripts/`, shell with
/// Python heredocs and Python files) call `scripts/readme_block.py`'s `rewrite`; the Rust study
/// writes its blocks through `paper_repro/src/readme.rs` (`block_markers`, `replace_block`).
/// A file that spells a block marker in code anywhere else is a second writer.
/// Every file under `scripts/`, its subfolders included.
fn script_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "__pycache__") {
                    walk(&p, out);
                }
            } else {
                out.push(p);
            }
        }
    }
    let mut out = vec![];
    walk(&workspace().join("scripts"), &mut out);
    out.sort();
    out
}

/// `scripts/` shows its shape: runners there, analysis as Python modules (`scripts/analysis/`),
/// no heredoc of more than 20 lines, and no fixture generator (those live beside their
/// fixtures, in `tests/fixtures/gen/`).
#[test]
fn scripts_keep_their_shape() {
    let mut problems = vec![];
    for p in script_files() {
        let rel = p.strip_prefix(workspace()).unwrap().display().to_string();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("ref_") {
            problems.push(format!(
                "{rel}: a fixture generator (move it to tests/fixtures/gen/)"
            ));
        }
        if p.extension().is_none_or(|e| e != "sh") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i].trim_end();
            let tag = line
                .rsplit_once("<<")
                .map(|(_, t)| t.trim().trim_start_matches('-').trim_matches('\''))
                .filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_uppercase()));
            if let Some(tag) = tag {
                let end = (i + 1..lines.len())
                    .find(|&j| lines[j].trim() == tag)
                    .unwrap_or(lines.len());
                if end - i - 1 > 20 {
                    problems.push(format!(
                        "{rel}:{}: a heredoc of {} lines (make it a module)",
                        i + 1,
                        end - i - 1
                    ));
                }
                i = end;
            }
            i += 1;
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn generated_blocks_have_one_writer() {
    let root = workspace();
    let marker = ":begin -->";
    let mut second = vec![];
    // Scripts: code lines only (shell and Python comments start with `#`).
    for p in script_files() {
        let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_string();
        if rel == "scripts/readme_block.py" {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        if text
            .lines()
            .any(|l| !l.trim_start().starts_with('#') && l.contains(marker))
        {
            second.push(rel);
        }
    }
    // Rust sources: code without comments and test modules.
    for dir in ["src", "paper_repro/src", "crates/elm-solver/src"] {
        let mut files = vec![];
        rust_files(&root.join(dir), &mut files);
        for f in files {
            let rel = f.strip_prefix(root).unwrap().to_str().unwrap().to_string();
            if rel == "paper_repro/src/readme.rs" {
                continue;
            }
            if code_of(&std::fs::read_to_string(&f).unwrap()).contains(marker) {
                second.push(rel);
            }
        }
    }
    assert!(
        second.is_empty(),
        "README block markers written outside the one writer (scripts/readme_block.py, \
         paper_repro/src/readme.rs): {second:?}"
    );
    // Every script that writes a block does it through the writer.
    let writer_users = script_files()
        .into_iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter(|t| t.contains("from readme_block import rewrite"))
        .count();
    assert!(
        writer_users >= 7,
        "only {writer_users} scripts use readme_block"
    );
}

/// Tests mirror modules: every `tests/<name>.rs` of the library is named for the top-level
/// module it tests (`<module>.rs` or `<module>_<part>.rs`, a module of ARCHITECTURE.md's layer
/// list for `src`, or `solver`, the solver crate `elm::solver` re-exports), or is one of the
/// few that test across modules by design.
#[test]
fn tests_mirror_modules() {
    const ACROSS: [&str; 8] = [
        "architecture",      // the layout itself
        "docs",              // the README and docs/ as a reader meets them
        "refuse",            // the CLI's typed refusals, command by command
        "api_refuse",        // the same refusals through the library's calls
        "hostile_gguf",      // hostile GGUF files through every loader
        "hostile_tokenizer", // hostile tokenizer.json files through every loader
        "fuzz_regressions",  // what the fuzzers found, replayed
        "official_elm",      // elm against the official ELM code's own files
    ];
    let layers = layer_order();
    let mut modules: Vec<String> = layers["src"].iter().flatten().cloned().collect();
    modules.push("solver".into());
    let mut strays = vec![];
    for entry in std::fs::read_dir(workspace().join("tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let mirrors = modules
            .iter()
            .any(|m| name == *m || name.starts_with(&format!("{m}_")));
        if !mirrors && !ACROSS.contains(&name.as_str()) {
            strays.push(name);
        }
    }
    assert!(
        strays.is_empty(),
        "tests named for no module (name them tests/<module>_<part>.rs): {strays:?}"
    );
}
