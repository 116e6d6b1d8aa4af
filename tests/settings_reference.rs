//! docs/settings.md is held to the configuration code: every setting the
//! parser accepts has exactly one row there, every row names a setting the
//! parser accepts, and each row's default, written out, configures exactly
//! what leaving the field out does. A setting added, removed or re-defaulted
//! without its row fails here.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use envoy_prefix_router::config::Settings;
use serde_json::{json, Value};

const REFERENCE: &str = include_str!("../docs/settings.md");

/// A field name no configuration has: the parser's refusal of it lists the
/// fields it accepts at that level.
const PROBE: &str = "__settings_reference_probe__";

/// Two configurations with a pool, each leaving the other's pool field out,
/// so a pool field's own default can be written out on the other.
fn bases() -> [Value; 2] {
    [
        json!({ "endpoints": ["127.0.0.1:1"] }),
        json!({ "model_endpoints": { "m": ["127.0.0.1:1"] } }),
    ]
}

/// `value` at dotted `path` in `config` (objects made, or put in place of
/// a leaf, as needed).
fn with(config: &Value, path: &str, value: Value) -> Value {
    let mut out = config.clone();
    let mut at = &mut out;
    let parts: Vec<&str> = path.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        let next = at
            .as_object_mut()
            .expect("an object")
            .entry(part.to_string())
            .or_insert_with(|| json!({}));
        // A probe under a leaf (the base's pool list) replaces it.
        if !next.is_object() {
            *next = json!({});
        }
        at = next;
    }
    at[parts[parts.len() - 1]] = value;
    out
}

/// The fields accepted under `prefix` (`""` = top level), from the parser's
/// refusal of an unknown one; None where `prefix` is not an object of named
/// fields (a leaf setting: a number, a list, a map of pools, ...).
fn fields_under(prefix: &str) -> Option<Vec<String>> {
    let path = if prefix.is_empty() {
        PROBE.to_string()
    } else {
        format!("{prefix}.{PROBE}")
    };
    let config = with(&bases()[0], &path, json!(0));
    let reason = match Settings::from_json(config.to_string().as_bytes()) {
        Ok(_) => panic!("{path} accepted"),
        Err(e) => e.reason,
    };
    let unknown = format!("unknown field `{PROBE}`");
    if !reason.starts_with(&unknown) {
        return None;
    }
    // "..., expected one of `a`, `b` at line 1 column 9" or "expected `a`".
    let listed = reason.split("expected").nth(1).unwrap_or("");
    let names = listed
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    Some(names)
}

/// Every setting the parser accepts, as a dotted path to a leaf.
fn settings_in_code() -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![String::new()];
    while let Some(prefix) = pending.pop() {
        match fields_under(&prefix) {
            Some(fields) => {
                assert!(!fields.is_empty(), "no fields listed under {prefix:?}");
                for f in fields {
                    pending.push(if prefix.is_empty() {
                        f
                    } else {
                        format!("{prefix}.{f}")
                    });
                }
            }
            None => out.push(prefix),
        }
    }
    out.sort();
    out
}

/// The rows of the reference table: setting -> its default, as JSON.
fn settings_in_reference() -> BTreeMap<String, Value> {
    let mut rows = BTreeMap::new();
    for line in REFERENCE.lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split(" | ").collect();
        if cells.len() < 3 || !cells[0].trim().starts_with('`') {
            continue;
        }
        let name = cells[0].trim().trim_matches('`').to_string();
        let default = cells[1].trim().trim_matches('`');
        let value: Value = serde_json::from_str(default)
            .unwrap_or_else(|e| panic!("row {name}: default {default:?} is not JSON: {e}"));
        assert!(
            !cells[2].trim().is_empty(),
            "row {name} says nothing of what it does"
        );
        assert!(
            rows.insert(name.clone(), value).is_none(),
            "row {name} appears twice"
        );
    }
    rows
}

#[test]
fn every_setting_in_the_code_has_a_row_and_every_row_a_setting() {
    let code = settings_in_code();
    let reference = settings_in_reference();
    assert!(code.len() > 40, "found only {code:?}");
    let missing: Vec<&String> = code
        .iter()
        .filter(|s| !reference.contains_key(*s))
        .collect();
    let extra: Vec<&String> = reference.keys().filter(|s| !code.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "settings without a row in docs/settings.md: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "rows of docs/settings.md the configuration code does not accept: {extra:?}"
    );
}

#[test]
fn every_documented_default_is_the_codes_default() {
    for (name, default) in settings_in_reference() {
        let top = name.split('.').next().unwrap_or_default();
        let base = bases()
            .into_iter()
            .find(|b| b.get(top).is_none())
            .expect("a base without the field");
        let left_out = Settings::from_json(base.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("base {base}: {e}"));
        let config = with(&base, &name, default.clone());
        let written = Settings::from_json(config.to_string().as_bytes()).unwrap_or_else(|e| {
            panic!("docs/settings.md's default of {name}, {default}, is refused: {e}")
        });
        assert_eq!(
            format!("{written:?}"),
            format!("{left_out:?}"),
            "docs/settings.md says {name} defaults to {default}; the code's default differs"
        );
    }
}
