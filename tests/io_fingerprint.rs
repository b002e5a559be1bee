//! The content hashes: SHA-256 against FIPS 180-4's published test vectors and `sha256sum`'s
//! digest of a file.

mod common;

use elm::io::{sha256_file, Sha256};

fn digest(bytes: &[u8]) -> String {
    let mut h = Sha256::new();
    h.write(bytes);
    h.finish_hex()
}

#[test]
fn sha256_matches_the_fips_test_vectors() {
    assert_eq!(
        digest(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        digest(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    // 56 bytes: the padding spills into a second block.
    assert_eq!(
        digest(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
    // One million 'a', written in uneven pieces.
    let mut h = Sha256::new();
    let a = vec![b'a'; 1_000_000];
    let mut rest = &a[..];
    for piece in [1usize, 63, 64, 65, 1000].iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let n = (*piece).min(rest.len());
        h.write(&rest[..n]);
        rest = &rest[n..];
    }
    assert_eq!(
        h.finish_hex(),
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
    );
}

#[test]
fn sha256_of_a_file_is_sha256sums() {
    let d = common::TempDir::new("sha256");
    let p = d.join("f.bin");
    std::fs::write(&p, b"abc").unwrap();
    assert_eq!(
        sha256_file(&p).unwrap(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let err = sha256_file(&d.join("absent")).unwrap_err().to_string();
    assert!(err.contains("absent"), "{err}");
    // The real checkpoint against the digest its fetch script pins.
    if let Some(g) = common::real_gemma3() {
        assert_eq!(
            sha256_file(&g).unwrap(),
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
        );
    }
}
