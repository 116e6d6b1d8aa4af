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

/// The field the log line names for `e`, serde_json's error on `bytes`:
/// the top-level field that fails on its own, else (valid JSON that does
/// not fit) the key serde_json stopped in, else the one its message names;
/// `<root>` when there is none (not a JSON object).
pub(super) fn bad_field(bytes: &[u8], e: &serde_json::Error) -> String {
    locate_bad_field(bytes)
        .or_else(|| {
            serde_json::from_slice::<serde_json::Value>(bytes)
                .is_ok()
                .then(|| field_at(bytes, e.line(), e.column()))
                .flatten()
        })
        .or_else(|| field_in_message(&e.to_string()))
        .unwrap_or_else(|| "<root>".into())
}

/// serde_json's errors carry a line and column, not a field path; find the
/// top-level field that fails on its own so the log line can name it.
fn locate_bad_field(bytes: &[u8]) -> Option<String> {
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

/// The path (`sync.bridge_cluster`) of the innermost object key whose
/// value holds the position serde_json reported an error at (its 1-based
/// `line` and `column`). None outside any object, inside a top-level
/// array, or through a key that is empty or does not decode. Meant for
/// input that is valid JSON (see [`bad_field`]). The fallback when no
/// top-level field fails on its own: inside a nested object serde_json's
/// own map keeps only the last of a key given twice, so a bad first value
/// there reads fine alone (`{"sync":{"poll_ms":"x","poll_ms":5}}`).
fn field_at(bytes: &[u8], line: usize, column: usize) -> Option<String> {
    let line_start = if line <= 1 {
        0
    } else {
        bytes
            .iter()
            .enumerate()
            .filter(|(_, &b)| b == b'\n')
            .nth(line - 2)
            .map(|(i, _)| i + 1)?
    };
    let end = line_start.saturating_add(column).min(bytes.len());
    // Per open container: the key being read in an object (None in an
    // array, or before an object's first key).
    let mut stack: Vec<(bool, Option<String>)> = Vec::new();
    let mut expect_key = false;
    let mut i = 0;
    while i < end {
        match bytes[i] {
            b'{' => {
                stack.push((true, None));
                expect_key = true;
            }
            b'[' => {
                stack.push((false, None));
                expect_key = false;
            }
            b'}' | b']' => {
                stack.pop();
                expect_key = false;
            }
            b',' => expect_key = stack.last().is_some_and(|(object, _)| *object),
            b':' => expect_key = false,
            b'"' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                let raw = bytes.get(start..=i)?;
                if expect_key {
                    let key = serde_json::from_slice::<String>(raw).ok()?;
                    if let Some(top) = stack.last_mut() {
                        top.1 = Some(key);
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    // A configuration is an object: inside a top-level array, no field.
    if !stack.first().is_some_and(|(object, _)| *object) {
        return None;
    }
    let path: Vec<&str> = stack.iter().filter_map(|(_, k)| k.as_deref()).collect();
    (!path.is_empty() && path.iter().all(|k| !k.is_empty())).then(|| path.join("."))
}

/// The field serde names in its message (`duplicate field `x``, `unknown
/// field `x``): the fallback when no top-level field fails on its own, e.g. a
/// key given twice (serde_json's map keeps only the last one).
fn field_in_message(msg: &str) -> Option<String> {
    let (_, rest) = msg.split_once(" field `")?;
    let (name, _) = rest.split_once('`')?;
    (!name.is_empty()).then(|| name.to_string())
}
