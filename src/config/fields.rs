//! Where a plugin configuration went wrong: serde_json's errors carry a
//! line and column, not a field path, so these find the field to name in the
//! log line, and which fields the operator wrote at all.

use std::fmt;

use serde::Deserialize;

use super::RawConfig;

/// The fields the operator wrote, as paths (`block_size`, `sync.poll_ms`).
pub(super) fn given_fields(bytes: &[u8]) -> Vec<String> {
    let Ok(serde_json::Value::Object(top)) = serde_json::from_slice(bytes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, v) in &top {
        out.push(k.clone());
        if let serde_json::Value::Object(inner) = v {
            out.extend(inner.keys().map(|i| format!("{k}.{i}")));
        }
    }
    out
}

/// serde_json's errors carry a line and column, not a field path; find the
/// top-level field that fails on its own so the log line can name it.
pub(super) fn locate_bad_field(bytes: &[u8]) -> Option<String> {
    let entries = serde_json::from_slice::<Entries>(bytes).ok()?.0;
    let alone = entries.iter().find_map(|(key, value)| {
        let mut single = serde_json::Map::new();
        single.insert(key.clone(), value.clone());
        serde_json::from_value::<RawConfig>(serde_json::Value::Object(single))
            .is_err()
            .then(|| key.clone())
    });
    // Every field is fine alone: a key given twice is what fails.
    alone.or_else(|| {
        entries
            .iter()
            .enumerate()
            .find(|(i, (k, _))| entries[..*i].iter().any(|(p, _)| p == k))
            .map(|(_, (k, _))| k.clone())
    })
}

/// A JSON object's top-level entries in order, keys given twice kept
/// (serde_json's `Map` keeps only the last).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, serde_json::Value>()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// The field serde names in its message (`duplicate field `x``, `unknown
/// field `x``): the fallback when no top-level field fails on its own, e.g. a
/// key given twice (serde_json's map keeps only the last one).
pub(super) fn field_in_message(msg: &str) -> Option<String> {
    let (_, rest) = msg.split_once(" field `")?;
    let (name, _) = rest.split_once('`')?;
    (!name.is_empty()).then(|| name.to_string())
}
