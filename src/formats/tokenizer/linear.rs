//! The GGUF tokenizers' builders in time linear in the vocabulary's total length (issue 59):
//! control and user-defined tokens matched whole by a byte trie ([`WholeTokens`]) instead of
//! the `tokenizers` crate's quadratic added vocabulary, and SentencePiece-style merges found by
//! rolling hashes ([`vocab_splits`]) instead of hashing every split of every token.

use std::collections::{BTreeMap, HashMap};

/// Most text the SentencePiece-style merges may hold (the two halves of every split, summed
/// over splits; see `vocab_splits`). Their number is at most the vocabulary's length in
/// bytes, but a vocabulary of long tokens each made of many shorter ones (`a`, `aa`, `aaa`, …)
/// has merges whose text grows as the 1.5th power of its own; real vocabularies' merges hold
/// a few times the vocabulary's text (tens of MB for Gemma 3's 262,144 tokens).
pub const MAX_MERGE_TEXT: usize = 256 << 20;

/// No token ends at this trie node.
const NO_TOKEN: u32 = u32::MAX;

/// A GGUF's control (type 3) and user-defined (type 4) tokens, matched whole in the raw text
/// before anything else, leftmost-longest: the `tokenizers` crate's added vocabulary's
/// matching (its tokens `normalized(false)`, no strip or single-word options), built in time
/// linear in the tokens' total length instead of quadratic in their number.
#[derive(Clone, Debug)]
pub(super) struct WholeTokens {
    /// Byte trie over the tokens' strings: the child of node `n` along byte `b` is
    /// `next[&(n, b)]`; node 0 is the root.
    next: HashMap<(u32, u8), u32>,
    /// Per node, the id of the token ending there, or [`NO_TOKEN`].
    id_at: Vec<u32>,
    /// Bytes some token starts with: most text positions are skipped on one look-up.
    starts: [bool; 256],
    /// `(id, special)` of each token, ids ascending: what a `tokenizer.json` lists as its
    /// `added_tokens` (special unless a user-defined token has the string).
    pub(super) listed: Vec<(u32, bool)>,
}

impl WholeTokens {
    /// The control and user-defined tokens of a GGUF vocabulary (`first`: the first id of each
    /// string, the id every one of its copies is encoded as); `None` when there are none.
    pub(super) fn new(
        tokens: &[&str],
        types: &[i64],
        first: &HashMap<&str, u32>,
    ) -> Option<WholeTokens> {
        let mut w = WholeTokens {
            next: HashMap::new(),
            id_at: vec![NO_TOKEN],
            starts: [false; 256],
            listed: Vec::new(),
        };
        let mut special: BTreeMap<u32, bool> = BTreeMap::new();
        // Control tokens first, then user-defined ones, as `from_gguf` used to add them to the
        // `tokenizers` crate: a string of both kinds ends up listed as not special.
        for kind in [3, 4] {
            for (&t, _) in tokens.iter().zip(types).filter(|(_, &ty)| ty == kind) {
                if t.is_empty() {
                    continue; // the tokenizers crate ignores empty added tokens
                }
                let id = first[t];
                w.insert(t, id);
                special.insert(id, kind == 3);
            }
        }
        w.listed = special.into_iter().collect();
        (!w.listed.is_empty()).then_some(w)
    }

    fn insert(&mut self, token: &str, id: u32) {
        let bytes = token.as_bytes();
        self.starts[bytes[0] as usize] = true;
        let mut node = 0u32;
        for &b in bytes {
            let fresh = self.id_at.len() as u32;
            node = *self.next.entry((node, b)).or_insert(fresh);
            if node == fresh {
                self.id_at.push(NO_TOKEN);
            }
        }
        self.id_at[node as usize] = id;
    }

    /// Non-overlapping `(start, end, id)` of the tokens in `text`, leftmost-longest (the
    /// `aho-corasick` `LeftmostLongest` semantics the tokenizers crate uses). A token starts
    /// with a UTF-8 lead byte and is whole characters, so every match is on char boundaries.
    pub(super) fn find(&self, text: &str) -> Vec<(usize, usize, u32)> {
        let bytes = text.as_bytes();
        let mut found = Vec::new();
        let mut pos = 0;
        while pos < bytes.len() {
            if !self.starts[bytes[pos] as usize] {
                pos += 1;
                continue;
            }
            let mut node = 0u32;
            let mut longest = None;
            for (j, &b) in bytes[pos..].iter().enumerate() {
                match self.next.get(&(node, b)) {
                    Some(&child) => node = child,
                    None => break,
                }
                let id = self.id_at[node as usize];
                if id != NO_TOKEN {
                    longest = Some((pos + j + 1, id));
                }
            }
            match longest {
                Some((end, id)) => {
                    found.push((pos, end, id));
                    pos = end;
                }
                None => pos += 1,
            }
        }
        found
    }
}

