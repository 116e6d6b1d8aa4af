//! The Redis key layout shared with AIBrix's Go gateways:
//! `{prefix}:{{ns}}:e:{id}` for entities, with the namespace in braces as a
//! Redis Cluster hash tag so one namespace lives in one slot; plus this
//! project's change-log stream `{prefix}:{{ns}}:log` in the same slot.

/// Builds the keys of one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyLayout {
    entity_prefix: String,
    log_key: String,
    scan_pattern: String,
}

impl KeyLayout {
    /// Layout for namespace `ns` under `prefix` (both checked by settings /
    /// registration: non-empty, no braces).
    pub(crate) fn new(prefix: &str, ns: &str) -> Self {
        let entity_prefix = format!("{prefix}:{{{ns}}}:e:");
        // The prefix is user-chosen: escape glob metacharacters so MATCH
        // never selects keys of another prefix.
        let scan_pattern = format!("{}*", glob_escape(&entity_prefix));
        Self {
            log_key: format!("{prefix}:{{{ns}}}:log"),
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
    fn scan_pattern_escapes_glob_characters() {
        let k = KeyLayout::new("a*b[1]", "ns");
        assert_eq!(k.scan_pattern(), "a\\*b\\[1\\]:{ns}:e:*");
    }
}
