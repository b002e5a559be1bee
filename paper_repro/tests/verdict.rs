//! The committed study pages say what their `tables.json` says: each page's verdict is the one
//! the code writes from the tables beside it (so no figure in it was typed or left stale), and
//! every interval the verdict quotes also appears in a table of the same page.

use std::path::Path;

use paper_repro::tables::{Tables, Written};

/// The page's verdict paragraph (the one line that starts with it).
fn verdict_line(page: &str) -> Option<&str> {
    page.lines().find(|l| l.starts_with("**Verdict:**"))
}

/// Every `value [lo, hi]` interval in `text`, as printed.
fn intervals(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = text;
    while let Some(open) = rest.find(" [") {
        let Some(close) = rest[open..].find(']') else {
            break;
        };
        let head = &rest[..open];
        let value = head.rsplit(' ').next().unwrap_or("");
        let inside = &rest[open + 2..open + close];
        let numeric = |s: &str| s.trim().parse::<f64>().is_ok();
        if numeric(value) && inside.split(", ").count() == 2 && inside.split(", ").all(numeric) {
            out.push(format!("{value} [{inside}]"));
        }
        rest = &rest[open + close..];
    }
    out
}

fn check(dir: &Path) {
    let (Ok(json), Ok(page)) = (
        std::fs::read_to_string(dir.join("tables.json")),
        std::fs::read_to_string(dir.join("README.md")),
    ) else {
        panic!(
            "{}: tables.json and README.md are committed together",
            dir.display()
        );
    };
    let t: Tables = serde_json::from_str(&json).expect("tables.json reads back");
    let written = paper_repro::readme::readme(&t, &Written::default());
    let (Some(ours), Some(committed)) = (verdict_line(&written), verdict_line(&page)) else {
        // A run without controls (the second family's older protocol) has no verdict.
        assert!(
            verdict_line(&page).is_none(),
            "{}: a verdict the tables do not make",
            dir.display()
        );
        return;
    };
    assert_eq!(
        ours, committed,
        "{}: the committed verdict is not what the code writes from tables.json (rerun `paper_repro --render-only`)",
        dir.display()
    );
    let quoted = intervals(committed);
    assert!(
        !quoted.is_empty(),
        "{}: a verdict without figures",
        dir.display()
    );
    let tables: String = page
        .lines()
        .filter(|l| l.starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n");
    let missing: Vec<&String> = quoted
        .iter()
        .filter(|i| !tables.contains(i.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{}: the verdict quotes intervals no table of the page shows: {missing:?}",
        dir.display()
    );
}

#[test]
fn every_committed_verdict_is_generated_and_its_figures_are_in_its_tables() {
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
    for dir in [
        results.clone(),
        results.join("long"),
        results.join("gemma3"),
    ] {
        check(&dir);
    }
}

#[test]
fn intervals_are_found_as_printed() {
    // Two printed intervals; a bracket after a word, and a list, are not intervals.
    assert_eq!(
        intervals("gap +0.126 [+0.110, +0.145] ↑ and -4.782e-3 [-0.015, +5.583e-3] (x [1, 2]) layers [2, 3, 4]"),
        vec!["+0.126 [+0.110, +0.145]", "-4.782e-3 [-0.015, +5.583e-3]"]
    );
}