/// The Mersenne prime 2^61 - 1, modulus of [`vocab_splits`]'s rolling hashes.
const P61: u64 = (1 << 61) - 1;

fn mul61(a: u64, b: u64) -> u64 {
    let p = a as u128 * b as u128;
    // 2^61 = 1 (mod P61); for a, b < P61 the sum is below 2 * P61.
    let s = (p as u64 & P61) + (p >> 61) as u64;
    if s >= P61 {
        s - P61
    } else {
        s
    }
}

fn add61(a: u64, b: u64) -> u64 {
    let s = a + b;
    if s >= P61 {
        s - P61
    } else {
        s
    }
}

fn pow61(mut base: u64, mut exp: u64) -> u64 {
    let mut acc = 1;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = mul61(acc, base);
        }
        base = mul61(base, base);
        exp >>= 1;
    }
    acc
}

/// A hash base drawn per call from the process's random hasher keys, so that a file cannot
/// be built to make [`vocab_splits`]'s hashes collide.
pub(super) fn random_base() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    2 + h.finish() % (P61 - 3)
}

/// Every split of a normal token (type 1, and the first id of its string) into two
/// vocabulary tokens, as `(id, left, right)`: ids ascending, each token's splits left to
/// right (the order in which [`Tokenizer::from_gguf`] used to find them, one hashed string
/// per half and split, quadratic in a token's length).
///
/// Here a polynomial hash mod 2^61 - 1 of every token (its key: hash and length) is looked
/// up for each prefix and suffix, both hashed in O(1) from the token's running prefix hash,
/// and a split is taken after comparing the two strings found with its halves: time linear in
/// the vocabulary's total length plus the merges' text. Two different vocabulary strings with
/// one key (chance ~1e-7 per load with `base` random) make it fall back to the plain search.
/// `Err(id)`: with token `id` the merges' text passed [`MAX_MERGE_TEXT`].
pub(super) fn vocab_splits<'a>(
    tokens: &[&'a str],
    types: &[i64],
    first: &HashMap<&str, u32>,
    base: u64,
) -> std::result::Result<Vec<(u32, &'a str, &'a str)>, usize> {
    let normal = |id: usize, t: &str, ty: i64| ty == 1 && first[t] == id as u32;
    let mut keys: HashMap<(u64, usize), u32> = HashMap::with_capacity(first.len());
    let mut full = Vec::with_capacity(tokens.len());
    let mut collided = false;
    for (id, t) in tokens.iter().enumerate() {
        let (mut h, mut pw) = (0u64, 1u64);
        for &b in t.as_bytes() {
            h = add61(h, mul61(b as u64 + 1, pw));
            pw = mul61(pw, base);
        }
        full.push(h);
        let first_id = *keys.entry((h, t.len())).or_insert(id as u32);
        collided |= tokens[first_id as usize] != *t;
    }
    let mut splits = Vec::new();
    let mut text = 0usize;
    let mut take = |id: usize, l: &'a str, r: &'a str| {
        text += l.len() + r.len();
        splits.push((id as u32, l, r));
        if text > MAX_MERGE_TEXT {
            Err(id)
        } else {
            Ok(())
        }
    };
    if collided {
        for (id, (&t, &ty)) in tokens.iter().zip(types).enumerate() {
            if !normal(id, t, ty) {
                continue;
            }
            for (i, _) in t.char_indices().skip(1) {
                let (l, r) = t.split_at(i);
                if first.contains_key(l) && first.contains_key(r) {
                    take(id, l, r)?;
                }
            }
        }
        return Ok(splits);
    }
    let inverse = pow61(base, P61 - 2);
    for (id, (&t, &ty)) in tokens.iter().zip(types).enumerate() {
        if !normal(id, t, ty) {
            continue;
        }
        let bytes = t.as_bytes();
        // After step i: h = hash(t[..i]) = sum_{j<i} (t[j] + 1) base^j, pw = base^i,
        // inv = base^-i, and hash(t[i..]) = (full - h) base^-i.
        let (mut h, mut pw, mut inv) = (0u64, 1u64, 1u64);
        for i in 1..bytes.len() {
            h = add61(h, mul61(bytes[i - 1] as u64 + 1, pw));
            pw = mul61(pw, base);
            inv = mul61(inv, inverse);
            if !t.is_char_boundary(i) {
                continue;
            }
            let Some(&l) = keys.get(&(h, i)) else {
                continue;
            };
            let right = mul61(add61(full[id], P61 - h), inv);
            let Some(&r) = keys.get(&(right, bytes.len() - i)) else {
                continue;
            };
            let (left_str, right_str) = t.split_at(i);
            if tokens[l as usize] == left_str && tokens[r as usize] == right_str {
                take(id, left_str, right_str)?;
            }
        }
    }
    Ok(splits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The search [`vocab_splits`] replaces: every split hashed as two strings.
    fn plain_splits<'a>(
        tokens: &[&'a str],
        types: &[i64],
        first: &HashMap<&str, u32>,
    ) -> Vec<(u32, &'a str, &'a str)> {
        let mut out = Vec::new();
        for (id, (&t, &ty)) in tokens.iter().zip(types).enumerate() {
            if ty != 1 || first[t] != id as u32 {
                continue;
            }
            for (i, _) in t.char_indices().skip(1) {
                let (l, r) = t.split_at(i);
                if first.contains_key(l) && first.contains_key(r) {
                    out.push((id as u32, l, r));
                }
            }
        }
        out
    }

    fn first_ids<'a>(tokens: &[&'a str]) -> HashMap<&'a str, u32> {
        let mut first = HashMap::new();
        for (id, &t) in tokens.iter().enumerate() {
            first.entry(t).or_insert(id as u32);
        }
        first
    }

    #[test]
    fn vocab_splits_match_the_plain_search() {
        let mut rng = StdRng::seed_from_u64(59);
        // Few symbols, some multi-byte: many tokens share prefixes, suffixes and strings.
        let alphabet = ['a', 'b', '\u{2581}', 'é', '字'];
        for round in 0..40 {
            let n = rng.gen_range(1..400);
            let owned: Vec<String> = (0..n)
                .map(|_| {
                    let len = rng.gen_range(if round % 7 == 0 { 0 } else { 1 }..9);
                    (0..len)
                        .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
                        .collect()
                })
                .collect();
            let tokens: Vec<&str> = owned.iter().map(|s| s.as_str()).collect();
            let types: Vec<i64> = (0..n)
                .map(|_| [1, 1, 1, 3, 4, 6][rng.gen_range(0..6)])
                .collect();
            let first = first_ids(&tokens);
            let want = plain_splits(&tokens, &types, &first);
            assert_eq!(
                vocab_splits(&tokens, &types, &first, random_base()).unwrap(),
                want,
                "round {round}"
            );
            // Base 1 hashes a string to its byte sum: `ab` and `ba` collide, and the search
            // falls back to hashing strings.
            assert_eq!(
                vocab_splits(&tokens, &types, &first, 1).unwrap(),
                want,
                "round {round}, colliding hash"
            );
        }
    }

    #[test]
    fn vocab_splits_of_a_long_token_are_fast_and_bounded() {
        let long = "ab".repeat(200_000);
        let tokens = ["a", "b", "ab", long.as_str(), &long[..399_998]];
        let types = [1i64; 5];
        let first = first_ids(&tokens);
        let t = std::time::Instant::now();
        let splits = vocab_splits(&tokens, &types, &first, random_base()).unwrap();
        assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());
        // `ab` = a + b; the long token = ab + the shorter one = the shorter one + ab.
        let lens: Vec<(u32, usize)> = splits.iter().map(|s| (s.0, s.1.len())).collect();
        assert_eq!(lens, vec![(2, 1), (3, 2), (3, 399_998)]);
        // A chain a, aa, aaa, ...: its merges' text grows as the cube of the chain's length.
        let chain: Vec<String> = (1..=1200).map(|k| "a".repeat(k)).collect();
        let tokens: Vec<&str> = chain.iter().map(|s| s.as_str()).collect();
        let types = vec![1i64; tokens.len()];
        let first = first_ids(&tokens);
        let text: usize = (1..=1200usize).map(|k| k * (k - 1)).sum();
        assert!(text > MAX_MERGE_TEXT);
        let err = vocab_splits(&tokens, &types, &first, random_base()).unwrap_err();
        assert!((900..1200).contains(&err), "{err}");
    }

    #[test]
    fn whole_tokens_match_leftmost_longest() {
        let tokens = ["<a>", "<ab>", "b", "<a", "\n\n", "\n\n\n", "é"];
        let types = [3i64, 3, 1, 4, 4, 4, 1];
        let first = first_ids(&tokens);
        let w = WholeTokens::new(&tokens, &types, &first).unwrap();
        assert_eq!(
            w.listed,
            vec![(0, true), (1, true), (3, false), (4, false), (5, false)]
        );
        // `<ab>` over `<a`, `\n\n\n` over `\n\n`; the last `\n` and `<` match nothing.
        assert_eq!(
            w.find("é<ab><a><a\n\n\n\n<"),
            vec![(2, 6, 1), (6, 9, 0), (9, 11, 3), (11, 14, 5)]
        );
        assert!(WholeTokens::new(&["x"], &[1], &first_ids(&["x"])).is_none());
    }
}
