//! Request parsing, native and AIBrix layouts.

use super::aibrix::go_string;
use super::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn completions(body: &str) -> Result<PromptRequest, PassReason> {
    parse_body(ApiKind::Completions, body.as_bytes())
}
fn chat(body: &str) -> Result<PromptRequest, PassReason> {
    parse_body(ApiKind::ChatCompletions, body.as_bytes())
}

fn aibrix(kind: ApiKind, body: &str) -> Result<String, PassReason> {
    parse_body_as(kind, body.as_bytes(), Render::Aibrix)
        .map(|r| String::from_utf8(r.prompt).unwrap())
}

#[test]
fn aibrix_chat_joins_contents_with_one_space_and_no_roles() {
    let body = r#"{"model":"m","messages":[
        {"role":"system","content":"You are \"kind\"."},
        {"role":"user","content":[ {"type":"text", "text":"hi"} ]},
        {"role":"assistant","content":null},
        {"role":"tool"},
        {"role":"user","content":"bye"}]}"#;
    assert_eq!(
        aibrix(ApiKind::ChatCompletions, body).unwrap(),
        // Array content is its raw JSON text as sent, null is `null`,
        // an absent content is empty but keeps its separator.
        r#"You are "kind". [ {"type":"text", "text":"hi"} ] null  bye"#
    );
}

#[test]
fn aibrix_chat_puts_canonical_tools_first() {
    let body = r#"{"messages":[{"role":"user","content":"q"}],
        "tools":[{"type":"function","function":{"parameters":{"b":1.50,"a":1e2},"name":"f<x>"}}]}"#;
    assert_eq!(
        aibrix(ApiKind::ChatCompletions, body).unwrap(),
        r#"[{"function":{"name":"f<x>","parameters":{"a":1e2,"b":1.50}},"type":"function"}] q"#
    );
    // Empty, null or non-array tools contribute nothing.
    for tools in ["[]", "null", r#"{"a":1}"#, r#""x""#] {
        let body = format!(r#"{{"messages":[{{"content":"q"}}],"tools":{tools}}}"#);
        assert_eq!(
            aibrix(ApiKind::ChatCompletions, &body).unwrap(),
            "q",
            "{tools}"
        );
    }
}

