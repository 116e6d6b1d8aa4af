//! HTTP routing and request handling.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::openai::{self, InferenceRequest, Kind, ReplyMeta, Usage, FINISH_REASON, SSE_DONE};
use crate::scheduler::{sleep, Engine};
use crate::tokenize::{output_text, output_token_text};

/// Largest request body read; larger ones get 413.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Response header naming the pod.
pub const SERVED_BY: &str = "x-served-by";
/// Request header asking for an extra hold, in milliseconds.
pub const SIM_DELAY: &str = "x-sim-delay-ms";

/// Everything a request handler needs.
#[derive(Debug)]
pub struct AppState {
    pub name: String,
    pub models: Vec<String>,
    pub default_max_tokens: u64,
    pub max_model_len: u64,
    pub engine: Engine,
    pub metrics: Arc<Metrics>,
    next_id: AtomicU64,
    id_prefix: String,
}

impl AppState {
    pub fn new(
        name: String,
        models: Vec<String>,
        default_max_tokens: u64,
        max_model_len: u64,
        engine: Engine,
        metrics: Arc<Metrics>,
    ) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        AppState {
            name,
            models,
            default_max_tokens,
            max_model_len,
            engine,
            metrics,
            next_id: AtomicU64::new(1),
            id_prefix: format!("{:x}", nanos & 0xffff_ffff_ffff),
        }
    }

    fn default_model(&self) -> &str {
        self.models
            .first()
            .map(String::as_str)
            .unwrap_or("sim-model")
    }

    fn reply_meta(&self, kind: Kind, model: &str) -> ReplyMeta {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let prefix = match kind {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        };
        ReplyMeta {
            id: format!("{prefix}-{}{n:08x}", self.id_prefix),
            created: unix_now(),
            model: model.to_owned(),
            served_by: self.name.clone(),
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Response body: a complete buffer, or a stream of server-sent events.
#[derive(Debug)]
pub enum ReplyBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ReplyBody::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ReplyBody::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, ReplyBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReplyBody::Full(Some(d)) => SizeHint::with_exact(d.len() as u64),
            ReplyBody::Full(None) => SizeHint::with_exact(0),
            ReplyBody::Stream(_) => SizeHint::default(),
        }
    }
}

fn reply(
    state: &AppState,
    status: StatusCode,
    content_type: &'static str,
    body: ReplyBody,
) -> Response<ReplyBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(&state.name) {
        headers.insert(SERVED_BY, v);
    }
    resp
}

fn json_reply(state: &AppState, status: StatusCode, value: &Value) -> Response<ReplyBody> {
    reply(
        state,
        status,
        "application/json",
        ReplyBody::Full(Some(Bytes::from(value.to_string()))),
    )
}

fn error_reply(state: &AppState, status: StatusCode, message: &str) -> Response<ReplyBody> {
    json_reply(
        state,
        status,
        &openai::error_body(status.as_u16(), message, &state.name),
    )
}

/// Add `served_by` to a JSON object (other values are returned unchanged).
fn with_served_by(state: &AppState, mut value: Value) -> Value {
    if let Value::Object(m) = &mut value {
        m.insert("served_by".into(), json!(state.name));
    }
    value
}

/// Handle one HTTP request. Never fails: every problem is an HTTP error reply.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<ReplyBody>, Infallible> {
    let delay = match req.headers().get(SIM_DELAY) {
        None => 0,
        Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(ms) => ms,
            None => {
                return Ok(error_reply(
                    &state,
                    StatusCode::BAD_REQUEST,
                    "x-sim-delay-ms must be a non-negative integer",
                ))
            }
        },
    };
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let body = match method {
        Method::POST => match Limited::new(req.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                let too_large = e
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some();
                return Ok(if too_large {
                    error_reply(
                        &state,
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "request body too large",
                    )
                } else {
                    error_reply(
                        &state,
                        StatusCode::BAD_REQUEST,
                        "could not read the request body",
                    )
                });
            }
        },
        _ => Bytes::new(),
    };
    sleep(Duration::from_millis(delay)).await;
    Ok(route(state, &method, &path, &body).await)
}

