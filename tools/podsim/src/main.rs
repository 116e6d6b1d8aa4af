//! podsim: a simulated vLLM-like inference pod.
//!
//! It serves the OpenAI-compatible completions and chat endpoints with
//! made-up text, but models what a prefix-aware router cares about: a prefix
//! KV cache (vLLM automatic prefix caching), a slot-limited FIFO scheduler,
//! prefill/decode latency, and vLLM-named Prometheus metrics. Every reply
//! names the pod (`x-served-by` header, `served_by` JSON field). See README.md.

mod kvcache;
mod metrics;
mod openai;
mod scheduler;
mod server;
mod tokenize;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::scheduler::{Engine, LatencyModel};
use crate::server::AppState;

/// Simulated LLM inference pod (OpenAI-compatible API, prefix KV-cache and latency model).
#[derive(Parser, Debug, Clone)]
#[command(name = "podsim", version, about, long_about = None)]
struct Args {
    /// TCP port to listen on; 0 picks a free port (see --ready-file).
    #[arg(long)]
    port: u16,

    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,

    /// Pod name put in `x-served-by` and `served_by` [default: HOST:PORT, with the bound port].
    #[arg(long)]
    name: Option<String>,

    /// Model name listed by /v1/models (repeat or comma-separate for several; requests may name any model).
    #[arg(long = "model", value_delimiter = ',', default_value = "sim-model")]
    models: Vec<String>,

    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    kv_block_tokens: usize,

    /// KV-cache capacity in blocks (LRU eviction beyond it; 0 disables caching).
    #[arg(long, default_value_t = 4096)]
    kv_capacity_blocks: usize,

    /// Requests served concurrently; the others wait in a FIFO queue.
    #[arg(long, default_value_t = 4)]
    slots: usize,

    /// Prefill time per uncached prompt token, in microseconds.
    #[arg(long, default_value_t = 50.0)]
    prefill_us_per_token: f64,

    /// Decode time per output token after the first, in microseconds.
    #[arg(long, default_value_t = 1000.0)]
    decode_us_per_token: f64,

    /// Multiplier of every model delay (0 = answer without model delay).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,

    /// A prefill also delays the tokens of the requests already decoding by
    /// its own duration (as a vLLM step carrying a prefill chunk does).
    #[arg(long)]
    prefill_stalls_decode: bool,

    /// Output tokens of a request that sets no `max_tokens`.
    #[arg(long, default_value_t = 16)]
    default_max_tokens: u64,

    /// Context length reported by /tokenize and /v1/models (not enforced).
    #[arg(long, default_value_t = 32768)]
    max_model_len: u64,

    /// Write the bound port (decimal, no newline) to this file once listening.
    #[arg(long)]
    ready_file: Option<PathBuf>,

    /// Exit by itself after this many seconds (0 = never).
    #[arg(long, default_value_t = 0)]
    exit_after_secs: u64,
}

impl Args {
    fn validate(&self) -> Result<(), String> {
        if self.slots == 0 {
            return Err("--slots must be at least 1".into());
        }
        if self.kv_block_tokens == 0 {
            return Err("--kv-block-tokens must be at least 1".into());
        }
        for (flag, v) in [
            ("--prefill-us-per-token", self.prefill_us_per_token),
            ("--decode-us-per-token", self.decode_us_per_token),
            ("--time-scale", self.time_scale),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("{flag} must be a finite number >= 0, got {v}"));
            }
        }
        if self.models.is_empty() || self.models.iter().any(|m| m.trim().is_empty()) {
            return Err("--model names must not be empty".into());
        }
        if let Some(name) = &self.name {
            if hyper::header::HeaderValue::from_str(name).is_err() {
                return Err("--name must be usable as an HTTP header value".into());
            }
        }
        Ok(())
    }
}

/// Write `port` to `path` atomically (temp file + rename), so that a reader
/// polling for the file never sees it half written.
fn write_ready_file(path: &Path, port: u16) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, port.to_string())?;
    std::fs::rename(&tmp, path)
}

async fn shutdown_signal(exit_after_secs: u64) {
    let timer = async {
        if exit_after_secs == 0 {
            std::future::pending::<()>().await;
        } else {
            tokio::time::sleep(Duration::from_secs(exit_after_secs)).await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = timer => {}
        () = term => {}
        r = tokio::signal::ctrl_c() => { if r.is_err() { std::future::pending::<()>().await } }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", args.host, args.port))?;
    let local: SocketAddr = listener
        .local_addr()
        .map_err(|e| format!("local address: {e}"))?;
    let port = local.port();
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("{}:{port}", args.host));

    let metrics = Arc::new(Metrics::default());
    let latency = LatencyModel {
        prefill_us_per_token: args.prefill_us_per_token,
        decode_us_per_token: args.decode_us_per_token,
        time_scale: args.time_scale,
    };
    let engine = Engine::new(
        latency,
        args.slots,
        args.kv_block_tokens,
        args.kv_capacity_blocks,
        Arc::clone(&metrics),
    )
    .with_prefill_stalls(args.prefill_stalls_decode);
    let state = Arc::new(AppState::new(
        name,
        args.models.clone(),
        args.default_max_tokens,
        args.max_model_len,
        engine,
        metrics,
    ));

    if let Some(path) = &args.ready_file {
        write_ready_file(path, port)
            .map_err(|e| format!("cannot write ready file {}: {e}", path.display()))?;
    }
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "listening on {}:{port}", args.host);
    let _ = stdout.flush();

    let shutdown = shutdown_signal(args.exit_after_secs);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => return Ok(()),
        };
        let (stream, _) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // e.g. out of file descriptors: back off and keep serving.
                eprintln!("podsim: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let st = Arc::clone(&state);
        tokio::spawn(async move {
            let service = service_fn(move |req| server::handle(Arc::clone(&st), req));
            // Connection errors (client resets) are the client's business.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(msg) = args.validate() {
        eprintln!("podsim: {msg}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("podsim: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(args));
    // Do not wait for connections still open (e.g. keep-alive from a proxy).
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("podsim: {msg}");
            ExitCode::FAILURE
        }
    }
}
