//! `elm::heap`'s huge-page backing of streamed weights (issue 42): which stretches it picks,
//! that it keeps the memory's contents, and that what it reports is what the kernel holds.

mod common;

use elm::heap::{back_with_huge_pages, huge_stretches, HUGE_PAGE};

/// Per-byte reference: the stretches in which at least 7/8 of the bytes lie in some buffer.
fn reference_stretches(buffers: &[&[u8]]) -> Vec<usize> {
    let lo = buffers.iter().map(|b| b.as_ptr() as usize).min().unwrap();
    let hi = buffers
        .iter()
        .map(|b| b.as_ptr() as usize + b.len())
        .max()
        .unwrap();
    let first = lo - lo % HUGE_PAGE;
    let mut out = Vec::new();
    let mut stretch = first;
    while stretch < hi {
        let covered = (stretch..stretch + HUGE_PAGE)
            .filter(|&a| {
                buffers
                    .iter()
                    .any(|b| (b.as_ptr() as usize..b.as_ptr() as usize + b.len()).contains(&a))
            })
            .count();
        if covered * 8 >= HUGE_PAGE * 7 {
            out.push(stretch);
        }
        stretch += HUGE_PAGE;
    }
    out
}

#[test]
fn stretches_are_those_covered_to_seven_eighths() {
    let memory = vec![1u8; 9 * HUGE_PAGE];
    let base = memory.as_ptr() as usize;
    // The first whole stretch inside `memory`, as an offset.
    let s0 = (HUGE_PAGE - base % HUGE_PAGE) % HUGE_PAGE;
    let at = |off: usize, len: usize| &memory[off..off + len];
    let h = HUGE_PAGE;
    let cases: Vec<(&str, Vec<&[u8]>)> = vec![
        (
            "one buffer over several stretches",
            vec![at(s0 + 100, 5 * h)],
        ),
        (
            "pieces with small gaps (covered 15/16)",
            (0..32)
                .map(|i| at(s0 + i * h / 8, h / 8 - h / 128))
                .collect(),
        ),
        (
            "pieces with large gaps (covered 3/4)",
            (0..16).map(|i| at(s0 + i * h / 4, 3 * h / 16)).collect(),
        ),
        (
            "overlapping buffers count once",
            vec![at(s0, h / 2), at(s0, h / 2), at(s0 + h / 2, h / 4)],
        ),
        (
            "exactly 7/8 of a stretch, in two buffers",
            vec![at(s0 + h, h / 2), at(s0 + h + h / 2, 3 * h / 8)],
        ),
        ("empty buffers only", vec![at(s0, 0), at(s0 + h, 0)]),
    ];
    for (what, buffers) in cases {
        let nonempty: Vec<&[u8]> = buffers.iter().copied().filter(|b| !b.is_empty()).collect();
        let expected = if nonempty.is_empty() {
            vec![]
        } else {
            reference_stretches(&nonempty)
        };
        assert_eq!(huge_stretches(&buffers), expected, "{what}");
    }
    // The rule in numbers: a buffer of 5 stretches starting 100 bytes into one picks that
    // first stretch (short by 100 bytes) and the next 4, not the sixth (100 bytes); pieces
    // covering 3/4 pick none.
    assert_eq!(huge_stretches(&[at(s0 + 100, 5 * h)]).len(), 5);
    let sparse: Vec<&[u8]> = (0..16).map(|i| at(s0 + i * h / 4, 3 * h / 16)).collect();
    assert!(huge_stretches(&sparse).is_empty());
}

/// Bytes of `AnonHugePages` in the mappings of this process that overlap `lo..hi`.
fn anon_huge_bytes_over(lo: usize, hi: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut total = 0;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a < hi && lo < b;
                continue;
            }
        }
        if inside {
            if let Some(rest) = line.strip_prefix("AnonHugePages:") {
                let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().unwrap();
                total += kib * 1024;
            }
        }
    }
    total
}

#[test]
fn backing_keeps_contents_and_reports_what_the_kernel_holds() {
    let len = 10 * HUGE_PAGE + 12_345;
    let memory: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    let backed = back_with_huge_pages(&[&memory]);
    assert!(
        memory
            .iter()
            .enumerate()
            .all(|(i, &v)| v == (i * 31 % 251) as u8),
        "contents changed"
    );
    assert_eq!(backed % HUGE_PAGE, 0);
    assert!(backed <= huge_stretches(&[&memory]).len() * HUGE_PAGE);
    if common::huge_page_collapse_expected() {
        let lo = memory.as_ptr() as usize;
        let held = anon_huge_bytes_over(lo, lo + len);
        assert!(
            backed >= 8 * HUGE_PAGE,
            "{backed} bytes backed of a buffer with 9 or 10 whole stretches"
        );
        assert!(
            held >= backed as u64,
            "reported {backed} bytes on huge pages, the kernel holds {held} there"
        );
    }
}
