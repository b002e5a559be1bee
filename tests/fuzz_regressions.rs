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
        for text in ["hello", "llo", "lol", "o", "Hello, world! 12345"] {
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

/// Threads on which a panic began, recorded by a panic hook that then defers to the previous
/// one: the readers catch some of the `tokenizers` crate's panics, but a caller's hook (the
/// fuzzer's aborts) still sees them, so a reproducer must be refused without any.
fn panicked_threads() -> &'static std::sync::Mutex<Vec<std::thread::ThreadId>> {
    static SEEN: std::sync::OnceLock<std::sync::Mutex<Vec<std::thread::ThreadId>>> =
        std::sync::OnceLock::new();
    SEEN.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(seen) = SEEN.get() {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(std::thread::current().id());
            }
            previous(info);
        }));
        std::sync::Mutex::new(Vec::new())
    })
}

#[test]
fn tokenizer_json_reproducers_are_typed_errors() {
    let me = std::thread::current().id();
    for file in reproducers("tokenizer_json") {
        let panics_before = panicked_threads()
            .lock()
            .unwrap()
            .iter()
            .filter(|&&t| t == me)
            .count();
        let started = std::time::Instant::now();
        // As the target reads its input: the JSON, then after a NUL an optional config.
        let bytes = std::fs::read(&file).unwrap();
        let (json, config) = match bytes.iter().position(|&b| b == 0) {
            Some(i) => (&bytes[..i], Some(&bytes[i + 1..])),
            None => (&bytes[..], None),
        };
        let json = String::from_utf8_lossy(json).into_owned();
        let config = config.map(|c| String::from_utf8_lossy(c).into_owned());
        match Tokenizer::from_json_parts(&json, config.as_deref(), &file) {
            Err(e) => assert!(e.to_string().contains("tokenizer.json"), "{e}"),
            // Read: every id it encodes is within its bound (ids with gaps once were not).
            Ok(tok) => {
                // The fuzz targets' texts (fuzz/src/lib.rs TOKENIZER_TEXTS).
                for text in [
                    "Hello, world! 12345",
                    "<|im_start|>user\nhéllo  wörld\n\n<|im_end|>",
                    " \t\r\n ▁x 日本語 🦀 '' 's",
                ] {
                    for special in [false, true] {
                        let Ok(ids) = tok.encode(text, special) else {
                            continue;
                        };
                        for &id in &ids {
                            let n = tok.vocab_size();
                            assert!((id as usize) < n, "{}: id {id} of {n}", file.display());
                        }
                        let _ = tok.decode(&ids);
                    }
                }
                tok.to_json_parts(false).unwrap();
            }
        }
        let panics_after = panicked_threads()
            .lock()
            .unwrap()
            .iter()
            .filter(|&&t| t == me)
            .count();
        assert_eq!(
            panics_after,
            panics_before,
            "{}: a panic began while reading it (even if caught)",
            file.display()
        );
        // The fuzz targets' timeout is 10 s (a 134-million id once took 48 s to write back).
        let took = started.elapsed();
        assert!(took.as_secs() < 5, "{}: {took:?}", file.display());
    }
}

/// A config the reader accepts reads back the same after `config_to_hf_json` (a Gemma 3 whose
/// layers are all local lost its stated pattern: it was not written).
#[test]
fn hf_config_reproducers_round_trip() {
    use elm::formats::hf::{config_from_hf_json, config_to_hf_json};
    for file in reproducers("hf_config") {
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        let Ok(config) = config_from_hf_json(&value) else {
            continue;
        };
        let back = config_from_hf_json(&config_to_hf_json(&config)).unwrap();
        assert_eq!(back, config, "{}", file.display());
    }
}
