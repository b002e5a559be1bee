//! `elm::io::MappedFile`: a loader's reads leave the resident set once released (the kernel's
//! own counters, `RssFile`), and the slice-by-slice conversion sees every byte once, in order.

mod common;

use elm::io::mapped::RELEASE_SLICE_BYTES;
use elm::io::{resident_set, MappedFile};

/// Pages of a mapped file that were read count in the process's `RssFile` until released; a
/// released page reads back the same byte.
#[cfg(target_os = "linux")]
#[test]
fn released_pages_leave_the_resident_set_and_read_back_unchanged() {
    let dir = common::TempDir::new("mapped");
    let path = dir.join("data.bin");
    let len = 48usize << 20;
    let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    drop(bytes);
    let map = MappedFile::open(&path).unwrap();
    let before = resident_set().unwrap().file_bytes;
    let sum: u64 = map.iter().step_by(4096).map(|&b| b as u64).sum();
    let touched = resident_set().unwrap().file_bytes;
    assert!(
        touched >= before + (40 << 20),
        "reading 48 MiB raised RssFile by only {} bytes",
        touched.saturating_sub(before)
    );
    map.release_all();
    let released = resident_set().unwrap().file_bytes;
    assert!(
        released <= before + (4 << 20),
        "after release RssFile is {} bytes above its start",
        released.saturating_sub(before)
    );
    let again: u64 = map.iter().step_by(4096).map(|&b| b as u64).sum();
    assert_eq!(sum, again);
    assert_eq!(map[12_345_677], (12_345_677usize * 31 % 251) as u8);
}

/// `convert_releasing` hands over the part in slices of whole units, in order, covering it
/// exactly; the pages of what it converted are gone from the resident set at the end.
#[test]
fn conversion_sees_every_byte_once_in_order() {
    let dir = common::TempDir::new("mapped-convert");
    let path = dir.join("data.bin");
    let len = 2 * RELEASE_SLICE_BYTES + 4 * 1001;
    let bytes: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let map = MappedFile::open(&path).unwrap();
    let part = &map[3..3 + 12 * ((len - 3) / 12)];
    let mut seen = Vec::new();
    let mut indices = Vec::new();
    map.convert_releasing(part, 12, |i, src| {
        assert_eq!(src.len() % 12, 0, "slice {i} is not whole units");
        indices.push(i);
        seen.extend_from_slice(src);
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, &bytes[3..3 + part.len()]);
    assert_eq!(indices, (0..indices.len()).collect::<Vec<_>>());
    assert!(indices.len() >= 3);
    assert_eq!(map.offset_of(part), 3);
}
