//! The plugin configuration: defaults, compat mode, refusals by field.

use super::*;
use crate::route::policy::{LoadAwareConfig, PolicyMode};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn parse(s: &str) -> Result<Settings, ConfigError> {
    Settings::from_json(s.as_bytes())
}

#[test]
fn aibrix_compat_sets_its_defaults_and_refuses_what_cannot_interoperate() {
    let s = parse(r#"{"compat":"aibrix","cluster":"pods"}"#).unwrap();
    assert_eq!(s.compat, Compat::Aibrix);
    assert_eq!(s.block_size, AIBRIX_BLOCK_SIZE);
    assert_eq!(s.dense_prefix_blocks, AIBRIX_DENSE_BLOCKS);
    assert_eq!(s.table_capacity_blocks, AIBRIX_TABLE_CAPACITY);
    assert_eq!(s.sync.full_scan_every, 1);
    assert_eq!(s.membership.pod_name, PodNaming::Hostname);
    assert_eq!(s.render(), crate::route::request::Render::Aibrix);
    // Stated values win where they can interoperate.
    let s = parse(
        r#"{"compat":"aibrix","cluster":"pods","block_size":16,"dense_prefix_blocks":100,"table_capacity_blocks":1000,"sync":{"full_scan_every":1}}"#,
    )
    .unwrap();
    assert_eq!((s.block_size, s.dense_prefix_blocks), (16, 100));
    assert_eq!(s.table_capacity_blocks, 1000);
    for (json, field) in [
        (r#"{"compat":"aibrix","endpoints":["a:1"]}"#, "endpoints"),
        (
            r#"{"compat":"aibrix","cluster":"p","model_endpoints":{"m":["a:1"]}}"#,
            "model_endpoints",
        ),
        (
            r#"{"compat":"aibrix","cluster":"p","membership":{"pod_name":"address"}}"#,
            "membership.pod_name",
        ),
        (
            r#"{"compat":"aibrix","cluster":"p","sync":{"full_scan_every":6}}"#,
            "sync.full_scan_every",
        ),
        (
            r#"{"compat":"aibrix","cluster":"p","sync":{"hash_tags":4}}"#,
            "sync.hash_tags",
        ),
        (r#"{"compat":"sglang","cluster":"p"}"#, "compat"),
    ] {
        assert_eq!(parse(json).unwrap_err().field, field, "{json}");
    }
    // Without compat nothing changes.
    let s = parse(r#"{"cluster":"pods"}"#).unwrap();
    assert_eq!(
        (s.compat, s.block_size, s.dense_prefix_blocks),
        (Compat::None, 128, 32)
    );
}

#[test]
fn defaults_apply() {
    let s = parse(r#"{"endpoints":["10.0.0.2:8000","10.0.0.1:8000"]}"#).unwrap();
    assert_eq!(s.block_size, 128);
    assert_eq!(s.hash_seed, 0);
    assert_eq!(s.table_capacity_blocks, 200_000);
    assert_eq!(s.table_idle_expiry_secs, 1200);
    assert_eq!(s.imbalance_abs_count, 16);
    assert_eq!(s.stddev_factor, 2.0);
    assert_eq!(s.match_header, None);
    assert_eq!(s.static_pools()[""], vec!["10.0.0.1:8000", "10.0.0.2:8000"]);
    assert_eq!(s.membership.refresh_ms, 500);
    assert_eq!(s.passive_cooldown_ms, 3000);
    assert!(!s.sync.enabled);
}

#[test]
fn model_pools_are_their_own_lists() {
    let s = parse(r#"{"endpoints":["a:1","b:1"],"model_endpoints":{"m":["b:1","c:1"]}}"#).unwrap();
    assert_eq!(s.static_pools()["m"], vec!["b:1", "c:1"]);
    assert_eq!(s.static_pools()[""], vec!["a:1", "b:1"]);
    assert!(s.cluster_pools().is_empty());
}

#[test]
fn a_pool_names_a_list_or_a_cluster_never_both_or_neither() {
    let s = parse(r#"{"cluster":"pods","model_clusters":{"m":"pods-m"}}"#).unwrap();
    assert_eq!(s.cluster_pools()[""], "pods");
    assert_eq!(s.cluster_pools()["m"], "pods-m");
    for (cfg, field) in [
        (r#"{"endpoints":["a:1"],"cluster":"pods"}"#, "cluster"),
        (
            r#"{"model_endpoints":{"m":["a:1"]},"model_clusters":{"m":"c"}}"#,
            "model_clusters.m",
        ),
        (r#"{"model_clusters":{"m":""}}"#, "model_clusters"),
        (
            r#"{"cluster":"pods","membership":{"admin_cluster":""}}"#,
            "membership.admin_cluster",
        ),
        (
            r#"{"cluster":"pods","membership":{"refresh_ms":0}}"#,
            "membership.refresh_ms",
        ),
        (
            r#"{"cluster":"pods","membership":{"pod_name":"ip"}}"#,
            "membership",
        ),
    ] {
        let e = parse(cfg).unwrap_err();
        assert_eq!(e.field, field, "{cfg}: {e}");
    }
}

#[test]
fn unknown_field_is_refused_by_name() {
    let e = parse(r#"{"endpoints":["a:1"],"blocksize":4}"#).unwrap_err();
    assert_eq!(e.field, "blocksize");
    assert!(e.to_string().contains("blocksize"));
}

#[test]
fn invalid_values_are_refused_by_name() {
    for (cfg, field) in [
        (r#"{"endpoints":["a:1"],"block_size":0}"#, "block_size"),
        (
            r#"{"endpoints":["a:1"],"table_capacity_blocks":1}"#,
            "table_capacity_blocks",
        ),
        (
            r#"{"endpoints":["a:1"],"table_idle_expiry_secs":0}"#,
            "table_idle_expiry_secs",
        ),
        (
            r#"{"endpoints":["a:1"],"stddev_factor":-1}"#,
            "stddev_factor",
        ),
        (
            r#"{"endpoints":["a:1"],"match_header":"Bad Header"}"#,
            "match_header",
        ),
        (r#"{"endpoints":["nope"]}"#, "endpoints"),
        (r#"{"endpoints":["a:0"]}"#, "endpoints"),
        (r#"{}"#, "endpoints"),
        (r#"{"model_endpoints":{"m":[]}}"#, "model_endpoints.m"),
        (r#"{"endpoints":["a:1"],"block_size":"x"}"#, "block_size"),
        (r#"{"endpoints":["a:1"],"sync":{"nope":1}}"#, "sync"),
    ] {
        let e = parse(cfg).unwrap_err();
        assert_eq!(e.field, field, "{cfg}: {e}");
    }
}

#[test]
fn more_model_pools_than_the_registry_keeps_for_them_are_refused_by_field() {
    use crate::shared::registry::{MAX_MODEL_POOLS, MAX_NAME};
    let pools = |n: usize, kind: &str| -> String {
        let list: Vec<String> = (0..n)
            .map(|i| match kind {
                "endpoints" => format!(r#""m{i}":["a:1"]"#),
                _ => format!(r#""m{i}":"c""#),
            })
            .collect();
        format!(
            r#"{{"endpoints":["a:1"],"model_{kind}":{{{}}}}}"#,
            list.join(",")
        )
    };
    assert!(parse(&pools(MAX_MODEL_POOLS, "endpoints")).is_ok());
    let e = parse(&pools(MAX_MODEL_POOLS + 1, "endpoints")).unwrap_err();
    assert_eq!(e.field, "model_endpoints", "{e}");
    let e = parse(&pools(MAX_MODEL_POOLS + 1, "clusters")).unwrap_err();
    assert_eq!(e.field, "model_clusters", "{e}");
    let long = "m".repeat(MAX_NAME + 1);
    let e = parse(&format!(
        r#"{{"endpoints":["a:1"],"model_clusters":{{"{long}":"c"}}}}"#
    ))
    .unwrap_err();
    assert_eq!(e.field, "model_clusters", "{e}");
}

#[test]
fn a_key_given_twice_is_refused_by_name() {
    let e = parse(r#"{"endpoints":["a:1"],"block_size":4,"block_size":8}"#).unwrap_err();
    assert_eq!(e.field, "block_size");
    // The first of the two is bad on its own.
    let e = parse(r#"{"endpoints":["a:1"],"membership":{"nope":1},"membership":{}}"#).unwrap_err();
    assert_eq!(e.field, "membership");
    // Both are fine alone: the repeated key is named.
    let e = parse(r#"{"endpoints":["a:1"],"cluster":"c","cluster":"c"}"#).unwrap_err();
    assert_eq!(e.field, "cluster");
}

#[test]
fn a_bad_value_inside_a_nested_object_is_named_by_its_path() {
    // Given twice, the bad first value hides from a check of `sync` alone
    // (a JSON map keeps the last): found from where serde_json stopped.
    let e = parse(
        r#"{"endpoints":["a:1"],"sync":{"poll_ms":175,"bridge_cluster":175,"bridge_cluster":"b"}}"#,
    )
    .unwrap_err();
    assert_eq!(e.field, "sync.bridge_cluster", "{e}");
    let e = parse(r#"{"endpoints":["a:1"],"sync":{"enabled":true,"enabled":false}}"#).unwrap_err();
    assert_eq!(e.field, "sync.enabled", "{e}");
    // Across lines, and past a string holding brackets and an escaped quote.
    let e = parse(
        "{\"endpoints\":[\"a:1\"],\n\"sync\":{\"key_prefix\":\"{[\\\"\",\n\"poll_ms\":\"x\",\"poll_ms\":5}}",
    )
    .unwrap_err();
    assert_eq!(e.field, "sync.poll_ms", "{e}");
    // serde_json calls a number where a name is expected a syntax error.
    let e = parse(r#"{"endpoints":["a:1"],"membership":{"pod_name":0,"pod_name":"hostname"}}"#)
        .unwrap_err();
    assert_eq!(e.field, "membership.pod_name", "{e}");
}

#[test]
fn not_json_is_refused() {
    assert!(parse("endpoints: [a]").is_err());
    assert!(parse("").is_err());
}

#[test]
fn policy_defaults_to_load_aware_and_compat_aibrix_to_aibrix_unless_stated() {
    let s = parse(r#"{"endpoints":["a:1"]}"#).unwrap();
    assert_eq!(s.policy, PolicyMode::LoadAware);
    assert_eq!(s.load_aware, LoadAwareConfig::default());
    let s = parse(r#"{"compat":"aibrix","cluster":"pods"}"#).unwrap();
    assert_eq!(s.policy, PolicyMode::Aibrix);
    let s =
        parse(r#"{"compat":"aibrix","cluster":"pods","policy":{"mode":"load_aware"}}"#).unwrap();
    assert_eq!(s.policy, PolicyMode::LoadAware);
    let s = parse(
        r#"{"endpoints":["a:1"],"policy":{"mode":"aibrix","slack_abs":3,"slack_rel":1.0,"queue_cost_blocks":2}}"#,
    )
    .unwrap();
    assert_eq!(s.policy, PolicyMode::Aibrix);
    assert_eq!(
        s.load_aware,
        LoadAwareConfig {
            slack_abs: 3,
            slack_rel: 1.0,
            queue_cost_blocks: 2,
        }
    );
}

#[test]
fn signals_are_off_by_default_and_need_a_cluster_for_static_pools() {
    let s = parse(r#"{"endpoints":["a:1"]}"#).unwrap();
    assert!(!s.signals.enabled);
    let s = parse(r#"{"cluster":"pods","signals":{"enabled":true}}"#).unwrap();
    assert!(s.signals.enabled && s.signals.cluster.is_empty());
    assert_eq!(s.signals.stale_ms(), 3 * 250 + 1000);
    let s = parse(r#"{"endpoints":["a:1"],"signals":{"enabled":true,"cluster":"pods"}}"#).unwrap();
    assert_eq!(s.signals.cluster, "pods");
}

#[test]
fn bad_policy_and_signal_settings_are_refused_by_field() {
    for (json, field) in [
        (
            r#"{"endpoints":["a:1"],"policy":{"mode":"fastest"}}"#,
            "policy",
        ),
        (
            r#"{"endpoints":["a:1"],"policy":{"slack_rel":-1}}"#,
            "policy.slack_rel",
        ),
        (
            r#"{"endpoints":["a:1"],"policy":{"kv_high":0.9}}"#,
            "policy",
        ),
        (
            r#"{"endpoints":["a:1"],"policy":{"match_trust_secs":30}}"#,
            "policy",
        ),
        (
            r#"{"endpoints":["a:1"],"signals":{"enabled":true}}"#,
            "signals.cluster",
        ),
        (
            r#"{"cluster":"p","signals":{"enabled":true,"interval_ms":10}}"#,
            "signals.interval_ms",
        ),
        (
            r#"{"cluster":"p","signals":{"enabled":true,"timeout_ms":0}}"#,
            "signals.timeout_ms",
        ),
        (
            r#"{"cluster":"p","signals":{"enabled":true,"max_body_bytes":10}}"#,
            "signals.max_body_bytes",
        ),
        (
            r#"{"cluster":"p","signals":{"enabled":true,"path":"metrics"}}"#,
            "signals.path",
        ),
        (
            r#"{"cluster":"p","signals":{"enabled":true,"share":true}}"#,
            "signals.share",
        ),
        (
            r#"{"cluster":"p","signals":{"enabled":true,"share":true},"sync":{"enabled":true,"cluster":true}}"#,
            "signals.share",
        ),
        (
            r#"{"cluster":"p","signals":{"enabled":true,"host_header":"X Bad"}}"#,
            "signals.host_header",
        ),
        (
            r#"{"cluster":"p","signals":{"enabled":true,"names":{"waiting":[]}}}"#,
            "signals.names",
        ),
        (
            r#"{"cluster":"p","signals":{"enabled":true,"names":{"token_latency":["a","b","c","d","e","f","g","h","i"]}}}"#,
            "signals.names.token_latency",
        ),
        (r#"{"cluster":"p","signals":{"every":1}}"#, "signals"),
        (
            r#"{"endpoints":["a:1"],"sync":{"place_new":true}}"#,
            "sync.place_new",
        ),
        (
            r#"{"endpoints":["a:1"],"policy":{"mode":"aibrix"},"sync":{"enabled":true,"place_new":true}}"#,
            "sync.place_new",
        ),
        (
            r#"{"endpoints":["a:1"],"sync":{"enabled":true,"place_new":true,"place_timeout_ms":0}}"#,
            "sync.place_timeout_ms",
        ),
    ] {
        let e = parse(json).unwrap_err();
        assert_eq!(e.field, field, "{json}: {e}");
    }
}

#[test]
fn place_new_unset_is_on_where_it_applies_and_off_elsewhere() {
    let places = |sync: &str, policy: &str| {
        parse(&format!(
            r#"{{"endpoints":["a:1"],"sync":{{{sync}}}{policy}}}"#
        ))
        .unwrap()
        .sync
        .places_new()
    };
    let aibrix = r#","policy":{"mode":"aibrix"}"#;
    // Unset: on for a synced load-aware fleet (the default policy), on one
    // Redis or a Redis Cluster; off without sync or with AIBrix's rules.
    assert!(places(r#""enabled":true"#, ""));
    assert!(places(r#""enabled":true,"cluster":true"#, ""));
    assert!(!places("", ""));
    assert!(!places(r#""enabled":true"#, aibrix));
    // Set: followed where it applies.
    assert!(!places(r#""enabled":true,"place_new":false"#, ""));
    assert!(places(r#""enabled":true,"place_new":true"#, ""));
    assert!(!places(r#""place_new":false"#, aibrix));
}

#[test]
fn the_removed_feedback_section_is_refused_by_field() {
    // `feedback.cached_tokens` was removed in 0.2 (decision 054): a config
    // that still sets it is refused, naming the field, not silently ignored.
    let e = parse(r#"{"endpoints":["a:1"],"feedback":{"cached_tokens":true}}"#).unwrap_err();
    assert_eq!(e.field, "feedback", "{e}");
}

#[test]
fn the_removed_kv_usage_names_are_refused_by_field() {
    // `signals.names.kv_usage` was removed in 0.2 (no rule read it since
    // `policy.kv_high` went, decision 050): a config that still sets it is
    // refused: the error names the section and the unknown field.
    let e = parse(
        r#"{"cluster":"p","signals":{"enabled":true,"names":{"kv_usage":["sglang:token_usage"]}}}"#,
    )
    .unwrap_err();
    assert_eq!(e.field, "signals", "{e}");
    assert!(e.to_string().contains("unknown field `kv_usage`"), "{e}");
}

#[test]
fn hold_is_on_by_default_and_its_bounds_are_refused_by_field() {
    let base = r#""endpoints":["a:1"]"#;
    let d = parse(&format!("{{{base}}}")).unwrap().hold;
    assert!(d.enabled);
    assert_eq!((d.max_ms, d.max_waiting), (1_000, 256));
    let off = parse(&format!(
        r#"{{{base},"hold":{{"enabled":false,"max_ms":300}}}}"#
    ))
    .unwrap()
    .hold;
    assert!(!off.enabled);
    assert_eq!(off.max_ms, 300);
    for (bad, field) in [
        (r#""hold":{"max_ms":0}"#, "hold.max_ms"),
        (r#""hold":{"max_ms":60001}"#, "hold.max_ms"),
        (r#""hold":{"max_waiting":0}"#, "hold.max_waiting"),
        (r#""hold":{"max_waiting":5000}"#, "hold.max_waiting"),
        (r#""hold":{"enabled":"yes"}"#, "hold"),
        (r#""hold":{"wait":1}"#, "hold"),
    ] {
        let e = parse(&format!("{{{base},{bad}}}")).unwrap_err();
        assert_eq!(e.field, field, "{bad}: {e}");
    }
}

#[test]
fn inspect_is_off_by_default_and_its_fields_are_refused_by_name() {
    let base = r#""endpoints":["a:1"]"#;
    let d = parse(&format!("{{{base}}}")).unwrap().inspect;
    assert!(d.path.is_empty() && d.filter_chain.is_empty());
    assert_eq!(d.max_buckets, 1024);
    let on = parse(&format!(
        r#"{{{base},"inspect":{{"path":"/debug/t","filter_chain":"admin_debug","max_buckets":8}}}}"#
    ))
    .unwrap()
    .inspect;
    assert_eq!(
        (on.path.as_str(), on.filter_chain.as_str(), on.max_buckets),
        ("/debug/t", "admin_debug", 8)
    );
    let long = "x".repeat(257);
    for (bad, field) in [
        (
            r#""inspect":{"filter_chain":"l"}"#.to_string(),
            "inspect.path",
        ),
        (
            r#""inspect":{"path":"debug","filter_chain":"l"}"#.into(),
            "inspect.path",
        ),
        (
            r#""inspect":{"path":"/d?x=1","filter_chain":"l"}"#.into(),
            "inspect.path",
        ),
        (
            r#""inspect":{"path":"/d e","filter_chain":"l"}"#.into(),
            "inspect.path",
        ),
        (r#""inspect":{"path":"/d"}"#.into(), "inspect.filter_chain"),
        (
            format!(r#""inspect":{{"path":"/d","filter_chain":"{long}"}}"#),
            "inspect.filter_chain",
        ),
        (
            r#""inspect":{"max_buckets":0}"#.into(),
            "inspect.max_buckets",
        ),
        (
            r#""inspect":{"max_buckets":16385}"#.into(),
            "inspect.max_buckets",
        ),
        (r#""inspect":{"port":1}"#.into(), "inspect"),
    ] {
        let e = parse(&format!("{{{base},{bad}}}")).unwrap_err();
        assert_eq!(e.field, field, "{bad}: {e}");
    }
}
