//! Which fields of two plugin configurations mean different things: the
//! filter and the sync singleton are each given a copy of the plugin JSON,
//! and the singleton names the fields in which its copy differs from the
//! filter's (the `deployment` module).
//!
//! Two copies differ where their effective [`Settings`] differ, not their
//! text: key order, spacing and a default written out or left implicit do
//! not count. A field differs when taking the other copy's value for it
//! alone changes the effective settings. `sync.auth_password` is never
//! compared (settings never show it).

use serde_json::{Map, Value};

use super::Settings;

/// Most fields named; the rest are summed up.
const MAX_NAMED: usize = 8;

/// The dotted paths (`block_size`, `sync.enabled`) of the fields in which
/// `filter` and `singleton` differ in effect; empty when they agree. A copy
/// that does not parse is named as `(configuration)`.
pub(crate) fn differing_fields(filter: &[u8], singleton: &[u8]) -> Vec<String> {
    let (Ok(a), Ok(b)) = (
        serde_json::from_slice::<Value>(filter),
        serde_json::from_slice::<Value>(singleton),
    ) else {
        return vec!["(configuration)".into()];
    };
    let base = effective(&a);
    if base.is_some() && base == effective(&b) {
        return Vec::new();
    }
    let mut out = Vec::new();
    walk(&a, &b, &[], &base, &mut out);
    if out.is_empty() {
        // Only a combination of fields differs (each alone is refused or
        // means nothing): name the copies, not a field.
        out.push("(configuration)".into());
    }
    if out.len() > MAX_NAMED {
        let more = out.len() - MAX_NAMED;
        out.truncate(MAX_NAMED);
        out.push(format!("and {more} more"));
    }
    out
}

/// The settings a JSON value means, as comparable text (`None` if refused).
fn effective(v: &Value) -> Option<String> {
    let bytes = serde_json::to_vec(v).ok()?;
    Settings::from_json(&bytes).ok().map(|s| format!("{s:?}"))
}

fn object_at<'a>(root: &'a Value, path: &[String]) -> Option<&'a Map<String, Value>> {
    path.iter()
        .try_fold(root, |v, k| v.get(k))
        .and_then(Value::as_object)
}

/// `root` with the field at `path` replaced by `value` (removed if None).
fn with_field(root: &Value, path: &[String], value: Option<&Value>) -> Value {
    let mut out = root.clone();
    let Some((last, parents)) = path.split_last() else {
        return out;
    };
    let mut cur = &mut out;
    for k in parents {
        let Some(obj) = cur.as_object_mut() else {
            return out;
        };
        cur = obj
            .entry(k.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if let Some(obj) = cur.as_object_mut() {
        match value {
            Some(v) => {
                obj.insert(last.clone(), v.clone());
            }
            None => {
                obj.remove(last);
            }
        }
    }
    out
}

/// Names each field under `path` whose value in `b`, put into `a` alone,
/// changes `a`'s effective settings; recurses into objects both sides hold.
fn walk(a: &Value, b: &Value, path: &[String], base: &Option<String>, out: &mut Vec<String>) {
    let empty = Map::new();
    let oa = object_at(a, path).unwrap_or(&empty);
    let ob = object_at(b, path).unwrap_or(&empty);
    let mut keys: Vec<&String> = oa.keys().chain(ob.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let (va, vb) = (oa.get(key), ob.get(key));
        if va == vb {
            continue;
        }
        let mut here = path.to_vec();
        here.push(key.clone());
        if effective(&with_field(a, &here, vb)) == *base {
            continue;
        }
        let before = out.len();
        if va.is_some_and(Value::is_object) && vb.is_some_and(Value::is_object) {
            walk(a, b, &here, base, out);
        }
        if out.len() == before {
            out.push(here.join("."));
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::differing_fields;

    const FILTER: &str = r#"{"endpoints": ["10.0.0.1:8000", "10.0.0.2:8000"],
        "sync": {"enabled": true, "bridge_cluster": "redis_bridge"}}"#;

    #[test]
    fn identical_copies_agree() {
        assert!(differing_fields(FILTER.as_bytes(), FILTER.as_bytes()).is_empty());
    }

    #[test]
    fn order_spacing_and_written_defaults_do_not_count() {
        let singleton = r#"{"sync":{"bridge_cluster":"redis_bridge","enabled":true},
            "block_size": 128, "endpoints":["10.0.0.1:8000","10.0.0.2:8000"]}"#;
        assert!(differing_fields(FILTER.as_bytes(), singleton.as_bytes()).is_empty());
    }

    #[test]
    fn a_top_level_field_is_named() {
        let singleton = FILTER.replace("\"endpoints\"", "\"block_size\": 64, \"endpoints\"");
        assert_eq!(
            differing_fields(FILTER.as_bytes(), singleton.as_bytes()),
            vec!["block_size".to_string()]
        );
    }

    #[test]
    fn a_nested_field_is_named_by_its_path() {
        let singleton = FILTER.replace("\"enabled\": true", "\"enabled\": false");
        assert_eq!(
            differing_fields(FILTER.as_bytes(), singleton.as_bytes()),
            vec!["sync.enabled".to_string()]
        );
    }

    #[test]
    fn every_differing_field_is_named() {
        let singleton = r#"{"endpoints": ["10.0.0.1:8000"], "hash_seed": 7,
            "sync": {"enabled": true, "bridge_cluster": "other"}}"#;
        assert_eq!(
            differing_fields(FILTER.as_bytes(), singleton.as_bytes()),
            vec!["endpoints", "hash_seed", "sync.bridge_cluster"]
        );
    }

    #[test]
    fn an_unparsable_copy_is_named_as_a_whole() {
        assert_eq!(
            differing_fields(FILTER.as_bytes(), b"{not json"),
            vec!["(configuration)".to_string()]
        );
    }

    #[test]
    fn a_default_in_effect_only_in_compat_mode_counts() {
        // AIBrix mode's block size is 4 unless stated: stating 128 in one
        // copy changes its effect there.
        let filter = r#"{"compat": "aibrix", "cluster": "pods"}"#;
        let singleton = r#"{"compat": "aibrix", "cluster": "pods", "block_size": 128}"#;
        assert_eq!(
            differing_fields(filter.as_bytes(), singleton.as_bytes()),
            vec!["block_size".to_string()]
        );
    }
}
