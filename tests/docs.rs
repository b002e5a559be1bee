//! The README and `docs/` as a reader meets them: the README is a front door (at most 25 KB,
//! the two commands in its first 40 lines), every code block says its language and is checked
//! by a test (Rust: the doc-tests of `src/lib.rs`'s `doc_snippets`; Python:
//! `python/tests/test_docs.py`; shell: parsed here with `bash -n`), and every relative link
//! points at a file that exists.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The fenced code blocks of `text`: (language, first line number, body).
fn blocks(text: &str) -> Vec<(String, usize, String)> {
    let mut out = vec![];
    let mut open: Option<(String, usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(lang)) => open = Some((lang.trim().to_string(), i + 1, String::new())),
            (Some(_), Some(_)) => out.push(open.take().unwrap()),
            (Some((_, _, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    out
}

#[test]
fn the_readme_is_a_front_door() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        text.len() <= 25 * 1024,
        "README.md is {} bytes: move detail into docs/",
        text.len()
    );
    let first: Vec<&str> = text.lines().take(40).collect();
    for command in ["bash scripts/main.sh", "bash scripts/test.sh"] {
        assert!(
            first.iter().any(|l| l.starts_with(command)),
            "`{command}` is not in the README's first 40 lines"
        );
    }
}

#[test]
fn every_code_block_names_a_checked_language() {
    // What checks each: rust (doc-tests), python (pytest), bash (below); text and json are
    // output or data, shown, not run.
    let checked = ["rust", "python", "bash", "text", "json"];
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (lang, line, _) in blocks(&text) {
            let base = lang.split(',').next().unwrap_or("");
            assert!(
                checked.contains(&base),
                "{}:{line}: a code block in `{lang}` (want one of {checked:?})",
                page.display()
            );
        }
    }
    // Every page with a Rust block is one the doc-tests include.
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        if blocks(&text).iter().any(|(l, _, _)| l.starts_with("rust")) {
            let rel = page.strip_prefix(root()).unwrap().display().to_string();
            assert!(
                lib.contains(&format!("include_str!(\"../{rel}\")")),
                "{rel} has Rust snippets that src/lib.rs's doc_snippets does not compile"
            );
        }
    }
}

#[test]
fn shell_snippets_parse() {
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (lang, line, body) in blocks(&text) {
            if lang != "bash" {
                continue;
            }
            let out = Command::new("bash")
                .args(["-n", "-c", &body])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}:{line}: bash -n: {}",
                page.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn relative_links_point_at_files() {
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            let path = target.split('#').next().unwrap();
            if path.is_empty() || path.contains("://") || path.contains(' ') {
                continue;
            }
            assert!(
                dir.join(path).exists(),
                "{}: the link `{target}` points at nothing",
                page.display()
            );
        }
    }
}