async fn route(
    state: Arc<AppState>,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Response<ReplyBody> {
    let known = [
        "/health",
        "/v1/models",
        "/metrics",
        "/v1/completions",
        "/v1/chat/completions",
        "/tokenize",
    ];
    match (method, path) {
        (&Method::GET, "/health") => {
            reply(&state, StatusCode::OK, "text/plain", ReplyBody::Full(None))
        }
        (&Method::GET, "/v1/models") => models(&state),
        (&Method::GET, "/metrics") => {
            let page = state
                .metrics
                .render(state.default_model(), state.engine.kv_snapshot());
            reply(
                &state,
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                ReplyBody::Full(Some(Bytes::from(page))),
            )
        }
        (&Method::POST, "/v1/completions") => inference(state, Kind::Completion, body).await,
        (&Method::POST, "/v1/chat/completions") => inference(state, Kind::Chat, body).await,
        (&Method::POST, "/tokenize") => tokenize(&state, body),
        (&Method::POST, "/v1/completions/render") => render(&state, Kind::Completion, body),
        (&Method::POST, "/v1/chat/completions/render") => render(&state, Kind::Chat, body),
        (_, p) if known.contains(&p) || (p.starts_with("/v1/") && p.ends_with("/render")) => {
            error_reply(
                &state,
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("method {method} not allowed on {p}"),
            )
        }
        (_, p) => error_reply(
            &state,
            StatusCode::NOT_FOUND,
            &format!("no route for {method} {p}"),
        ),
    }
}

fn models(state: &AppState) -> Response<ReplyBody> {
    let created = unix_now();
    let data: Vec<Value> = state
        .models
        .iter()
        .map(|m| json!({"id": m, "object": "model", "created": created, "owned_by": "podsim", "root": m, "parent": null, "max_model_len": state.max_model_len}))
        .collect();
    json_reply(
        state,
        StatusCode::OK,
        &json!({"object": "list", "data": data, "served_by": state.name}),
    )
}

fn parse_json(body: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(body).map_err(|e| format!("malformed JSON body: {e}"))
}

/// Token ids of a `/tokenize` or render body: `prompt` (completion shapes,
/// one list per prompt) or `messages` (chat).
fn prompt_token_lists(body: &Value, kind: Kind) -> Result<Vec<Vec<u32>>, String> {
    if !body.is_object() {
        return Err("the request body must be a JSON object".into());
    }
    match kind {
        Kind::Completion => Ok(openai::completion_prompts(body)?
            .iter()
            .map(openai::Prompt::token_ids)
            .collect()),
        Kind::Chat => Ok(vec![crate::tokenize::tokenize(&openai::chat_prompt(body)?)]),
    }
}

/// vLLM's `/tokenize`: `{"prompt": ...}` or `{"messages": [...]}`.
fn tokenize(state: &AppState, body: &[u8]) -> Response<ReplyBody> {
    let value = match parse_json(body) {
        Ok(v) => v,
        Err(msg) => return error_reply(state, StatusCode::BAD_REQUEST, &msg),
    };
    let kind = if value.get("messages").is_some() {
        Kind::Chat
    } else {
        Kind::Completion
    };
    match prompt_token_lists(&value, kind) {
        Ok(lists) => {
            let tokens: Vec<u32> = lists.into_iter().flatten().collect();
            json_reply(
                state,
                StatusCode::OK,
                &json!({"count": tokens.len(), "max_model_len": state.max_model_len, "tokens": tokens, "token_strs": null, "served_by": state.name}),
            )
        }
        Err(msg) => error_reply(state, StatusCode::BAD_REQUEST, &msg),
    }
}

/// vLLM's render endpoints: chat gives one object with `token_ids`,
/// completions a list of them, one per prompt.
fn render(state: &AppState, kind: Kind, body: &[u8]) -> Response<ReplyBody> {
    let value = match parse_json(body) {
        Ok(v) => v,
        Err(msg) => return error_reply(state, StatusCode::BAD_REQUEST, &msg),
    };
    let model = value
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(state.default_model())
        .to_owned();
    let lists = match prompt_token_lists(&value, kind) {
        Ok(l) => l,
        Err(msg) => return error_reply(state, StatusCode::BAD_REQUEST, &msg),
    };
    let mut objects: Vec<Value> = lists
        .into_iter()
        .map(|ids| {
            let meta = state.reply_meta(kind, &model);
            json!({"request_id": meta.id, "model": model, "token_ids": ids, "served_by": state.name})
        })
        .collect();
    let out = match kind {
        Kind::Chat => objects.pop().unwrap_or(Value::Null),
        Kind::Completion => Value::Array(objects),
    };
    json_reply(state, StatusCode::OK, &with_served_by(state, out))
}

async fn inference(state: Arc<AppState>, kind: Kind, body: &[u8]) -> Response<ReplyBody> {
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let value = match parse_json(body) {
        Ok(v) => v,
        Err(msg) => return error_reply(&state, StatusCode::BAD_REQUEST, &msg),
    };
    let req = match openai::parse_request(
        &value,
        kind,
        state.default_model(),
        state.default_max_tokens,
    ) {
        Ok(r) => r,
        Err(msg) => return error_reply(&state, StatusCode::BAD_REQUEST, &msg),
    };
    if req.params.stream {
        let (tx, rx) = mpsc::channel(64);
        let st = Arc::clone(&state);
        tokio::spawn(async move { stream(st, req, tx).await });
        let mut resp = reply(
            &state,
            StatusCode::OK,
            "text/event-stream; charset=utf-8",
            ReplyBody::Stream(rx),
        );
        resp.headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        resp
    } else {
        complete(&state, req).await
    }
}

fn reserve_tokens(req: &InferenceRequest) -> u64 {
    let prompt: u64 = req.prompts.iter().map(|p| p.len() as u64).sum();
    prompt + req.params.max_tokens * req.prompts.len() as u64
}

fn usage(req: &InferenceRequest, prompt_tokens: u64, cached_tokens: u64) -> Usage {
    Usage {
        prompt_tokens,
        completion_tokens: req.params.max_tokens * req.prompts.len() as u64,
        cached_tokens,
    }
}

async fn complete(state: &AppState, req: InferenceRequest) -> Response<ReplyBody> {
    let Some(running) = state.engine.admit(reserve_tokens(&req)).await else {
        return error_reply(state, StatusCode::SERVICE_UNAVAILABLE, "scheduler closed");
    };
    let lookup = state.engine.prefill(&req.prompts).await;
    let gaps = req.params.max_tokens.saturating_sub(1);
    let decode = state.engine.latency.token_offset(gaps);
    let (stall, stalls) = (state.engine.stalled(), state.engine.stall_count());
    state
        .engine
        .wait_decoded(tokio::time::Instant::now() + decode, stall)
        .await;
    drop(running);
    // The modelled gaps between its output tokens (nothing is streamed):
    // as vLLM counts them, each prefill meanwhile made one gap late by its
    // duration (here the late gaps share what the prefills held back).
    let held = state.engine.stalled().saturating_sub(stall);
    let late = state.engine.stall_count().saturating_sub(stalls).min(gaps);
    let per_gap = decode.as_secs_f64() / gaps.max(1) as f64;
    state.metrics.inter_token.observe(per_gap, gaps - late);
    if late > 0 {
        let extra = held.as_secs_f64() / late as f64;
        state.metrics.inter_token.observe(per_gap + extra, late);
    }
    let usage = usage(&req, lookup.prompt_tokens, lookup.cached_tokens);
    state
        .metrics
        .generation_tokens
        .fetch_add(usage.completion_tokens, Ordering::Relaxed);
    let meta = state.reply_meta(req.kind, &req.params.model);
    let text = output_text(req.params.max_tokens);
    let value = match req.kind {
        Kind::Completion => openai::completion_response(&meta, req.prompts.len(), &text, usage),
        Kind::Chat => openai::chat_response(&meta, &text, usage),
    };
    json_reply(state, StatusCode::OK, &value)
}

/// Produce a streamed reply into `tx`. Returns early (freeing the slot) when
/// the client goes away.
async fn stream(state: Arc<AppState>, req: InferenceRequest, tx: mpsc::Sender<Bytes>) {
    let send = |v: Value| {
        let tx = tx.clone();
        async move { tx.send(openai::sse_event(&v)).await.is_ok() }
    };
    let queued = state.engine.admit(reserve_tokens(&req));
    let running = tokio::select! {
        r = queued => r,
        () = tx.closed() => None,
    };
    let Some(running) = running else { return };
    let lookup = state.engine.prefill(&req.prompts).await;
    let meta = state.reply_meta(req.kind, &req.params.model);
    let n = req.params.max_tokens;
    let started = tokio::time::Instant::now();
    let stall = state.engine.stalled();
    if req.kind == Kind::Chat && !send(openai::chat_chunk(&meta, Some("assistant"), "", None)).await
    {
        return;
    }
    let mut last = started;
    for i in 0..n.max(1) {
        let offset = state.engine.latency.token_offset(i);
        state.engine.wait_decoded(started + offset, stall).await;
        if i > 0 {
            // As vLLM: the time since the previous token, once it is out.
            let now = tokio::time::Instant::now();
            let gap = now.saturating_duration_since(last).as_secs_f64();
            state.metrics.inter_token.observe(gap, 1);
            last = now;
        }
        let text = if n == 0 { "" } else { output_token_text(i) };
        let finish = (i + 1 >= n).then_some(FINISH_REASON);
        for index in 0..req.prompts.len() {
            let chunk = match req.kind {
                Kind::Completion => openai::completion_chunk(&meta, index, text, finish),
                Kind::Chat => openai::chat_chunk(&meta, None, text, finish),
            };
            if !send(chunk).await {
                return;
            }
        }
    }
    drop(running);
    let usage = usage(&req, lookup.prompt_tokens, lookup.cached_tokens);
    state
        .metrics
        .generation_tokens
        .fetch_add(usage.completion_tokens, Ordering::Relaxed);
    if req.params.include_usage && !send(openai::usage_chunk(&meta, req.kind, usage)).await {
        return;
    }
    let _ = tx.send(Bytes::from_static(SSE_DONE)).await;
}
