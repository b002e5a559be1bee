//! Every input a fuzz target of `fuzz/` found crashing the readers (`fuzz/regressions/<target>/`,
//! minimized) is replayed here through the same reader on every test run: each must now be
//! refused with a typed error, or read consistently — never a panic.

use std::path::{Path, PathBuf};

use elm::formats::gguf::GgufFile;
use elm::formats::tokenizer::Tokenizer;

fn reproducers(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no reproducer in {}", dir.display());
    files
}

#[test]
fn gguf_reader_reproducers_are_typed_errors() {
    for file in reproducers("gguf_reader") {
        let msg = match GgufFile::open(&file) {
            Ok(g) => {
                // If it opens, every tensor it lists must read or be refused, not panic.
                for t in g.tensors().to_vec() {
                    let _ = g.tensor_f32(&t.name);
                }
                continue;
            }
            Err(e) => e.to_string(),
        };
        assert!(msg.contains(&file.display().to_string()), "{msg}");
    }
}

/// A vocabulary that repeats a token: every id `encode` gives must decode (the id bound once
/// counted unique strings, so an id past it came out of `encode` and `decode` refused it).
#[test]
fn gguf_tokenizer_reproducers_encode_within_the_vocabulary() {
    for file in reproducers("gguf_tokenizer") {
        let g = GgufFile::open(&file).unwrap();
        let Ok(tok) = Tokenizer::from_gguf(&g) else {
            continue;
        };
        for text in ["hello", "llo", "lol", "o"] {
            let ids = tok.encode(text, false).unwrap();
            for &id in &ids {
                assert!(
                    (id as usize) < tok.vocab_size(),
                    "{}: id {id}",
                    file.display()
                );
            }
            tok.decode(&ids).unwrap();
        }
    }
}

#[test]
fn tokenizer_json_reproducers_are_typed_errors() {
    for file in reproducers("tokenizer_json") {
        let json = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).into_owned();
        if let Err(e) = Tokenizer::from_json_parts(&json, None, &file) {
            assert!(e.to_string().contains("tokenizer.json"), "{e}");
        }
    }
}