#[test]
fn aibrix_completions_take_only_a_string_prompt() {
    assert_eq!(
        aibrix(ApiKind::Completions, r#"{"model":"m","prompt":"héllo"}"#).unwrap(),
        "héllo"
    );
    for body in [
        r#"{"prompt":["a","b"]}"#,
        r#"{"prompt":[1,2,3]}"#,
        r#"{"prompt":null}"#,
        r#"{"model":"m"}"#,
    ] {
        assert_eq!(
            aibrix(ApiKind::Completions, body),
            Err(PassReason::NoPrompt),
            "{body}"
        );
    }
    assert_eq!(
        aibrix(ApiKind::ChatCompletions, r#"{"messages":["x"]}"#),
        Err(PassReason::NotJson)
    );
    assert_eq!(
        aibrix(ApiKind::ChatCompletions, r#"{"messages":[]}"#),
        Err(PassReason::NoPrompt)
    );
}

#[test]
fn go_strings_escape_like_encoding_json_without_html() {
    let mut out = Vec::new();
    go_string("a\"\\\n\u{1}<&>\u{2028}é", &mut out);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#""a\"\\\n\u0001<&>\u2028é""#
    );
}

#[test]
fn classify_paths_and_methods() {
    assert_eq!(
        classify("POST", "/v1/completions"),
        Ok(ApiKind::Completions)
    );
    assert_eq!(
        classify("post", "/v1/chat/completions?x=1"),
        Ok(ApiKind::ChatCompletions)
    );
    assert_eq!(
        classify("POST", "/v1/chat/completions/"),
        Ok(ApiKind::ChatCompletions)
    );
    assert_eq!(classify("GET", "/v1/completions"), Err(PassReason::Method));
    assert_eq!(classify("POST", "/v1/embeddings"), Err(PassReason::Path));
    assert_eq!(classify("GET", "/health"), Err(PassReason::Path));
}

#[test]
fn completion_string_prompt_is_its_bytes() {
    let r = completions(r#"{"model":"m","prompt":"héllo"}"#).unwrap();
    assert_eq!(r.model, "m");
    assert_eq!(r.prompt, "héllo".as_bytes());
}

#[test]
fn completion_string_list_joins_with_newline() {
    let r = completions(r#"{"prompt":["a","b"]}"#).unwrap();
    assert_eq!(r.prompt, b"a\nb\n");
    assert_eq!(r.model, "");
}

#[test]
fn completion_token_ids_are_le_u32() {
    let r = completions(r#"{"model":"m","prompt":[1,258]}"#).unwrap();
    assert_eq!(r.prompt, vec![1, 0, 0, 0, 2, 1, 0, 0]);
}

#[test]
fn completion_token_id_lists_are_separated() {
    let r = completions(r#"{"prompt":[[1],[2]]}"#).unwrap();
    assert_eq!(
        r.prompt,
        vec![1, 0, 0, 0, 255, 255, 255, 255, 2, 0, 0, 0, 255, 255, 255, 255]
    );
}

#[test]
fn completion_bad_prompts_pass_through() {
    assert_eq!(completions(r#"{"model":"m"}"#), Err(PassReason::NoPrompt));
    assert_eq!(completions(r#"{"prompt":[]}"#), Err(PassReason::NoPrompt));
    assert_eq!(completions(r#"{"prompt":5}"#), Err(PassReason::NoPrompt));
    assert_eq!(completions(r#"{"prompt":[-1]}"#), Err(PassReason::NoPrompt));
    assert_eq!(
        completions(r#"{"prompt":[1,"a"]}"#),
        Err(PassReason::NoPrompt)
    );
    assert_eq!(
        completions(r#"{"prompt":[{"a":1}]}"#),
        Err(PassReason::NoPrompt)
    );
    assert_eq!(
        completions(r#"{"prompt":[5000000000]}"#),
        Err(PassReason::NoPrompt)
    );
}

#[test]
fn malformed_truncated_and_empty_bodies_are_not_json() {
    for body in [
        "",
        "not json",
        r#"{"prompt":"abc"#,
        r#"["prompt"]"#,
        "\u{0}\u{1}",
        "{\"prompt\":\"\\ud800\"}",
    ] {
        assert_eq!(completions(body), Err(PassReason::NotJson), "{body:?}");
    }
    assert_eq!(
        chat(r#"{"messages":[{"role":"user","content":"x"}"#),
        Err(PassReason::NotJson)
    );
}

#[test]
fn chat_every_turn_and_role_shape_the_bytes() {
    let r = chat(
        r#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"U"},{"role":"assistant","content":null},{"role":"user","content":[{"type":"text","text":"A"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"B"}]}]}"#,
    )
    .unwrap();
    assert_eq!(
        r.prompt,
        b"<|system|>S\n<|user|>U\n<|assistant|>\n<|user|>AB\n"
    );
    let as_user = chat(r#"{"messages":[{"role":"user","content":"S"}]}"#).unwrap();
    let as_system = chat(r#"{"messages":[{"role":"system","content":"S"}]}"#).unwrap();
    assert_ne!(as_user.prompt, as_system.prompt);
}

#[test]
fn chat_later_turns_extend_earlier_prefix() {
    let one =
        chat(r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"}]}"#)
            .unwrap();
    let two = chat(
        r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"},{"role":"assistant","content":"A1"},{"role":"user","content":"Q2"}]}"#,
    )
    .unwrap();
    assert!(two.prompt.starts_with(&one.prompt));
}

#[test]
fn chat_bad_shapes_pass_through() {
    assert_eq!(chat(r#"{"model":"m"}"#), Err(PassReason::NoPrompt));
    assert_eq!(chat(r#"{"messages":[]}"#), Err(PassReason::NoPrompt));
    assert_eq!(
        chat(r#"{"messages":[{"content":"x"}]}"#),
        Err(PassReason::NoPrompt)
    );
    assert_eq!(
        chat(r#"{"messages":[{"role":"user","content":5}]}"#),
        Err(PassReason::NoPrompt)
    );
    assert_eq!(chat(r#"{"messages":"hi"}"#), Err(PassReason::NotJson));
}

#[test]
fn non_string_model_is_ignored() {
    assert_eq!(
        completions(r#"{"model":7,"prompt":"x"}"#).unwrap().model,
        ""
    );
}

#[test]
fn huge_prompt_parses() {
    let big = "x".repeat(400 * 1024);
    let body = format!(r#"{{"model":"m","prompt":"{big}"}}"#);
    assert_eq!(completions(&body).unwrap().prompt.len(), 400 * 1024);
}

#[test]
fn deeply_nested_json_is_refused_not_overflowed() {
    let body = format!(
        r#"{{"prompt":{}1{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert!(completions(&body).is_err());
}

/// The fast path decides only what the `Value` path decides the same
/// way: on every body here, from the generator and the fuzz corpus,
/// when it answers it equals the `Value` path's answer (it declines what
/// nests past 128 levels, where the `Value` tree stops).
#[test]
fn fast_path_agrees_with_the_value_path() {
    let pieces: &[&str] = &[
        r#""hello""#,
        r#""a\"b\\c\n""#,
        r#""\u00e9t\u00e9 \ud83d\ude00""#,
        "null",
        "1",
        "[]",
        r#"[1,2]"#,
        r#"["a","b"]"#,
        r#"[[1],[2]]"#,
        "{}",
        "true",
        r#"[{"type":"text","text":"x"}]"#,
        r#""""#,
        r#""\/""#,
        r#""\b\f\r\t \u0000""#,
        r#""lone \ud83d""#,
        r#""bad \x""#,
        "\"tab\tinside\"",
        r#""\ude00 low""#,
        "-0.5e+3",
        "01",
        "1.",
        r#"{"a":[1,{"b":null}],"c":"\u0041"}"#,
        "[1,]",
        "tru",
        r#""long ----------------------------------------------- text \" with quote""#,
    ];
    let keys: &[&str] = &[
        "role",
        "content",
        "name",
        "role",
        "tool_calls",
        r"\u0072ole",
        r"cont\u0065nt",
    ];
    let mut rng = crate::rng::SplitMix64::new(11);
    let mut bodies: Vec<(ApiKind, String)> = Vec::new();
    for _ in 0..3000 {
        let mut pick = |xs: &[&str]| xs[rng.below(xs.len())].to_string();
        let n = 1 + (pick(&["0", "1", "2"]).parse::<usize>().unwrap());
        let mut msgs = Vec::new();
        for _ in 0..n {
            let fields: Vec<String> = (0..3)
                .map(|_| format!(r#""{}":{}"#, pick(keys), pick(pieces)))
                .collect();
            msgs.push(if pick(&["o", "o", "o", "x"]) == "o" {
                format!("{{{}}}", fields.join(","))
            } else {
                pick(pieces)
            });
        }
        let model = pick(&[r#""m""#, "1", "null", r#""\u006d""#]);
        // No member, or `stream` with a piece (true, "true", null, ...),
        // before or after the prompt.
        let stream = pick(&["", "", "true", "false", "tru", r#""true""#, "null", "1"]);
        let stream = if stream.is_empty() {
            stream
        } else {
            format!(r#""stream":{stream},"#)
        };
        bodies.push((
            ApiKind::ChatCompletions,
            format!(
                r#"{{{stream}"model":{model},"messages":[{}]}}"#,
                msgs.join(" , ")
            ),
        ));
        bodies.push((
            ApiKind::Completions,
            format!(
                r#"{{ "model":{model}, "prompt":{} , {stream} "max_tokens":{} }}"#,
                pick(pieces),
                pick(pieces)
            ),
        ));
    }
    // Deep nesting beside a fast-path shape.
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    bodies.push((
        ApiKind::ChatCompletions,
        format!(r#"{{"messages":[{{"role":"user","content":"x","extra":{deep}}}]}}"#),
    ));
    bodies.push((
        ApiKind::Completions,
        format!(r#"{{"prompt":"x","extra":{deep}}}"#),
    ));
    #[cfg(not(target_arch = "wasm32"))]
    for (dir, kind) in [
        ("parse_body_chat", ApiKind::ChatCompletions),
        ("parse_body_completions", ApiKind::Completions),
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fuzz/corpus")
            .join(dir);
        for e in std::fs::read_dir(path).unwrap() {
            let text =
                String::from_utf8_lossy(&std::fs::read(e.unwrap().path()).unwrap()).into_owned();
            bodies.push((kind, text));
        }
    }
    // Bytes that are not UTF-8, in a prompt and in a skipped field.
    let mut raw: Vec<(ApiKind, Vec<u8>)> = bodies
        .iter()
        .map(|(k, b)| (*k, b.as_bytes().to_vec()))
        .collect();
    raw.push((ApiKind::Completions, b"{\"prompt\":\"a\xff\"}".to_vec()));
    raw.push((
        ApiKind::Completions,
        b"{\"prompt\":\"a\",\"x\":\"\xc3\"}".to_vec(),
    ));
    raw.push((
        ApiKind::ChatCompletions,
        b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\xa9\"}]} \n".to_vec(),
    ));
    raw.push((
        ApiKind::ChatCompletions,
        br#"{"messages":[{"role":"user","content":"x"}]} x"#.to_vec(),
    ));
    let mut fast = 0;
    for (kind, body) in &raw {
        let shown = String::from_utf8_lossy(body);
        if let Some(req) = fast_native(*kind, body) {
            fast += 1;
            match parse_native_value(*kind, body) {
                Ok(want) => assert_eq!(req, want, "{kind:?} {shown}"),
                Err(e) => panic!("{kind:?} {shown}: fast path routed, Value path {e:?}"),
            }
        }
    }
    // Most generated bodies hold a piece the fast path declines (numbers,
    // arrays, bad escapes); enough must remain for the comparison to mean
    // something (`common_shapes_take_the_fast_path` pins the usual shapes).
    assert!(
        fast > raw.len() / 20,
        "the fast path took {fast} of {}",
        raw.len()
    );
}

/// The shapes of nearly every request take the fast path, whatever the
/// member order, escapes or whitespace.
#[test]
fn common_shapes_take_the_fast_path() {
    let chat = [
        r#"{"model":"m","messages":[{"role":"system","content":"be brief\n"},{"role":"user","content":"hi \"there\" \u00e9"}],"max_tokens":8}"#,
        r#"{ "messages" : [ { "content" : "x" , "role" : "user" , "name" : "a" } ] , "model" : "m" }"#,
        r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"}}]}],"stream":true}"#,
    ];
    for body in chat {
        let fast = fast_native(ApiKind::ChatCompletions, body.as_bytes());
        assert!(fast.is_some(), "{body}");
        assert_eq!(fast.ok_or(()), chat_value(body).map_err(|_| ()), "{body}");
    }
    let completion =
        r#"{"model":"m","prompt":"line\none\ttab","temperature":0.5e-1,"stop":["\n"]}"#;
    let fast = fast_native(ApiKind::Completions, completion.as_bytes());
    assert_eq!(
        fast.map(|r| r.prompt),
        Some(b"line\none\ttab".to_vec()),
        "{completion}"
    );
}

fn chat_value(body: &str) -> Result<PromptRequest, PassReason> {
    parse_native_value(ApiKind::ChatCompletions, body.as_bytes())
}

#[test]
fn stream_true_is_read_by_every_parser() {
    let cases = [
        (r#","stream":true"#, true),
        (r#","stream" : true "#, true),
        (r#","stream":false"#, false),
        (r#","stream":"true""#, false),
        (r#","stream":null"#, false),
        ("", false),
    ];
    for (member, want) in cases {
        let completion = format!(r#"{{"model":"m","prompt":"p"{member}}}"#);
        let chat_body = format!(r#"{{"messages":[{{"role":"user","content":"c"}}]{member}}}"#);
        for (kind, body) in [
            (ApiKind::Completions, &completion),
            (ApiKind::ChatCompletions, &chat_body),
        ] {
            let fast = fast_native(kind, body.as_bytes()).expect(body);
            assert_eq!(fast.stream, want, "fast {body}");
            let value = parse_native_value(kind, body.as_bytes()).unwrap();
            assert_eq!(value.stream, want, "value {body}");
            let aibrix = parse_body_as(kind, body.as_bytes(), Render::Aibrix).unwrap();
            assert_eq!(aibrix.stream, want, "aibrix {body}");
        }
    }
    // A repeated member is serde's error: the request passes through.
    let twice = r#"{"prompt":"p","stream":true,"stream":true}"#;
    assert!(fast_native(ApiKind::Completions, twice.as_bytes()).is_none());
    assert_eq!(completions(twice), Err(PassReason::NotJson));
}
