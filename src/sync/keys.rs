//! The Redis key layout shared with AIBrix's Go gateways:
//! `{prefix}:{{ns}}:e:{id}` for entities, with the namespace in braces as a
//! Redis Cluster hash tag so one namespace lives in one slot; plus this
//! project's change-log stream `{prefix}:{{ns}}:log` in the same slot.
//!
//! With `sync.hash_tags` K > 1 a namespace is split into K *parts*, each
//! with its own hash tag (so its own Redis Cluster slot) and its own change
//! log: an entity id goes to part `xxh64(id) mod K` (see [`part_of`]), and
//! the tags are chosen so their slots are evenly spaced over the 16,384
//! slots (see [`namespace_tags`]): a cluster whose masters own contiguous,
//! equal slot ranges (what `redis-cli --cluster create` makes) then holds
//! K/N parts per master. K = 1 is the layout above, byte for byte.

/// Builds the keys of one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyLayout {
    entity_prefix: String,
    log_key: String,
    scan_pattern: String,
}

impl KeyLayout {
    /// Layout for namespace `ns` under `prefix` (both checked by settings /
    /// registration: non-empty, no braces): one part, the namespace as tag.
    #[cfg(test)]
    pub(crate) fn new(prefix: &str, ns: &str) -> Self {
        Self::with_tag(prefix, ns)
    }

    /// Layout of one part whose hash tag is `tag` (the namespace itself
    /// when there is one part).
    pub(crate) fn with_tag(prefix: &str, tag: &str) -> Self {
        let entity_prefix = format!("{prefix}:{{{tag}}}:e:");
        // The prefix is user-chosen: escape glob metacharacters so MATCH
        // never selects keys of another prefix.
        let scan_pattern = format!("{}*", glob_escape(&entity_prefix));
        Self {
            log_key: format!("{prefix}:{{{tag}}}:log"),
            entity_prefix,
            scan_pattern,
        }
    }

    /// Key of one entity.
    pub(crate) fn entity_key(&self, id: &str) -> String {
        format!("{}{id}", self.entity_prefix)
    }

    /// Entity id of a key, or None when the key is not one of ours.
    pub(crate) fn entity_id<'a>(&self, key: &'a str) -> Option<&'a str> {
        key.strip_prefix(self.entity_prefix.as_str())
    }

    /// The part of every entity key before the id.
    pub(crate) fn entity_prefix(&self) -> &str {
        &self.entity_prefix
    }

    /// `SCAN ... MATCH` pattern selecting exactly this namespace's entities.
    pub(crate) fn scan_pattern(&self) -> &str {
        &self.scan_pattern
    }

    /// Key of the namespace's change-log stream.
    pub(crate) fn log_key(&self) -> &str {
        &self.log_key
    }
}

/// Redis Cluster slots.
pub(crate) const SLOTS: u16 = 16_384;

/// CRC16/XMODEM, the checksum Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The Redis Cluster slot of `key`: CRC16 of its hash tag (the part
/// between the first `{` and the next `}`, when not empty) or of the whole
/// key, mod 16,384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// Candidates tried per part when looking for a tag in its slot range.
const TAG_SEARCH_LIMIT: u32 = 1_000_000;

/// The hash tags of namespace `ns` split into `parts` parts: `[ns]` for one
/// part (today's layout); else part `i` gets the first of `ns.i`,
/// `ns.i.1`, `ns.i.2`, ... whose slot falls in the `i`-th of `parts` equal
/// slot ranges, so the parts' slots are evenly spaced. A pure function of
/// its arguments: every replica computes the same tags.
pub(crate) fn namespace_tags(ns: &str, parts: usize) -> Vec<String> {
    if parts <= 1 {
        return vec![ns.to_owned()];
    }
    let n = parts as u32;
    (0..n)
        .map(|i| {
            let lo = u32::from(SLOTS) * i / n;
            let hi = u32::from(SLOTS) * (i + 1) / n;
            let base = format!("{ns}.{i}");
            if (lo..hi).contains(&u32::from(crc16(base.as_bytes()) % SLOTS)) {
                return base;
            }
            (1..TAG_SEARCH_LIMIT)
                .map(|j| format!("{ns}.{i}.{j}"))
                .find(|t| (lo..hi).contains(&u32::from(crc16(t.as_bytes()) % SLOTS)))
                .unwrap_or(base)
        })
        .collect()
}

/// The part (of `parts`) entity `id` belongs to; always 0 for one part.
pub(crate) fn part_of(id: &str, parts: usize) -> usize {
    if parts <= 1 {
        return 0;
    }
    (xxhash_rust::xxh64::xxh64(id.as_bytes(), 0) % parts as u64) as usize
}

/// Escapes Redis glob metacharacters (`* ? [ ] \`).
pub(crate) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn key_format_has_prefix_and_hash_tag() {
        let k = KeyLayout::new("aibrix", "prefixcache");
        assert_eq!(
            k.entity_key("1234567890"),
            "aibrix:{prefixcache}:e:1234567890"
        );
        assert_eq!(k.scan_pattern(), "aibrix:{prefixcache}:e:*");
        assert_eq!(k.log_key(), "aibrix:{prefixcache}:log");
        assert_eq!(k.entity_id("aibrix:{prefixcache}:e:42"), Some("42"));
        assert_eq!(k.entity_id("aibrix:{podload}:e:42"), None);
        let custom = KeyLayout::new("prod-eu", "podload");
        assert_eq!(custom.entity_key("pod-1"), "prod-eu:{podload}:e:pod-1");
    }

    #[test]
    fn slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(
            key_slot(b"aibrix:{prefixcache}:e:1"),
            key_slot(b"prefixcache")
        );
    }

    #[test]
    fn one_part_is_the_namespace_and_k_parts_spread_evenly() {
        assert_eq!(namespace_tags("prefixcache", 1), vec!["prefixcache"]);
        assert_eq!(part_of("12345", 1), 0);
        for k in [2, 3, 16, 64] {
            let tags = namespace_tags("prefixcache", k);
            assert_eq!(tags.len(), k);
            for (i, tag) in tags.iter().enumerate() {
                let slot = u32::from(key_slot(tag.as_bytes()));
                let (lo, hi) = (
                    16_384 * i as u32 / k as u32,
                    16_384 * (i as u32 + 1) / k as u32,
                );
                assert!(
                    (lo..hi).contains(&slot),
                    "{tag} slot {slot} not in [{lo}, {hi})"
                );
                assert!(!tag.contains('{') && !tag.contains('}'));
            }
            // The same on every call (every replica).
            assert_eq!(tags, namespace_tags("prefixcache", k));
            let mut counts = vec![0usize; k];
            for id in 0..(k * 1000) {
                counts[part_of(&id.to_string(), k)] += 1;
            }
            assert!(counts.iter().all(|&c| c > 800 && c < 1200), "{counts:?}");
        }
    }

    #[test]
    fn scan_pattern_escapes_glob_characters() {
        let k = KeyLayout::new("a*b[1]", "ns");
        assert_eq!(k.scan_pattern(), "a\\*b\\[1\\]:{ns}:e:*");
    }
}
