//! Seeded, structure-aware mutational fuzzing of every parser that reads
//! bytes the filter does not control: request bodies, Redis replies (the
//! placement script's with its claim record among them), sync payloads
//! from other writers, shared-data values, Envoy's admin replies, the pods'
//! metrics and answers, and the plugin configuration. No Envoy needed.
//!
//! Each test starts from its corpus (`tests/fuzz/corpus/<target>/`, small
//! valid inputs, run first and unmutated), then mutates: bit flips, byte
//! arithmetic, truncation, deletion, duplication, splicing with other
//! inputs, inserting the format's own tokens (JSON keys of the schema, RESP
//! headers), replacing numbers with huge or edge ones, deep nesting, invalid
//! UTF-8, and a grammar that writes fresh inputs of the right shape. JSON
//! inputs also get tree edits (a node replaced by an edge value, long lists,
//! wide maps, keys added or dropped), so many still parse and reach the
//! logic behind the parser. Inputs that show a behaviour not seen before
//! (an outcome signature: Ok shape or error kind) join the pool being
//! mutated, so later inputs start from them.
//!
//! Properties, for every input: no panic; allocation bounded (peak heap
//! bytes during the call, measured by a counting allocator, stay below a
//! linear bound in the input size, so no length prefix or count in the input
//! drives an allocation); outputs within their documented caps; and a
//! per-parser oracle (round trips, RESP's "incomplete vs protocol error",
//! config errors name a field, remote facts never name non-members or
//! future times).
//!
//! - `FUZZ_ITERS` inputs per target (default 10 000; `make fuzz` runs 10^6).
//! - `FUZZ_SEED` (decimal or 0x-hex) changes the inputs; each target mixes
//!   its name in. The seed is printed; a failure prints the seed, the input
//!   and where it was saved, and how to replay it.
//! - A failing input (saved as `.bin`) copied into the target's corpus
//!   directory becomes a regression input that runs first on every run.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use envoy_prefix_router::config::Settings;
use envoy_prefix_router::fleet::membership::{parse_clusters, PodNaming, MAX_HOSTS};
use envoy_prefix_router::fleet::{self, FleetView, Members, SharedView};
use envoy_prefix_router::rng::SplitMix64;
use envoy_prefix_router::route::load;
use envoy_prefix_router::route::request::{classify, parse_body, ApiKind, PassReason};
use envoy_prefix_router::route::router::{claim_record, shared_with_claim, FAMILY_BLOCKS};
use envoy_prefix_router::route::table::{PrefixTable, MAX_SLOTS_PER_BUCKET, RECORD_LEN};
use envoy_prefix_router::shared::registry::{NameRegistry, PodSlot, Registry, MAX_NAME, MAX_SLOTS};
use envoy_prefix_router::shared::store::{MemStore, SharedStore};
use envoy_prefix_router::signals::{self, MetricNames, SignalView};
use envoy_prefix_router::sync::handoff::{self, DirtySet};
use envoy_prefix_router::sync::liveness::Heartbeat;
use envoy_prefix_router::sync::place::{self, Candidate, PlaceError, MAX_RECORD_BYTES};
use envoy_prefix_router::sync::reply::{redirect, Redirect};
use envoy_prefix_router::sync::resp::{
    self, Frame, ParseError, ReplyError, MAX_ARRAY_LEN, MAX_BULK_LEN, MAX_DEPTH,
};
use envoy_prefix_router::sync::syncables::{
    BlockPayload, Clock, LoadReport, PodLoadSync, PrefixCacheSync,
};
use envoy_prefix_router::sync::topology::SlotMap;
use envoy_prefix_router::sync::Syncable;

// ---------------------------------------------------------------------------
// Allocation accounting: live heap bytes and their peak, per thread (the
// test harness runs targets on parallel threads).

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    // `try_with`: allocations during thread teardown are not counted.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        note(-(layout.size() as isize));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its result and the peak heap bytes it added (its
/// result included) on this thread.
fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    let peak = PEAK.with(Cell::get);
    (r, usize::try_from(peak - base).unwrap_or(0))
}

// ---------------------------------------------------------------------------
// Run settings.

const DEFAULT_ITERS: u64 = 10_000;
const DEFAULT_SEED: u64 = 0x5EED_F022;
/// Mutated inputs are cut to this size, except the rare deliberately huge
/// ones (long repeats, deep nesting) which go up to [`HUGE_LEN`].
const MAX_LEN: usize = 16 * 1024;
const HUGE_LEN: usize = 512 * 1024;
/// Inputs that show a new behaviour join the pool (at most this many, and
/// only small ones, so mutation stays fast).
const MAX_POOL: usize = 512;
const MAX_POOL_INPUT: usize = 8 * 1024;

fn env_u64(name: &str) -> Option<u64> {
    let raw = std::env::var(name).ok()?;
    let s = raw.trim().replace('_', "");
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={raw:?} is not a number")))
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// A behaviour signature: what came out (a label and the output's shape).
fn sig(label: &str, shape: &str) -> u64 {
    fnv(format!("{label}\0{shape}").as_bytes())
}

/// An error's signature: its first words without digits or quoted parts
/// (serde's messages name the position and the offending value, so
/// "column 17" and "column 18", or two unknown keys, are one behaviour).
fn err_sig(label: &str, msg: &str) -> u64 {
    let mut s = String::new();
    let mut quote = None;
    for c in msg.chars().take(120) {
        match (c, quote) {
            ('`' | '"', None) => quote = Some(c),
            (_, Some(q)) if c == q => quote = None,
            ('0'..='9', _) | (_, Some(_)) => {}
            _ => s.push(c),
        }
    }
    let words: Vec<&str> = s.split_whitespace().take(3).collect();
    sig(label, &words.join(" "))
}

/// The shape of a JSON document for behaviour signatures: types down to
/// `depth`, schema keys by name, other keys (models, pods) by count.
fn json_shape(v: &serde_json::Value, keys: &[&str], depth: usize, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Null => out.push('n'),
        Value::Bool(_) => out.push('b'),
        Value::Number(n) if n.is_u64() => out.push('u'),
        Value::Number(n) if n.is_i64() => out.push('i'),
        Value::Number(_) => out.push('f'),
        Value::String(s) => out.push(if s.is_empty() { 'e' } else { 's' }),
        Value::Array(items) => {
            out.push_str(&format!("[{}", log2_bucket(items.len())));
            if let (Some(first), true) = (items.first(), depth > 0) {
                json_shape(first, keys, depth - 1, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push_str(&format!("{{{}", log2_bucket(map.len())));
            if depth > 0 {
                let mut other = None;
                for (k, child) in map {
                    if keys.contains(&k.as_str()) {
                        out.push_str(k);
                        out.push(':');
                        json_shape(child, keys, depth - 1, out);
                    } else {
                        other = other.or(Some(child));
                    }
                }
                if let Some(child) = other {
                    out.push_str("*:");
                    json_shape(child, keys, depth - 1, out);
                }
            }
            out.push('}');
        }
    }
}

fn doc_shape(bytes: &[u8], keys: &[&str]) -> String {
    let mut out = String::new();
    if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(bytes) {
        json_shape(&doc, keys, 3, &mut out);
    }
    out
}

fn log2_bucket(n: usize) -> u64 {
    u64::from(usize::BITS - n.leading_zeros())
}

// ---------------------------------------------------------------------------
// Corpus and mutation.

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/corpus")
        .join(target)
}

fn load_corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| {
            let path = e.expect("corpus entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("read corpus file"))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    files
}

/// How one target's inputs are shaped.
struct Spec {
    target: &'static str,
    /// Tokens of the format, inserted whole.
    dict: Vec<&'static [u8]>,
    /// (open, close) pairs for deep nesting.
    nest: &'static [(&'static [u8], &'static [u8])],
    /// Writes a fresh input of the right shape.
    grammar: fn(&mut SplitMix64) -> Vec<u8>,
    /// JSON inputs: mutated as documents too, not only as bytes.
    json: Option<JsonShape>,
}

/// What a JSON target's documents are made of.
struct JsonShape {
    /// Object keys of the schema (and a few that are not).
    keys: &'static [&'static str],
    /// String values worth trying.
    strings: &'static [&'static str],
    /// Inputs are `id\npayload`: ids to try, the payload is the document.
    ids: Option<&'static [&'static str]>,
}

impl JsonShape {
    fn gen(&self) -> JsonGen<'static> {
        JsonGen {
            keys: self.keys,
            strings: self.strings,
        }
    }
}

const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "-2",
    "7",
    "255",
    "256",
    "65535",
    "65536",
    "1000000000",
    "1048576",
    "1048577",
    "16777216",
    "16777217",
    "2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999999999",
    "1e309",
    "-1e309",
    "1e-400",
    "1.5",
    "1e2",
    "0.0",
    "-0.0",
    "+1",
    "01",
    "NaN",
    "Infinity",
];

/// The [`NUMBERS`] that are valid JSON (generators write these; mutations
/// also insert the others).
fn json_number(r: &mut SplitMix64) -> &'static str {
    loop {
        let n = NUMBERS[r.below(NUMBERS.len())];
        if serde_json::from_str::<serde_json::Value>(n).is_ok() {
            return n;
        }
    }
}

const BAD_UTF8: &[&[u8]] = &[
    b"\xff",
    b"\x80",
    b"\xc0\x80",
    b"\xc3",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xfe\xff",
    b"\0",
    b"\\ud800",
    b"\\udfff",
    b"\\ud800\\u0041",
    b"\\u0000",
    b"\\uZZZZ",
    b"\\",
];

const INTERESTING_BYTES: &[u8] = &[
    0, 1, 0x7f, 0x80, 0xff, b'"', b'\\', b'\r', b'\n', b'{', b'}', b'[', b']', b':', b',', b'$',
    b'*', b'-', b'+', b' ', b'0', b'9',
];

const INTERESTING_INTS: &[u64] = &[
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x3ff,
    0x400,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    1_700_000_000,
    1_700_000_000_000,
    i64::MAX as u64,
    u64::MAX,
];

struct Mutator {
    rng: SplitMix64,
    spec: Spec,
    /// The pool starts with the corpus (valid inputs): a quarter of the
    /// picks come from there, so the kept behaviours (mostly refusals) do
    /// not crowd out what parses.
    corpus_len: usize,
}

impl Mutator {
    fn below(&mut self, n: usize) -> usize {
        self.rng.below(n)
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.rng.below(one_in) == 0
    }

    /// A length, mostly small, sometimes up to `max`.
    fn len_upto(&mut self, max: usize) -> usize {
        let bits = self.below(usize::BITS as usize - max.leading_zeros() as usize + 1);
        let cap = (1usize << bits).min(max.max(1));
        1 + self.below(cap)
    }

    fn pick<'p>(&mut self, pool: &'p [Vec<u8>]) -> &'p [u8] {
        let n = if self.chance(4) {
            self.corpus_len
        } else {
            pool.len()
        };
        &pool[self.below(n)]
    }

    fn next_input(&mut self, pool: &[Vec<u8>]) -> Vec<u8> {
        if self.spec.json.is_some() && self.chance(3) {
            if let Some(buf) = self.json_mutate(pool) {
                return buf;
            }
        }
        let fresh = self.chance(8);
        let mut buf = if fresh {
            (self.spec.grammar)(&mut self.rng)
        } else {
            self.pick(pool).to_vec()
        };
        // A fresh input is already of the right shape: mutate it little.
        let rounds = if fresh {
            self.below(3)
        } else {
            1usize << self.below(4)
        };
        let mut huge = false;
        for _ in 0..rounds {
            huge |= self.mutate(&mut buf, pool);
        }
        buf.truncate(if huge { HUGE_LEN } else { MAX_LEN });
        buf
    }

    /// Applies one mutation; true when it deliberately made a huge input.
    fn mutate(&mut self, buf: &mut Vec<u8>, pool: &[Vec<u8>]) -> bool {
        let pos = |m: &mut Self, len: usize| m.below(len + 1);
        match self.below(17) {
            0 if !buf.is_empty() => {
                let i = self.below(buf.len());
                buf[i] ^= 1 << self.below(8);
            }
            1 if !buf.is_empty() => {
                let i = self.below(buf.len());
                buf[i] = INTERESTING_BYTES[self.below(INTERESTING_BYTES.len())];
            }
            2 if !buf.is_empty() => {
                let i = self.below(buf.len());
                let d = 1 + self.below(16) as u8;
                buf[i] = if self.chance(2) {
                    buf[i].wrapping_add(d)
                } else {
                    buf[i].wrapping_sub(d)
                };
            }
            3 if !buf.is_empty() => {
                let at = self.below(buf.len());
                let n = self.len_upto(buf.len() - at);
                buf.drain(at..at + n);
            }
            4 => {
                let at = pos(self, buf.len());
                let n = self.len_upto(16);
                let bytes: Vec<u8> = (0..n).map(|_| self.rng.next_u64() as u8).collect();
                buf.splice(at..at, bytes);
            }
            5 if !buf.is_empty() => {
                // Duplicate a range somewhere else.
                let a = self.below(buf.len());
                let n = self.len_upto(buf.len() - a);
                let chunk = buf[a..a + n].to_vec();
                let at = pos(self, buf.len());
                buf.splice(at..at, chunk);
            }
            6 => {
                let at = pos(self, buf.len());
                buf.truncate(at);
            }
            7 => {
                // Splice: our head, another input's tail.
                let other = &pool[self.below(pool.len())];
                let at = pos(self, buf.len());
                let from = pos(self, other.len());
                buf.truncate(at);
                buf.extend_from_slice(&other[from..]);
            }
            8 | 9 => {
                let k = self.below(self.spec.dict.len());
                let tok = self.spec.dict[k];
                let at = pos(self, buf.len());
                buf.splice(at..at, tok.iter().copied());
            }
            10 => self.replace_number(buf),
            11 => return self.nest(buf),
            12 => {
                let tok = BAD_UTF8[self.below(BAD_UTF8.len())];
                let at = pos(self, buf.len());
                buf.splice(at..at, tok.iter().copied());
            }
            13 if !buf.is_empty() => return self.repeat(buf),
            14 if !buf.is_empty() => {
                // An edge integer, little endian, over 2, 4 or 8 bytes.
                let v = INTERESTING_INTS[self.below(INTERESTING_INTS.len())];
                let width = [2usize, 4, 8][self.below(3)];
                let at = self.below(buf.len());
                let end = (at + width).min(buf.len());
                let bytes = v.to_le_bytes();
                buf[at..end].copy_from_slice(&bytes[..end - at]);
            }
            15 if !buf.is_empty() => {
                // Overwrite a range with a token.
                let k = self.below(self.spec.dict.len());
                let tok = self.spec.dict[k];
                let at = self.below(buf.len());
                let end = (at + self.len_upto(tok.len().max(1))).min(buf.len());
                buf.splice(at..end, tok.iter().copied());
            }
            _ => {
                // Swap two bytes.
                if buf.len() >= 2 {
                    let (a, b) = (self.below(buf.len()), self.below(buf.len()));
                    buf.swap(a, b);
                }
            }
        }
        false
    }

    /// Structure-aware: a pool input that is a JSON document (after its id
    /// line, if any) gets 1..=3 edits of its tree, then is written back.
    fn json_mutate(&mut self, pool: &[Vec<u8>]) -> Option<Vec<u8>> {
        let shape = self.spec.json.as_ref()?;
        let ids = shape.ids;
        let base = self.pick(pool);
        let (mut head, body) = match ids {
            Some(_) => {
                let nl = base.iter().position(|&b| b == b'\n')?;
                (base[..=nl].to_vec(), &base[nl + 1..])
            }
            None => (Vec::new(), base),
        };
        let mut doc: serde_json::Value = serde_json::from_slice(body).ok()?;
        for _ in 0..1 + self.below(3) {
            self.json_edit(&mut doc);
        }
        if let Some(ids) = ids.filter(|_| self.chance(4)) {
            head = format!("{}\n", ids[self.below(ids.len())]).into_bytes();
        }
        head.extend(serde_json::to_vec(&doc).ok()?);
        // Long lists and wide maps stay under the huge-input cap.
        (head.len() <= HUGE_LEN).then_some(head)
    }

    fn json_edit(&mut self, doc: &mut serde_json::Value) {
        use serde_json::Value;
        let Some(shape) = self.spec.json.as_ref() else {
            return;
        };
        let gen = shape.gen();
        let keys = shape.keys;
        let r = &mut self.rng;
        let mut k = r.below(json_nodes(doc));
        let Some(node) = json_nth(doc, &mut k) else {
            return;
        };
        let fresh = |r: &mut SplitMix64| -> Value {
            let mut text = String::new();
            gen.value(r, &mut text, 2);
            serde_json::from_str(&text).unwrap_or(Value::Null)
        };
        match (r.below(4), node) {
            (0, node) => *node = fresh(r),
            (_, Value::Number(n)) => {
                *n = match r.below(3) {
                    0 => serde_json::Number::from(r.next_u64() >> r.below(64)),
                    _ => match serde_json::from_str(json_number(r)) {
                        Ok(Value::Number(edge)) => edge,
                        _ => serde_json::Number::from(0),
                    },
                }
            }
            (_, Value::String(s)) => {
                *s = match r.below(4) {
                    0 => "x".repeat(r.below(300)),
                    1 => keys[r.below(keys.len())].to_string(),
                    _ => gen.strings[r.below(gen.strings.len())].to_string(),
                }
            }
            (_, Value::Bool(b)) => *b = !*b,
            (_, Value::Array(items)) => match r.below(4) {
                0 => items.push(fresh(r)),
                1 if !items.is_empty() => {
                    items.remove(r.below(items.len()));
                }
                2 if !items.is_empty() => {
                    // Many copies of one element: long lists.
                    let item = items[r.below(items.len())].clone();
                    let max = if r.below(8) == 0 { 2000 } else { 16 };
                    for _ in 0..1 + r.below(max) {
                        items.push(item.clone());
                    }
                }
                _ => items.reverse(),
            },
            (_, Value::Object(map)) => match r.below(3) {
                0 if !map.is_empty() => {
                    let key = map
                        .keys()
                        .nth(r.below(map.len()))
                        .cloned()
                        .unwrap_or_default();
                    map.remove(&key);
                }
                1 => {
                    // Many distinct keys: wide maps (models, pods).
                    let value = fresh(r);
                    let max = if r.below(8) == 0 { 700 } else { 8 };
                    for i in 0..1 + r.below(max) {
                        map.insert(format!("k{i}-{}", r.below(1000)), value.clone());
                    }
                }
                _ => {
                    map.insert(keys[r.below(keys.len())].to_string(), fresh(r));
                }
            },
            (_, node) => *node = fresh(r),
        }
    }

    fn replace_number(&mut self, buf: &mut Vec<u8>) {
        let starts: Vec<usize> = (0..buf.len())
            .filter(|&i| {
                buf[i].is_ascii_digit()
                    && (i == 0 || !(buf[i - 1].is_ascii_digit() || buf[i - 1] == b'-'))
                    || buf[i] == b'-' && buf.get(i + 1).is_some_and(u8::is_ascii_digit)
            })
            .collect();
        let num = NUMBERS[self.below(NUMBERS.len())].as_bytes();
        if starts.is_empty() {
            let at = self.below(buf.len() + 1);
            buf.splice(at..at, num.iter().copied());
            return;
        }
        let start = starts[self.below(starts.len())];
        let mut end = start + 1;
        while end < buf.len() && buf[end].is_ascii_digit() {
            end += 1;
        }
        buf.splice(start..end, num.iter().copied());
    }

    fn nest(&mut self, buf: &mut Vec<u8>) -> bool {
        let (open, close) = self.spec.nest[self.below(self.spec.nest.len())];
        let huge = self.chance(64);
        let depth = if huge {
            10_000 + self.below(90_000)
        } else {
            self.len_upto(300)
        };
        let at = self.below(buf.len() + 1);
        let to = at + self.below(buf.len() - at + 1);
        let mut out = Vec::with_capacity(buf.len() + depth * (open.len() + close.len()));
        out.extend_from_slice(&buf[..at]);
        for _ in 0..depth {
            out.extend_from_slice(open);
        }
        out.extend_from_slice(&buf[at..to]);
        if !close.is_empty() && !self.chance(4) {
            for _ in 0..depth {
                out.extend_from_slice(close);
            }
        }
        out.extend_from_slice(&buf[to..]);
        *buf = out;
        huge
    }

    fn repeat(&mut self, buf: &mut Vec<u8>) -> bool {
        let a = self.below(buf.len());
        let n = self.len_upto((buf.len() - a).min(256));
        let chunk = buf[a..a + n].to_vec();
        let huge = self.chance(64);
        let times = if huge {
            (HUGE_LEN / 2 / n).max(2)
        } else {
            1 + self.len_upto(64)
        };
        let mut rep = Vec::with_capacity(n * times);
        for _ in 0..times {
            rep.extend_from_slice(&chunk);
        }
        buf.splice(a + n..a + n, rep);
        huge
    }
}

fn json_nodes(v: &serde_json::Value) -> usize {
    1 + match v {
        serde_json::Value::Array(items) => items.iter().map(json_nodes).sum(),
        serde_json::Value::Object(map) => map.values().map(json_nodes).sum(),
        _ => 0,
    }
}

/// The `k`-th node of `v` in pre-order.
fn json_nth<'a>(v: &'a mut serde_json::Value, k: &mut usize) -> Option<&'a mut serde_json::Value> {
    if *k == 0 {
        return Some(v);
    }
    *k -= 1;
    match v {
        serde_json::Value::Array(items) => items.iter_mut().find_map(|item| json_nth(item, k)),
        serde_json::Value::Object(map) => map.values_mut().find_map(|item| json_nth(item, k)),
        _ => None,
    }
}

/// What one property check gets besides the input: randomness of its own
/// (cut points, clocks, names) and the allocation bound.
struct Ctx {
    rng: SplitMix64,
    max_peak: usize,
    max_peak_input: usize,
    /// Inputs the parser accepted (the rest it refused cleanly).
    accepted: u64,
}

impl Ctx {
    /// Runs `f` and checks its peak heap use against
    /// `per_byte * input_len + base`.
    fn alloc<R>(
        &mut self,
        what: &str,
        input_len: usize,
        per_byte: usize,
        base: usize,
        f: impl FnOnce() -> R,
    ) -> Result<R, String> {
        let (r, peak) = peak_during(f);
        if peak > self.max_peak {
            self.max_peak = peak;
            self.max_peak_input = input_len;
        }
        let bound = per_byte * input_len + base;
        if peak > bound {
            return Err(format!(
                "{what}: allocated {peak} bytes at peak for a {input_len}-byte input (bound {bound})"
            ));
        }
        Ok(r)
    }
}

fn escaped(input: &[u8], max: usize) -> String {
    let mut s: String = input
        .iter()
        .take(max)
        .flat_map(|b| std::ascii::escape_default(*b))
        .map(char::from)
        .collect();
    if input.len() > max {
        s.push_str(&format!("... ({} more bytes)", input.len() - max));
    }
    s
}

fn panic_message(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| e.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// Feeds corpus files, then mutated inputs, to `check` until `FUZZ_ITERS`
/// inputs ran. `check` returns the input's behaviour signature or the
/// property it broke.
fn fuzz(spec: Spec, mut check: impl FnMut(&[u8], &mut Ctx) -> Result<u64, String>) {
    let target = spec.target;
    let iters = env_u64("FUZZ_ITERS").unwrap_or(DEFAULT_ITERS);
    let seed = env_u64("FUZZ_SEED").unwrap_or(DEFAULT_SEED) ^ fnv(target.as_bytes());
    let corpus = load_corpus(target);
    let mut pool: Vec<Vec<u8>> = corpus.iter().map(|(_, b)| b.clone()).collect();
    let corpus_len = pool.len();
    let mut seen = HashSet::new();
    let mut mutator = Mutator {
        rng: SplitMix64::new(seed),
        spec,
        corpus_len,
    };
    let mut ctx = Ctx {
        rng: SplitMix64::new(seed.rotate_left(32) ^ 0x00C0_FFEE),
        max_peak: 0,
        max_peak_input: 0,
        accepted: 0,
    };
    let started = Instant::now();
    let mut bytes_total = 0u64;
    for i in 0..iters {
        let input = match usize::try_from(i).ok().and_then(|i| corpus.get(i)) {
            Some((_, bytes)) => bytes.clone(),
            None => mutator.next_input(&pool),
        };
        bytes_total += input.len() as u64;
        let outcome = catch_unwind(AssertUnwindSafe(|| check(&input, &mut ctx)));
        let failure = match outcome {
            Ok(Ok(signature)) => {
                if seen.insert(signature)
                    && input.len() <= MAX_POOL_INPUT
                    && pool.len() < corpus_len + MAX_POOL
                {
                    pool.push(input);
                }
                continue;
            }
            Ok(Err(property)) => format!("property failed: {property}"),
            Err(payload) => format!("panicked: {}", panic_message(&*payload)),
        };
        let name = match usize::try_from(i).ok().and_then(|i| corpus.get(i)) {
            Some((file, _)) => format!("corpus file {file}"),
            None => format!("input #{i}"),
        };
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
        let path = dir.join(format!("{target}-{seed:#x}-{i}.bin"));
        let saved = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&path, &input))
            .map_or_else(
                |e| format!("not saved: {e}"),
                |()| path.display().to_string(),
            );
        panic!(
            "fuzz {target}: {failure}\n  {name} ({} bytes), seed {seed:#x} (FUZZ_SEED={:#x})\n  \
             input: b\"{}\"\n  saved to {saved}\n  replay: FUZZ_SEED={:#x} FUZZ_ITERS={} cargo test --test fuzz {target}\n  \
             keep it as a regression input: copy the file into tests/fuzz/corpus/{target}/",
            input.len(),
            env_u64("FUZZ_SEED").unwrap_or(DEFAULT_SEED),
            escaped(&input, 600),
            env_u64("FUZZ_SEED").unwrap_or(DEFAULT_SEED),
            i + 1,
        );
    }
    let secs = started.elapsed().as_secs_f64();
    let _ = writeln!(
        std::io::stderr(),
        "fuzz {target:<22} {iters} inputs, seed {seed:#018x}: {:.0} % accepted, {} behaviours \
         ({} kept, {corpus_len} corpus files), {:.1} MB in, peak alloc {} KiB (for a {}-byte input), {secs:.1} s",
        ctx.accepted as f64 * 100.0 / iters.max(1) as f64,
        seen.len(),
        pool.len() - corpus_len,
        bytes_total as f64 / 1e6,
        ctx.max_peak / 1024,
        ctx.max_peak_input,
    );
}

// ---------------------------------------------------------------------------
// Grammars: fresh inputs of the right shape, with values drawn from edges.

struct JsonGen<'a> {
    keys: &'a [&'a str],
    strings: &'a [&'a str],
}

impl JsonGen<'_> {
    fn value(&self, r: &mut SplitMix64, out: &mut String, depth: usize) {
        let pick = if depth > 5 { r.below(6) } else { r.below(9) };
        match pick {
            0 => out.push_str(["null", "true", "false"][r.below(3)]),
            1 | 2 => out.push_str(json_number(r)),
            3..=5 => self.string(r, out),
            6 | 7 => {
                out.push('{');
                for i in 0..r.below(5) {
                    if i > 0 {
                        out.push(',');
                    }
                    self.key(r, out);
                    out.push(':');
                    self.value(r, out, depth + 1);
                }
                out.push('}');
            }
            _ => {
                out.push('[');
                for i in 0..r.below(6) {
                    if i > 0 {
                        out.push(',');
                    }
                    self.value(r, out, depth + 1);
                }
                out.push(']');
            }
        }
    }

    fn key(&self, r: &mut SplitMix64, out: &mut String) {
        if r.below(8) == 0 {
            self.string(r, out);
        } else {
            out.push('"');
            out.push_str(self.keys[r.below(self.keys.len())]);
            out.push('"');
        }
    }

    fn string(&self, r: &mut SplitMix64, out: &mut String) {
        out.push('"');
        match r.below(4) {
            0 => {
                for _ in 0..r.below(12) {
                    out.push(char::from(b'a' + r.below(26) as u8));
                }
            }
            1 => out
                .push_str(["\\u00e9", "\\ud83d\\ude00", "\\n\\t\\\"", "é", "\\u0000"][r.below(5)]),
            _ => out.push_str(self.strings[r.below(self.strings.len())]),
        }
        out.push('"');
    }

    /// An object of `keys`, each given a value from `value`.
    fn object(&self, r: &mut SplitMix64) -> Vec<u8> {
        let mut out = String::new();
        self.value_object(r, &mut out);
        out.into_bytes()
    }

    fn value_object(&self, r: &mut SplitMix64, out: &mut String) {
        out.push('{');
        for i in 0..1 + r.below(5) {
            if i > 0 {
                out.push(',');
            }
            self.key(r, out);
            out.push(':');
            self.value(r, out, 1);
        }
        out.push('}');
    }
}

const JSON_NEST: &[(&[u8], &[u8])] = &[(b"[", b"]"), (b"{\"a\":", b"}"), (b"[{\"x\":", b"}]")];

fn json_dict(extra: &[&'static str]) -> Vec<&'static [u8]> {
    let mut d: Vec<&'static [u8]> = vec![
        b"{",
        b"}",
        b"[",
        b"]",
        b":",
        b",",
        b"\"",
        b"null",
        b"true",
        b"false",
        b"{}",
        b"[]",
        b"\"\"",
        b"\\\"",
        b"\\u0000",
        b"\\ud83d\\ude00",
        b" ",
        b"\n",
        b"\":\"",
        b"\",\"",
    ];
    d.extend(extra.iter().map(|s| s.as_bytes()));
    d.extend(NUMBERS.iter().map(|s| s.as_bytes()));
    d
}

const BODY_KEYS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "image_url",
    "url",
    "tool_calls",
    "stream",
    "max_tokens",
];
const BODY_STRINGS: &[&str] = &[
    "m",
    "llama",
    "user",
    "system",
    "assistant",
    "text",
    "tool",
    "",
];

fn body_completions(r: &mut SplitMix64) -> Vec<u8> {
    let g = JsonGen {
        keys: BODY_KEYS,
        strings: BODY_STRINGS,
    };
    let mut out = String::from("{\"model\":");
    g.string(r, &mut out);
    out.push_str(",\"prompt\":");
    match r.below(4) {
        0 => g.string(r, &mut out),
        1 => {
            let ids: Vec<&str> = (0..r.below(40)).map(|_| json_number(r)).collect();
            out.push_str(&format!("[{}]", ids.join(",")));
        }
        _ => g.value(r, &mut out, 1),
    }
    out.push('}');
    out.into_bytes()
}

fn body_chat(r: &mut SplitMix64) -> Vec<u8> {
    let g = JsonGen {
        keys: BODY_KEYS,
        strings: BODY_STRINGS,
    };
    let mut out = String::from("{\"model\":\"m\",\"messages\":[");
    for i in 0..r.below(6) {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"role\":");
        g.string(r, &mut out);
        out.push_str(",\"content\":");
        if r.below(2) == 0 {
            out.push_str("[{\"type\":\"text\",\"text\":");
            g.string(r, &mut out);
            out.push_str("},");
            g.value(r, &mut out, 2);
            out.push(']');
        } else {
            g.value(r, &mut out, 2);
        }
        out.push('}');
    }
    out.push_str("]}");
    out.into_bytes()
}

fn random_frame(r: &mut SplitMix64, depth: usize) -> Frame {
    let word = |r: &mut SplitMix64| -> String {
        ["OK", "QUEUED", "ERR wrong type", "PONG", "", "é"][r.below(6)].to_string()
    };
    match r.below(if depth >= 4 { 6 } else { 8 }) {
        0 => Frame::Simple(word(r)),
        1 => Frame::Error(word(r)),
        2 => Frame::Integer(INTERESTING_INTS[r.below(INTERESTING_INTS.len())] as i64),
        3 | 4 => {
            let n = r.below(40);
            Frame::Bulk((0..n).map(|_| r.next_u64() as u8).collect())
        }
        5 => [Frame::Null, Frame::NullArray][r.below(2)].clone(),
        _ => Frame::Array(
            (0..r.below(5))
                .map(|_| random_frame(r, depth + 1))
                .collect(),
        ),
    }
}

fn resp_pipeline(r: &mut SplitMix64) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..r.below(4) {
        random_frame(r, 0).encode(&mut out);
    }
    out.extend_from_slice(b"+OK\r\n");
    out
}

/// The candidates a placement of the `place` target offered Redis.
fn place_candidates() -> Vec<Candidate> {
    ["a:1", "b:1", "c:1"]
        .iter()
        .map(|a| Candidate {
            address: a.to_string(),
            cost: 32,
            step: 16,
        })
        .collect()
}

/// The follower's prompt of the `place` target: 200 blocks, block `i`'s
/// hash being `1000 + i`, so records of prompts that start alike share some.
fn place_hashes() -> Vec<u64> {
    (1000..1200).collect()
}

/// A claim record: the follower's own (every position shared), a prompt
/// that parts from it, or entries drawn from edges.
fn claim_record_input(r: &mut SplitMix64) -> String {
    let hashes = place_hashes();
    match r.below(4) {
        0 => claim_record(&hashes[..FAMILY_BLOCKS + r.below(hashes.len() - FAMILY_BLOCKS)]),
        1 => {
            let mut other = hashes[..FAMILY_BLOCKS + r.below(64)].to_vec();
            other.extend((0..r.below(300)).map(|i| 5000 + i as u64));
            claim_record(&other)
        }
        _ => {
            let positions = [
                "31",
                "39",
                "199",
                "200",
                "0",
                "4294967294",
                "4294967295",
                "18446744073709551615",
                "-1",
                "",
            ];
            let values = [
                "407",
                "40f",
                "4af",
                "0",
                "ffffffffffffffff",
                "10000000000000000",
                "x",
                "",
            ];
            (0..r.below(45))
                .map(|_| {
                    format!(
                        "{}:{}",
                        positions[r.below(positions.len())],
                        values[r.below(values.len())]
                    )
                })
                .collect::<Vec<_>>()
                .join(",")
        }
    }
}

/// The placement pipeline's reply: AUTH's `+OK` (sometimes), the script's
/// reply (a pod, a pod with a claim's age and record, an error), QUIT's
/// `+OK`.
fn place_reply(r: &mut SplitMix64) -> Vec<u8> {
    let mut out = Vec::new();
    if r.below(3) == 0 {
        out.extend_from_slice(b"+OK\r\n");
    }
    let pod =
        |r: &mut SplitMix64| Frame::Bulk(POD_NAMES[r.below(POD_NAMES.len())].as_bytes().to_vec());
    let script = match r.below(6) {
        0 => Frame::Error(
            ["NOPERM no EVAL", "ERR no candidates", "MOVED 1 x:1", ""][r.below(4)].into(),
        ),
        1 | 2 => Frame::Array(vec![pod(r)]),
        3 | 4 => Frame::Array(vec![
            pod(r),
            Frame::Integer(INTERESTING_INTS[r.below(INTERESTING_INTS.len())] as i64),
            Frame::Bulk(claim_record_input(r).into_bytes()),
        ]),
        _ => random_frame(r, 0),
    };
    script.encode(&mut out);
    out.extend_from_slice(b"+OK\r\n");
    out
}

/// A Redis Cluster reply: `CLUSTER SLOTS` (ranges, each with its master
/// and a replica; hosts, ports and bounds from edges) or a redirection.
fn cluster_reply(r: &mut SplitMix64) -> Vec<u8> {
    let bounds: [i64; 8] = [0, 1, 5460, 5461, 16383, 16384, -1, 65535];
    let hosts = [
        "10.0.0.1", "10.0.0.2", "", "?", "::1", "a b", "\u{e9}", "h\n",
    ];
    let ports: [i64; 6] = [7000, 7001, 0, 65535, 65536, -1];
    let frame = if r.below(2) == 0 {
        // A whole, valid map: 1-4 masters splitting the slots at random.
        let mut cuts: Vec<i64> = (0..r.below(4))
            .map(|_| 1 + r.below(16_383) as i64)
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        let starts: Vec<i64> = std::iter::once(0).chain(cuts.iter().copied()).collect();
        let ends: Vec<i64> = cuts.iter().map(|c| c - 1).chain([16_383]).collect();
        Frame::Array(
            starts
                .iter()
                .zip(&ends)
                .enumerate()
                .map(|(i, (&lo, &hi))| {
                    let host = ["10.0.0.1", "10.0.0.2", "", "::1"][r.below(4)];
                    Frame::Array(vec![
                        Frame::Integer(lo),
                        Frame::Integer(hi),
                        Frame::Array(vec![
                            Frame::Bulk(host.as_bytes().to_vec()),
                            Frame::Integer(7000 + i as i64),
                        ]),
                    ])
                })
                .collect(),
        )
    } else if r.below(2) == 0 {
        let kind = ["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", ""][r.below(5)];
        let slot = bounds[r.below(bounds.len())];
        let node = [
            "10.0.0.1:7000",
            ":7000",
            "10.0.0.1:",
            "10.0.0.1:x",
            "[::1]:7000",
            "",
        ][r.below(6)];
        Frame::Error(format!("{kind} {slot} {node}"))
    } else {
        let node = |r: &mut SplitMix64| {
            Frame::Array(vec![
                Frame::Bulk(hosts[r.below(hosts.len())].as_bytes().to_vec()),
                Frame::Integer(ports[r.below(ports.len())]),
                Frame::Bulk(b"id".to_vec()),
            ])
        };
        Frame::Array(
            (0..r.below(5))
                .map(|_| {
                    let mut lo = bounds[r.below(bounds.len())];
                    let mut hi = bounds[r.below(bounds.len())];
                    if r.below(4) != 0 && lo > hi {
                        std::mem::swap(&mut lo, &mut hi);
                    }
                    Frame::Array(vec![
                        Frame::Integer(lo),
                        Frame::Integer(hi),
                        node(r),
                        node(r),
                    ])
                })
                .collect(),
        )
    };
    let mut out = Vec::new();
    frame.encode(&mut out);
    out
}

fn id_and_payload(r: &mut SplitMix64, ids: &[&str], payload: &[u8]) -> Vec<u8> {
    let mut out = ids[r.below(ids.len())].as_bytes().to_vec();
    out.push(b'\n');
    out.extend_from_slice(payload);
    out
}

const POD_NAMES: &[&str] = &["a:1", "b:1", "c:1", "zz:9", "", "a:1 "];
const PREFIX_IDS: &[&str] = &[
    "77",
    "0",
    "18446744073709551615",
    "18446744073709551616",
    "-1",
    "",
    "x",
];
const LOAD_IDS: &[&str] = &["r1", "r2", "r3", "", "r2\u{0}"];
const CLUSTER_KEYS: &[&str] = &[
    "cluster_statuses",
    "name",
    "host_statuses",
    "address",
    "socket_address",
    "port_value",
    "hostname",
    "health_status",
    "eds_health_status",
    "failed_active_health_check",
    "failed_outlier_check",
    "pending_dynamic_removal",
    "excluded_via_immediate_hc_fail",
    "active_hc_timeout",
    "pipe",
];

fn prefixcache_input(r: &mut SplitMix64) -> Vec<u8> {
    let mut models = String::from("{\"model_to_pods\":{");
    for i in 0..r.below(5) {
        if i > 0 {
            models.push(',');
        }
        let model = match r.below(4) {
            0 => format!("junk-{}", r.below(2000)),
            1 => "x".repeat(r.below(300)),
            _ => ["m", "llama", "", "é"][r.below(4)].to_string(),
        };
        models.push_str(&format!("{model:?}:{{"));
        for j in 0..r.below(5) {
            if j > 0 {
                models.push(',');
            }
            let pod = POD_NAMES[r.below(POD_NAMES.len())];
            let nanos = match r.below(3) {
                0 => json_number(r).to_string(),
                _ => (1_700_000_000u64 * 1_000_000_000 + r.next_u64() % 10_000_000_000_000)
                    .to_string(),
            };
            models.push_str(&format!("{pod:?}:{nanos}"));
        }
        models.push('}');
    }
    models.push_str("}}");
    id_and_payload(r, PREFIX_IDS, models.as_bytes())
}

fn podload_input(r: &mut SplitMix64) -> Vec<u8> {
    let mut s = String::from("{\"inflight\":{");
    for i in 0..r.below(5) {
        if i > 0 {
            s.push(',');
        }
        let pod = POD_NAMES[r.below(POD_NAMES.len())];
        s.push_str(&format!("{pod:?}:{}", json_number(r)));
    }
    s.push_str(&format!("}},\"at_ms\":{}}}", json_number(r)));
    id_and_payload(r, LOAD_IDS, s.as_bytes())
}

fn clusters_input(r: &mut SplitMix64) -> Vec<u8> {
    let mut s = String::from("{\"cluster_statuses\":[");
    for c in 0..1 + r.below(3) {
        if c > 0 {
            s.push(',');
        }
        let name = ["pods", "other", ""][r.below(3)];
        s.push_str(&format!("{{\"name\":\"{name}\",\"host_statuses\":["));
        for h in 0..r.below(6) {
            if h > 0 {
                s.push(',');
            }
            let addr = ["10.0.0.1", "::1", "", "a", "x:y"][r.below(5)];
            let port = if r.below(2) == 0 {
                json_number(r)
            } else {
                "8000"
            };
            let host = ["pod-a", "", "p"][r.below(3)];
            let health = ["HEALTHY", "UNHEALTHY", "DRAINING", "TIMEOUT", "?"][r.below(5)];
            let flag = [
                "failed_active_health_check",
                "failed_outlier_check",
                "pending_dynamic_removal",
                "excluded_via_immediate_hc_fail",
                "active_hc_timeout",
            ][r.below(5)];
            s.push_str(&format!(
                "{{\"address\":{{\"socket_address\":{{\"address\":\"{addr}\",\"port_value\":{port}}}}},\
                 \"hostname\":\"{host}\",\"health_status\":{{\"eds_health_status\":\"{health}\",\"{flag}\":{}}}}}",
                r.below(2) == 0
            ));
        }
        s.push_str("]}");
    }
    s.push_str("]}");
    s.into_bytes()
}

fn members_input(r: &mut SplitMix64) -> Vec<u8> {
    let mut s = String::from("{\"pools\":{");
    for p in 0..r.below(3) {
        if p > 0 {
            s.push(',');
        }
        s.push_str(&format!("\"{}\":[", ["", "m", "llama"][r.below(3)]));
        for m in 0..r.below(5) {
            if m > 0 {
                s.push(',');
            }
            s.push_str(&format!(
                "{{\"slot\":{},\"name\":\"{}\",\"address\":\"a:{}\",\"healthy\":{}}}",
                if r.below(2) == 0 { json_number(r) } else { "3" },
                POD_NAMES[r.below(POD_NAMES.len())],
                r.below(3),
                r.below(2) == 0
            ));
        }
        s.push(']');
    }
    s.push_str("}}");
    s.into_bytes()
}

fn records_input(r: &mut SplitMix64, header: usize, record: usize, max: usize) -> Vec<u8> {
    let n = header + record * r.below(max) + if r.below(4) == 0 { r.below(record) } else { 0 };
    (0..n)
        .map(|i| {
            if r.below(3) == 0 {
                INTERESTING_INTS[r.below(INTERESTING_INTS.len())].to_le_bytes()[i % 8]
            } else {
                r.next_u64() as u8
            }
        })
        .collect()
}

fn down_input(r: &mut SplitMix64) -> Vec<u8> {
    records_input(r, 0, 10, 300)
}

fn handoff_input(r: &mut SplitMix64) -> Vec<u8> {
    records_input(r, 8, 8, 64)
}

fn heartbeat_input(r: &mut SplitMix64) -> Vec<u8> {
    let mut out = records_input(r, Heartbeat::LEN, 1, 1);
    if r.below(3) == 0 {
        out.truncate(r.below(Heartbeat::LEN + 2));
    }
    out
}

fn registry_input(r: &mut SplitMix64) -> Vec<u8> {
    let mut out = Vec::new();
    let max = if r.below(16) == 0 { 1100 } else { 12 };
    for _ in 0..r.below(max) {
        let seen = INTERESTING_INTS[r.below(INTERESTING_INTS.len())] as u32;
        out.extend_from_slice(&seen.to_le_bytes());
        match r.below(6) {
            0 => out.push(0),
            1 => {
                // A length that does not match the name.
                out.push(r.next_u64() as u8);
                out.extend_from_slice(b"pod");
            }
            2 => {
                out.push(2);
                out.extend_from_slice(b"\xc3\x28");
            }
            _ => {
                let name = format!("pod-{}", r.below(50));
                out.push(name.len() as u8);
                out.extend_from_slice(name.as_bytes());
            }
        }
    }
    out
}

const CONFIG_KEYS: &[&str] = &[
    "endpoints",
    "model_endpoints",
    "cluster",
    "model_clusters",
    "membership",
    "admin_cluster",
    "admin_authority",
    "refresh_ms",
    "pod_name",
    "passive_cooldown_ms",
    "block_size",
    "hash_seed",
    "table_capacity_blocks",
    "table_idle_expiry_secs",
    "dense_prefix_blocks",
    "imbalance_abs_count",
    "stddev_factor",
    "match_header",
    "max_body_bytes",
    "sync",
    "enabled",
    "period_ms",
    "op_timeout_ms",
    "key_prefix",
    "namespaces",
    "prefixcache",
    "load",
    "record_ttl_secs",
    "setex_chunk",
    "mget_batch",
    "scan_count",
    "write_through",
    "full_scan_every",
    "change_log_max_entries",
    "log_read_count",
    "poll_ms",
    "max_inflight_calls",
    "bridge_cluster",
    "bridge_authority",
    "bridge_path",
    "auth_username",
    "auth_password",
    "max_reply_bytes",
];

/// Top-level fields of the plugin configuration (`config::RawConfig`).
const CONFIG_FIELDS: &[&str] = &[
    "endpoints",
    "model_endpoints",
    "cluster",
    "model_clusters",
    "membership",
    "passive_cooldown_ms",
    "block_size",
    "hash_seed",
    "table_capacity_blocks",
    "table_idle_expiry_secs",
    "dense_prefix_blocks",
    "imbalance_abs_count",
    "stddev_factor",
    "match_header",
    "max_body_bytes",
    "sync",
];

const CONFIG_STRINGS: &[&str] = &[
    "a:1",
    "b:2",
    "pods",
    "hostname",
    "address",
    "x-h",
    "aibrix",
    "",
    "10.0.0.1:8000",
    "a:0",
];

fn config_input(r: &mut SplitMix64) -> Vec<u8> {
    let g = JsonGen {
        keys: CONFIG_KEYS,
        strings: CONFIG_STRINGS,
    };
    if r.below(3) == 0 {
        return g.object(r);
    }
    // Mostly valid shape: endpoints plus a few fields with edge values.
    let mut out = String::from("{\"endpoints\":[\"a:1\",\"b:1\"]");
    for _ in 0..r.below(4) {
        let field = CONFIG_FIELDS[1 + r.below(CONFIG_FIELDS.len() - 1)];
        out.push_str(&format!(",\"{field}\":"));
        if field == "sync" || field == "membership" {
            g.value_object(r, &mut out);
        } else {
            g.value(r, &mut out, 2);
        }
    }
    out.push('}');
    out.into_bytes()
}

// ---------------------------------------------------------------------------
// Targets.

fn body_spec(target: &'static str, grammar: fn(&mut SplitMix64) -> Vec<u8>) -> Spec {
    Spec {
        target,
        dict: json_dict(&[
            "\"model\":",
            "\"prompt\":",
            "\"messages\":",
            "\"role\":",
            "\"content\":",
            "\"type\":\"text\"",
            "\"text\":",
            "{\"role\":\"user\",\"content\":\"x\"}",
            "[[1,2],[3]]",
            "[1,2,3]",
            "[\"a\",\"b\"]",
        ]),
        nest: JSON_NEST,
        grammar,
        json: Some(JsonShape {
            keys: BODY_KEYS,
            strings: BODY_STRINGS,
            ids: None,
        }),
    }
}

fn check_body(kind: ApiKind, input: &[u8], ctx: &mut Ctx) -> Result<u64, String> {
    // serde_json's Value costs up to ~100 bytes per input byte (a map node
    // for a 7-byte object); 256 leaves room without hiding a length-driven
    // allocation.
    let res = ctx.alloc("parse_body", input.len(), 256, 64 * 1024, || {
        parse_body(kind, input)
    })?;
    let first = input.iter().find(|b| !b.is_ascii_whitespace());
    match res {
        Ok(r) => {
            if first != Some(&b'{') {
                return Err("parsed a body that is not a JSON object".into());
            }
            // Strings shrink or keep their size; a token id (>= 2 input
            // bytes with its comma) becomes 4 bytes.
            if r.prompt.len() > 2 * input.len() || r.model.len() > input.len() {
                return Err(format!(
                    "prompt of {} bytes / model of {} bytes from a {}-byte body",
                    r.prompt.len(),
                    r.model.len(),
                    input.len()
                ));
            }
            if kind == ApiKind::ChatCompletions
                && !(r.prompt.starts_with(b"<|") && r.prompt.ends_with(b"\n"))
            {
                return Err("chat prompt not made of <|role|>...\\n turns".into());
            }
            // The model is the body's `model` when it is a string, else "".
            if let Ok(serde_json::Value::Object(map)) =
                serde_json::from_slice::<serde_json::Value>(input)
            {
                let want = map.get("model").and_then(|m| m.as_str()).unwrap_or("");
                if r.model != want {
                    return Err(format!("model {:?}, body says {want:?}", r.model));
                }
            }
            ctx.accepted += 1;
            let shape = doc_shape(input, BODY_KEYS);
            Ok(sig(
                "ok",
                &format!("{} {shape}", log2_bucket(r.prompt.len())),
            ))
        }
        Err(reason) => {
            if first != Some(&b'{') && reason != PassReason::NotJson {
                return Err(format!("non-object body gave {reason:?}, not NotJson"));
            }
            if !matches!(reason, PassReason::NotJson | PassReason::NoPrompt) {
                return Err(format!("parse_body returned {reason:?}"));
            }
            Ok(sig(reason.as_str(), ""))
        }
    }
}

#[test]
fn parse_body_completions() {
    fuzz(
        body_spec("parse_body_completions", body_completions),
        |input, ctx| check_body(ApiKind::Completions, input, ctx),
    );
}

#[test]
fn parse_body_chat() {
    fuzz(body_spec("parse_body_chat", body_chat), |input, ctx| {
        check_body(ApiKind::ChatCompletions, input, ctx)
    });
}

#[test]
fn classify_method_and_path() {
    let spec = Spec {
        target: "classify",
        dict: vec![
            b"POST ",
            b"post ",
            b"GET ",
            b"/v1/completions",
            b"/v1/chat/completions",
            b"/",
            b"?",
            b"#",
            b"//",
            b"%2F",
            b" ",
        ],
        nest: &[(b"/", b""), (b"?", b"")],
        grammar: |r| {
            let m = ["POST", "PoSt", "GET", "", "POST\0"][r.below(5)];
            let p = [
                "/v1/completions",
                "/v1/chat/completions",
                "/v1/chat/completions//",
                "",
                "?",
            ][r.below(5)];
            format!("{m} {p}").into_bytes()
        },
        json: None,
    };
    fuzz(spec, |input, ctx| {
        let text = String::from_utf8_lossy(input);
        let (method, path) = text.split_once(' ').unwrap_or((&text, ""));
        let res = ctx.alloc("classify", input.len(), 0, 1024, || classify(method, path))?;
        let bare = path.split(['?', '#']).next().unwrap_or("");
        let bare = bare.trim_end_matches('/');
        let want_kind = match bare {
            "/v1/completions" => Some(ApiKind::Completions),
            "/v1/chat/completions" => Some(ApiKind::ChatCompletions),
            _ => None,
        };
        let want = match want_kind {
            None => Err(PassReason::Path),
            Some(_) if !method.eq_ignore_ascii_case("POST") => Err(PassReason::Method),
            Some(k) => Ok(k),
        };
        if res != want {
            return Err(format!(
                "classify({method:?}, {path:?}) = {res:?}, want {want:?}"
            ));
        }
        ctx.accepted += u64::from(res.is_ok());
        Ok(sig(&format!("{res:?}"), ""))
    });
}

fn frame_shape(f: &Frame, depth: usize, out: &mut String) {
    let tag = match f {
        Frame::Simple(_) => '+',
        Frame::Error(_) => '-',
        Frame::Integer(_) => ':',
        Frame::Bulk(_) => '$',
        Frame::Null => 'n',
        Frame::NullArray => 'N',
        Frame::Array(_) => '*',
    };
    out.push(tag);
    if let Frame::Array(items) = f {
        if depth < 2 {
            for item in items.iter().take(3) {
                frame_shape(item, depth + 1, out);
            }
        }
    }
}

/// Nesting depth (a scalar is 1) and whether every length is within limits.
fn frame_limits(f: &Frame) -> (usize, bool) {
    match f {
        Frame::Bulk(b) => (1, b.len() <= MAX_BULK_LEN),
        Frame::Array(items) => {
            let mut depth = 0;
            let mut ok = items.len() <= MAX_ARRAY_LEN;
            for item in items {
                let (d, o) = frame_limits(item);
                depth = depth.max(d);
                ok &= o;
            }
            (depth + 1, ok)
        }
        _ => (1, true),
    }
}

#[test]
fn resp_frames_and_pipelines() {
    let spec = Spec {
        target: "resp",
        dict: vec![
            b"\r\n",
            b"\r",
            b"\n",
            b"+OK\r\n",
            b"-ERR x\r\n",
            b":0\r\n",
            b":-1\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"$0\r\n\r\n",
            b"*0\r\n",
            b"*1\r\n",
            b"*2\r\n",
            b"$1\r\na\r\n",
            b"$",
            b"*",
            b":",
            b"+",
            b"-",
            b"$16777216\r\n",
            b"$16777217\r\n",
            b"*1048576\r\n",
            b"*1048577\r\n",
            b"$-2\r\n",
            b"*-2\r\n",
            b":9223372036854775808\r\n",
            b"$99999999999999999999\r\n",
            b"%1\r\n",
            b"_\r\n",
        ],
        nest: &[
            (b"*1\r\n", b""),
            (b"*2\r\n", b":1\r\n"),
            (b"*1048576\r\n", b""),
        ],
        grammar: resp_pipeline,
        json: None,
    };
    fuzz(spec, |input, ctx| {
        // Transient: at most MAX_DEPTH + 1 arrays reserve up to 1024 slots
        // each before their elements arrive; kept frames are linear.
        let res = ctx.alloc("resp::parse", input.len(), 64, 1024 * 1024, || {
            resp::parse(input)
        })?;
        let signature = match &res {
            Ok((frame, used)) => {
                let used = *used;
                if used == 0 || used > input.len() {
                    return Err(format!("consumed {used} of {} bytes", input.len()));
                }
                let (depth, within) = frame_limits(frame);
                if depth > MAX_DEPTH + 1 || !within {
                    return Err(format!("frame beyond limits (depth {depth})"));
                }
                let mut enc = Vec::new();
                frame.encode(&mut enc);
                // Canonical form: never longer than what was read.
                if enc.len() > used {
                    return Err(format!("re-encoded {} bytes from {used}", enc.len()));
                }
                if resp::parse(&enc) != Ok((frame.clone(), enc.len())) {
                    return Err("frame does not round-trip".into());
                }
                if resp::parse(&input[..used]) != res {
                    return Err("frame changes when the bytes after it are removed".into());
                }
                // Every cut inside a complete frame is "incomplete", never a
                // protocol error: more bytes would complete it.
                let mut cuts = vec![0, used - 1];
                cuts.extend((0..4).map(|_| ctx.rng.below(used)));
                for cut in cuts {
                    if resp::parse(&input[..cut]) != Err(ParseError::Incomplete) {
                        return Err(format!(
                            "prefix of {cut} bytes of a {used}-byte frame: {:?}",
                            resp::parse(&input[..cut])
                        ));
                    }
                }
                ctx.accepted += 1;
                let mut shape = String::new();
                frame_shape(frame, 0, &mut shape);
                sig("ok", &shape)
            }
            Err(ParseError::Incomplete) => {
                let cut = ctx.rng.below(input.len() + 1);
                if resp::parse(&input[..cut]) != Err(ParseError::Incomplete) {
                    return Err(format!(
                        "prefix of an incomplete frame (cut {cut}) is not incomplete"
                    ));
                }
                sig("incomplete", "")
            }
            Err(ParseError::Protocol(msg)) => {
                if msg.is_empty() {
                    return Err("protocol error without a message".into());
                }
                // Errors are final: no further bytes turn them into a frame.
                let mut more = input.to_vec();
                more.extend((0..ctx.rng.below(16)).map(|_| ctx.rng.next_u64() as u8));
                more.extend_from_slice(b"\r\n:1\r\n+OK\r\n");
                if !matches!(resp::parse(&more), Err(ParseError::Protocol(_))) {
                    return Err(format!(
                        "protocol error {msg:?} recovers when bytes are appended"
                    ));
                }
                err_sig("protocol", msg)
            }
        };
        let expected = ctx.rng.below(10);
        let reply = ctx.alloc("parse_pipeline_reply", input.len(), 64, 1024 * 1024, || {
            resp::parse_pipeline_reply(input, expected)
        })?;
        let reply_sig = match &reply {
            Ok(frames) => {
                if frames.len() != expected || frames.last() != Some(&Frame::Simple("OK".into())) {
                    return Err(format!(
                        "pipeline reply of {} frames for {expected}",
                        frames.len()
                    ));
                }
                sig("pipeline-ok", "")
            }
            Err(ReplyError::Truncated {
                complete,
                expected: e,
            }) => {
                if *e != expected || *complete >= expected {
                    return Err(format!("truncated {complete}/{e} for {expected} expected"));
                }
                sig("pipeline-truncated", "")
            }
            Err(ReplyError::Protocol(msg)) => err_sig("pipeline-protocol", msg),
        };
        Ok(signature ^ reply_sig.rotate_left(1))
    });
}

/// A rejection's signature, without the entity id it starts with.
fn rejected_sig(msg: &str) -> u64 {
    err_sig(
        "rejected",
        msg.split_once(": ").map_or(msg, |(_, rest)| rest),
    )
}

/// Splits "id\npayload".
fn split_id(input: &[u8]) -> (String, &[u8]) {
    match input.iter().position(|&b| b == b'\n') {
        Some(i) => (
            String::from_utf8_lossy(&input[..i]).into_owned(),
            &input[i + 1..],
        ),
        None => (String::new(), input),
    }
}

fn settings_for_sync() -> Rc<Settings> {
    Rc::new(
        Settings::from_json(
            br#"{"endpoints":["a:1","b:1","c:1"],"table_capacity_blocks":64,"table_idle_expiry_secs":1200}"#,
        )
        .unwrap(),
    )
}

fn view_of(store: &MemStore, s: &Settings, now: u32) -> SharedView {
    let m = fleet::static_members(store, &s.static_pools(), now, s.retire_secs()).unwrap();
    Rc::new(RefCell::new(FleetView::new(m)))
}

/// A start time: mostly now-ish, sometimes at the edges of u32 and u64.
fn start_secs(r: &mut SplitMix64) -> u64 {
    match r.below(8) {
        0 => 0,
        1 => u64::from(u32::MAX) - r.below(3000) as u64,
        2 => u64::from(u32::MAX) + r.below(3) as u64,
        3 => u64::MAX - r.below(3) as u64,
        _ => 1_700_000_000,
    }
}

/// Mostly a second or two, sometimes past retirement and idle expiry.
fn advance(r: &mut SplitMix64, now: &Cell<u64>, unit: u64) {
    let step = match r.below(64) {
        0 => 1_000 + r.below(5_000) as u64,
        1..=8 => 0,
        _ => r.below(3) as u64,
    };
    now.set(now.get().saturating_add(step * unit));
}

struct PrefixState {
    store: Rc<MemStore>,
    now: Rc<Cell<u64>>,
    sync: PrefixCacheSync<Rc<MemStore>>,
    fleet: SharedView,
    ignored: u64,
}

fn prefix_state(r: &mut SplitMix64) -> PrefixState {
    let store = Rc::new(MemStore::new());
    let s = settings_for_sync();
    let now = Rc::new(Cell::new(start_secs(r)));
    let fleet = view_of(&store, &s, u32::try_from(now.get()).unwrap_or(u32::MAX));
    let n = now.clone();
    let clock: Clock = Rc::new(move || n.get());
    let sync = PrefixCacheSync::new(store.clone(), s, fleet.clone(), clock, 256);
    PrefixState {
        store,
        now,
        sync,
        fleet,
        ignored: 0,
    }
}

#[test]
fn prefixcache_apply_remote_and_is_stale() {
    let spec = Spec {
        target: "prefixcache",
        dict: json_dict(&[
            "\"model_to_pods\":",
            "{\"m\":{\"a:1\":1}}",
            "\"a:1\":",
            "\"b:1\":",
            "\"zz:9\":",
            "\"llama\":",
            "\n",
            "77\n",
        ]),
        nest: JSON_NEST,
        grammar: prefixcache_input,
        json: Some(JsonShape {
            keys: &[
                "model_to_pods",
                "m",
                "llama",
                "a:1",
                "b:1",
                "c:1",
                "zz:9",
                "",
            ],
            strings: POD_NAMES,
            ids: Some(PREFIX_IDS),
        }),
    };
    let mut state: Option<PrefixState> = None;
    let mut count = 0u64;
    let cfg = settings_for_sync().table_config();
    fuzz(spec, |input, ctx| {
        // A fresh replica now and then (new clock edge), else state carries
        // over: the registry fills, times advance past retirement.
        if count % 500 == 0 || state.is_none() {
            state = Some(prefix_state(&mut ctx.rng));
        }
        count += 1;
        let st = state.as_mut().unwrap();
        advance(&mut ctx.rng, &st.now, 1);
        let now = u32::try_from(st.now.get()).unwrap_or(u32::MAX);
        let (id, payload) = split_id(input);
        let res = ctx.alloc("apply_remote", input.len(), 512, 4 * 1024 * 1024, || {
            st.sync.apply_remote(&id, payload)
        })?;
        let parsed = serde_json::from_slice::<BlockPayload>(payload);
        let want_ok = id.parse::<u64>().is_ok() && parsed.is_ok();
        if res.is_ok() != want_ok {
            return Err(format!(
                "apply_remote({id:?}) = {res:?}, expected ok={want_ok}"
            ));
        }
        let stale = ctx.alloc("is_stale", input.len(), 512, 64 * 1024, || {
            st.sync.is_stale(&id, payload)
        })?;
        if let Ok(p) = &parsed {
            // Stale only when every pod is a member here and past the idle
            // horizon: a key naming a pod this replica does not route to is
            // another writer's, and leaves by TTL (never erased).
            let horizon = st.now.get().saturating_sub(1200);
            let fleet = st.fleet.borrow();
            let want = p
                .model_to_pods
                .values()
                .flat_map(|pods| pods.iter())
                .all(|(pod, n)| n / 1_000_000_000 < horizon && fleet.slot_of(pod).is_some());
            drop(fleet);
            if stale != want {
                return Err(format!("is_stale = {stale}, want {want}"));
            }
        } else if stale {
            return Err("an unreadable payload is stale (would be deleted)".into());
        }
        // Remote facts: only members, never from the future, table bounded.
        let members: HashSet<PodSlot> = st.fleet.borrow().all().map(|(s, _, _)| s).collect();
        let records = PrefixTable::new(&*st.store, cfg).all_records(now).unwrap();
        if records.len() as u64 > cfg.capacity() {
            return Err(format!(
                "{} records in a table of {}",
                records.len(),
                cfg.capacity()
            ));
        }
        for rec in &records {
            if !members.contains(&rec.pod) || rec.last_access > now {
                return Err(format!("record {rec:?} (members {members:?}, now {now})"));
            }
        }
        let reg = NameRegistry::models(&*st.store).load().unwrap();
        let retire = settings_for_sync().retire_secs();
        let live = reg
            .slots
            .iter()
            .flatten()
            .filter(|s| now.saturating_sub(s.last_seen) <= retire)
            .count();
        if live > MAX_SLOTS / 2 || reg.slots.len() > MAX_SLOTS {
            return Err(format!(
                "remote models hold {live} live of {} slots",
                reg.slots.len()
            ));
        }
        let ignored = st.sync.facts_ignored();
        if ignored < st.ignored {
            return Err("facts_ignored went down".into());
        }
        st.ignored = ignored;
        // Shared data stays within its fixed key space.
        let bucket_bytes = cfg.buckets as usize * (1 + MAX_SLOTS_PER_BUCKET * RECORD_LEN);
        let reg_bytes = 2 * MAX_SLOTS * (5 + MAX_NAME);
        if st.store.key_count() > cfg.buckets as usize + 8
            || st.store.value_bytes() > bucket_bytes + reg_bytes + 4096
        {
            return Err(format!(
                "shared data grew to {} keys, {} bytes",
                st.store.key_count(),
                st.store.value_bytes()
            ));
        }
        // What we would push is what a peer can read back.
        if count % 128 == 0 {
            for (id, bytes) in st.sync.snapshot() {
                let p: BlockPayload = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("snapshot payload of {id} unreadable: {e}"))?;
                // Member pods, plus other writers' entries carried back:
                // named (1..=253 bytes), at most 32 per block.
                let fleet = st.fleet.borrow();
                let foreign: Vec<&String> = p
                    .model_to_pods
                    .values()
                    .flat_map(|m| m.keys())
                    .filter(|pod| fleet.slot_of(pod).is_none())
                    .collect();
                if id.parse::<u64>().is_err()
                    || foreign.len() > 32
                    || foreign.iter().any(|pod| pod.is_empty() || pod.len() > 253)
                {
                    return Err(format!("snapshot entry {id}: {p:?}"));
                }
            }
        }
        ctx.accepted += u64::from(res.is_ok());
        Ok(match &res {
            Ok(()) => sig(
                "ok",
                &format!(
                    "{stale} {} {}",
                    log2_bucket(records.len()),
                    doc_shape(payload, &["model_to_pods"])
                ),
            ),
            Err(e) => rejected_sig(&e.0),
        })
    });
}

#[test]
fn podload_apply_remote_and_is_stale() {
    let spec = Spec {
        target: "podload",
        dict: json_dict(&[
            "\"inflight\":",
            "\"at_ms\":",
            "\"a:1\":",
            "\"c:1\":",
            "r1\n",
            "r2\n",
        ]),
        nest: JSON_NEST,
        grammar: podload_input,
        json: Some(JsonShape {
            keys: &["inflight", "at_ms", "a:1", "b:1", "c:1", "gone:1"],
            strings: POD_NAMES,
            ids: Some(LOAD_IDS),
        }),
    };
    struct LoadState {
        store: Rc<MemStore>,
        now: Rc<Cell<u64>>,
        sync: PodLoadSync<Rc<MemStore>>,
        fleet: SharedView,
        reports: BTreeMap<String, LoadReport>,
    }
    let fresh = |r: &mut SplitMix64| {
        let store = Rc::new(MemStore::new());
        let s = settings_for_sync();
        let now = Rc::new(Cell::new(start_secs(r).saturating_mul(1000)));
        let fleet = view_of(&store, &s, 1_700_000_000);
        let n = now.clone();
        let clock: Clock = Rc::new(move || n.get());
        let sync = PodLoadSync::new(store.clone(), &s, fleet.clone(), "r1".into(), clock, 30_000);
        LoadState {
            store,
            now,
            sync,
            fleet,
            reports: BTreeMap::new(),
        }
    };
    let mut state: Option<LoadState> = None;
    let mut count = 0u64;
    fuzz(spec, |input, ctx| {
        if count % 500 == 0 || state.is_none() {
            let mut st = fresh(&mut ctx.rng);
            st.sync.on_sync_start();
            state = Some(st);
        }
        count += 1;
        let st = state.as_mut().unwrap();
        advance(&mut ctx.rng, &st.now, 1000);
        let (id, payload) = split_id(input);
        let res = ctx.alloc("apply_remote", input.len(), 256, 64 * 1024, || {
            st.sync.apply_remote(&id, payload)
        })?;
        let parsed = serde_json::from_slice::<LoadReport>(payload);
        let want_ok = id == "r1" || parsed.is_ok();
        if res.is_ok() != want_ok {
            return Err(format!(
                "apply_remote({id:?}) = {res:?}, expected ok={want_ok}"
            ));
        }
        let stale = ctx.alloc("is_stale", input.len(), 256, 64 * 1024, || {
            st.sync.is_stale(&id, payload)
        })?;
        let want_stale = id != "r1"
            && parsed
                .as_ref()
                .is_ok_and(|p| st.now.get().saturating_sub(p.at_ms) > 30_000);
        if stale != want_stale {
            return Err(format!("is_stale({id:?}) = {stale}, want {want_stale}"));
        }
        if let (Ok(report), false) = (parsed, id == "r1") {
            st.reports.insert(id.clone(), report);
        }
        // A pull ends: the fleet load is the sum of the others' reports for
        // pods that are members here (saturating), one count per slot.
        if count % 16 == 0 {
            st.sync.on_sync_end();
            let fleet = st.fleet.borrow();
            let mut want = vec![0u32; fleet.bound()];
            for report in st.reports.values() {
                let mut counts = vec![0u32; fleet.bound()];
                for (name, n) in &report.inflight {
                    if let Some(slot) = fleet.slot_of(name) {
                        counts[slot.index()] = *n;
                    }
                }
                for (w, c) in want.iter_mut().zip(counts) {
                    *w = w.saturating_add(c);
                }
            }
            let got = load::remote(&*st.store).unwrap();
            if got != want {
                return Err(format!("fleet load {got:?}, want {want:?}"));
            }
            drop(fleet);
            st.sync.on_sync_start();
            st.reports.clear();
        }
        ctx.accepted += u64::from(res.is_ok());
        Ok(match &res {
            Ok(()) => sig(
                "ok",
                &format!("{stale} {}", doc_shape(payload, &["inflight", "at_ms"])),
            ),
            Err(e) => rejected_sig(&e.0),
        })
    });
}

#[test]
fn clusters_admin_reply() {
    let spec = Spec {
        target: "clusters",
        dict: json_dict(&[
            "\"cluster_statuses\":",
            "\"name\":\"pods\"",
            "\"host_statuses\":",
            "\"address\":",
            "\"socket_address\":",
            "\"port_value\":",
            "\"hostname\":",
            "\"health_status\":",
            "\"eds_health_status\":\"UNHEALTHY\"",
            "\"failed_outlier_check\":true",
            "\"pipe\":",
        ]),
        nest: JSON_NEST,
        grammar: clusters_input,
        json: Some(JsonShape {
            keys: CLUSTER_KEYS,
            strings: &[
                "pods",
                "HEALTHY",
                "UNHEALTHY",
                "DRAINING",
                "TIMEOUT",
                "10.0.0.1",
                "::1",
                "pod-a",
                "",
            ],
            ids: None,
        }),
    };
    let mut hostname = false;
    fuzz(spec, |input, ctx| {
        hostname = !hostname;
        let naming = if hostname {
            PodNaming::Hostname
        } else {
            PodNaming::Address
        };
        let res = ctx.alloc("parse_clusters", input.len(), 256, 64 * 1024, || {
            parse_clusters(input, "pods", naming)
        })?;
        match res {
            Ok(hosts) => {
                if hosts.is_empty() || hosts.len() > MAX_HOSTS {
                    return Err(format!("{} hosts", hosts.len()));
                }
                if hosts.windows(2).any(|w| w[0].name >= w[1].name) {
                    return Err("hosts not sorted by name, or a name twice".into());
                }
                for h in &hosts {
                    let port = h
                        .address
                        .rsplit_once(':')
                        .and_then(|(_, p)| p.parse::<u16>().ok());
                    if !port.is_some_and(|p| p > 0) {
                        return Err(format!("address {:?} has no port", h.address));
                    }
                    if h.name != h.address && (h.name.is_empty() || h.name.len() > MAX_NAME) {
                        return Err(format!("name {:?}", h.name));
                    }
                }
                ctx.accepted += 1;
                let healthy = hosts.iter().filter(|h| h.healthy).count();
                Ok(sig(
                    "ok",
                    &format!(
                        "{} {} {}",
                        log2_bucket(hosts.len()),
                        log2_bucket(healthy),
                        doc_shape(input, CLUSTER_KEYS)
                    ),
                ))
            }
            Err(e) => Ok(rejected_sig(&e.to_string())),
        }
    });
}

#[test]
fn members_decode() {
    let spec = Spec {
        target: "members",
        dict: json_dict(&[
            "\"pools\":",
            "\"slot\":",
            "\"name\":",
            "\"address\":",
            "\"healthy\":",
            "\"\":[",
        ]),
        nest: JSON_NEST,
        grammar: members_input,
        json: Some(JsonShape {
            keys: &["pools", "slot", "name", "address", "healthy", "", "m"],
            strings: POD_NAMES,
            ids: None,
        }),
    };
    fuzz(spec, |input, ctx| {
        let decoded = ctx.alloc("Members::decode", input.len(), 256, 64 * 1024, || {
            Members::decode(input)
        })?;
        let Some(m) = decoded else {
            return Ok(sig("none", ""));
        };
        if Members::decode(&m.encode()).as_ref() != Some(&m) {
            return Err("members do not round-trip".into());
        }
        let view = ctx.alloc("FleetView::new", input.len(), 256, 64 * 1024, || {
            FleetView::new(m.clone())
        })?;
        let count = m.pools.values().map(Vec::len).sum::<usize>();
        for pool in m.pools.keys().chain([&"unknown".to_string()]) {
            let routable = view.routable(pool, 0);
            if routable.len() > count {
                return Err(format!("{} routable of {count}", routable.len()));
            }
        }
        if view.bound() > usize::from(u16::MAX) + 1 {
            return Err(format!("bound {}", view.bound()));
        }
        ctx.accepted += 1;
        let shape = doc_shape(input, &["pools", "slot", "name", "address", "healthy"]);
        Ok(sig("some", &format!("{} {shape}", log2_bucket(count))))
    });
}

/// `fleet::MAX_DOWN` (private): most pods in cooldown at once.
const MAX_DOWN: usize = 256;

#[test]
fn down_decode() {
    let spec = Spec {
        target: "down",
        dict: vec![
            b"\0\0",
            b"\xff\xff",
            b"\0\0\0\0\0\0\0\0",
            b"\xff\xff\xff\xff\xff\xff\xff\xff",
        ],
        nest: &[(b"\0\0\xff\xff\xff\xff\xff\xff\xff\xff", b"")],
        grammar: down_input,
        json: None,
    };
    fuzz(spec, |input, ctx| {
        let down = ctx.alloc("decode_down", input.len(), 4, 8 * 1024, || {
            fleet::decode_down(input)
        })?;
        if down.len() != (input.len() / 10).min(MAX_DOWN) {
            return Err(format!("{} entries from {} bytes", down.len(), input.len()));
        }
        for (i, (slot, until)) in down.iter().enumerate() {
            let c = &input[i * 10..i * 10 + 10];
            if c[..2] != slot.to_le_bytes() || c[2..] != until.to_le_bytes() {
                return Err(format!("entry {i} misread"));
            }
        }
        // As the workers use it: a stored list, one more pod marked down.
        let store = MemStore::new();
        store.set(fleet::DOWN_KEY, input, None).unwrap();
        let now = INTERESTING_INTS[ctx.rng.below(INTERESTING_INTS.len())];
        let slot = PodSlot::new(ctx.rng.next_u64() as u16);
        let written = fleet::mark_down(&store, slot, now.saturating_add(3000), now).unwrap();
        if written.len() > MAX_DOWN || written.last() != Some(&(slot, now.saturating_add(3000))) {
            return Err(format!("mark_down wrote {} entries", written.len()));
        }
        ctx.accepted += u64::from(!down.is_empty());
        Ok(sig(
            "ok",
            &format!("{} {}", log2_bucket(down.len()), input.len() % 10),
        ))
    });
}

#[test]
fn registry_decode() {
    let spec = Spec {
        target: "registry",
        dict: vec![
            b"\0\0\0\0\0",
            b"\0\0\0\0\x03pod",
            b"\xff\xff\xff\xff\xff",
            b"\0\0\0\0\x01",
        ],
        nest: &[(b"\0\0\0\0\x01a", b""), (b"\0\0\0\0\0", b"")],
        grammar: registry_input,
        json: None,
    };
    fuzz(spec, |input, ctx| {
        let mut reg = ctx.alloc("Registry::decode", input.len(), 64, 64 * 1024, || {
            Registry::decode(input)
        })?;
        if reg.slots.len() > MAX_SLOTS {
            return Err(format!("{} slots", reg.slots.len()));
        }
        for s in reg.slots.iter().flatten() {
            if s.name.is_empty() || s.name.len() > MAX_NAME {
                return Err(format!("slot name of {} bytes", s.name.len()));
            }
        }
        if Registry::decode(&reg.encode()) != reg {
            return Err("registry does not round-trip".into());
        }
        // Interning on top of whatever was stored stays within the slots.
        let names: Vec<String> = (0..ctx.rng.below(8))
            .map(|_| match ctx.rng.below(4) {
                0 => "x".repeat(ctx.rng.below(300)),
                _ => format!("pod-{}", ctx.rng.below(60)),
            })
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let now = INTERESTING_INTS[ctx.rng.below(INTERESTING_INTS.len())] as u32;
        let retire = [0u32, 1, 600, u32::MAX][ctx.rng.below(4)];
        let (slots, _) = reg.intern(&refs, now, retire);
        for (name, slot) in refs.iter().zip(&slots) {
            match slot {
                Some(s) if reg.name_of(*s) != Some(name) => {
                    return Err(format!("{name:?} got slot {s} named {:?}", reg.name_of(*s)));
                }
                None if !name.is_empty()
                    && name.len() <= MAX_NAME
                    && reg.slot_of(name).is_some() =>
                {
                    return Err(format!("{name:?} has a slot but intern said none"));
                }
                _ => {}
            }
        }
        if reg.slots.len() > MAX_SLOTS || reg.bound() > MAX_SLOTS {
            return Err(format!("{} slots after intern", reg.slots.len()));
        }
        ctx.accepted += u64::from(!reg.slots.is_empty());
        Ok(sig(
            "ok",
            &format!(
                "{} {}",
                log2_bucket(reg.slots.len()),
                slots.iter().flatten().count()
            ),
        ))
    });
}

#[test]
fn heartbeat_decode() {
    let spec = Spec {
        target: "heartbeat",
        dict: vec![b"\0\0\0\0\0\0\0\0", b"\xff\xff\xff\xff\xff\xff\xff\xff"],
        nest: &[(b"\0", b"")],
        grammar: heartbeat_input,
        json: None,
    };
    fuzz(spec, |input, ctx| {
        let hb = ctx.alloc("Heartbeat::decode", input.len(), 0, 1024, || {
            Heartbeat::decode(input)
        })?;
        if hb.is_some() != (input.len() == Heartbeat::LEN) {
            return Err(format!("decoded {} bytes: {hb:?}", input.len()));
        }
        let Some(hb) = hb else {
            return Ok(sig("none", ""));
        };
        if hb.encode()[..] != *input {
            return Err("heartbeat does not round-trip".into());
        }
        let now = INTERESTING_INTS[ctx.rng.below(INTERESTING_INTS.len())];
        let (age, tick) = (hb.success_age_s(now), hb.tick_age_s(now));
        if age > now / 1000 || tick > now / 1000 {
            return Err(format!("ages {age}/{tick} s at {now} ms"));
        }
        ctx.accepted += 1;
        Ok(sig("some", &format!("{}", hb.singleton_dead(now))))
    });
}

fn metrics_input(r: &mut SplitMix64) -> Vec<u8> {
    const NAMES: [&str; 8] = [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "other_metric",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:inter_token_latency_seconds_sum",
        "vllm:inter_token_latency_seconds_count",
    ];
    const VALUES: [&str; 9] = ["0", "1", "3.0", "0.5", "-1", "NaN", "+Inf", "1e300", "x"];
    const LABELS: [&str; 5] = [
        "{model_name=\"m\",q=\"}\\\"\"}",
        "{le=\"0.01\"}",
        "{model_name=\"n\",le=\"+Inf\"}",
        "{handle=\"le\", le = \"1e300\",}",
        "{le=\"-1\",le=\"x}",
    ];
    let mut out = String::new();
    for _ in 0..r.below(12) {
        match r.below(5) {
            0 => out.push_str("# TYPE x gauge"),
            _ => {
                out.push_str(NAMES[r.below(NAMES.len())]);
                if r.below(2) == 0 {
                    out.push_str(LABELS[r.below(LABELS.len())]);
                }
                out.push(' ');
                out.push_str(VALUES[r.below(VALUES.len())]);
            }
        }
        out.push_str(if r.below(4) == 0 { "\r\n" } else { "\n" });
    }
    out.into_bytes()
}

/// Pods' `/metrics` pages and the published signals value: no panic,
/// allocation bounded by the input, every accepted value in range (a
/// scraper fed the page three times publishes a time per output token of at most
/// a minute), and a published value decodes to one record per
/// [`signals::RECORD`] bytes, at most 1,024.
#[test]
fn signals_parse_and_decode() {
    let spec = Spec {
        target: "signals",
        dict: vec![
            b"vllm:num_requests_waiting",
            b"vllm:num_requests_running",
            b"vllm:kv_cache_usage_perc",
            b"vllm:inter_token_latency_seconds",
            b"_bucket{le=\"",
            b"_sum",
            b"_count",
            b"{",
            b"}",
            b"\"",
            b"\n",
            b" NaN",
            b" 1e9",
            b"v1 1000\n",
            b"10.0.0.1:8000 5 1 2 300\n",
        ],
        nest: &[(b"{a=\"", b"\"}")],
        grammar: metrics_input,
        json: None,
    };
    let names = MetricNames::default();
    fuzz(spec, |input, ctx| {
        let parsed = ctx.alloc("signals::parse", input.len(), 0, 1024, || {
            signals::parse(input, &names)
        })?;
        let records = ctx.alloc("signals::decode", input.len(), 2, 1024, || {
            signals::decode(input)
        })?;
        if records.len() != (input.len() / signals::RECORD).min(MAX_SLOTS) {
            return Err(format!(
                "{} records from {} bytes",
                records.len(),
                input.len()
            ));
        }
        // The same bytes as another replica's shared value (`signals.share`).
        let shared = ctx.alloc("share::decode", input.len(), 16, 1024, || {
            signals::share::decode(input)
        })?;
        if let Some((_, recs)) = &shared {
            let bad = recs.iter().any(|r| {
                f64::from(r.signals.waiting) > signals::MAX_REQUESTS
                    || f64::from(r.signals.running) > signals::MAX_REQUESTS
                    || r.pod.is_empty()
                    || r.pod.contains([' ', '\n'])
            });
            if bad || recs.len() > signals::share::MAX_PODS {
                return Err(format!("shared value out of range: {recs:?}"));
            }
        }
        // The page as a pod's replies: whole, its second half, whole again
        // (spans with and without tokens, counts that fall and rise).
        let mut scraper = signals::Scraper::new(1, names.clone());
        let target = signals::Target {
            slot: PodSlot::new(0),
            address: "10.0.0.1:8000".into(),
            cluster: "pods".into(),
        };
        for (at, page) in [input, &input[input.len() / 2..], input]
            .into_iter()
            .enumerate()
        {
            let at = at as u64;
            scraper.due(at, std::slice::from_ref(&target));
            scraper.on_reply(target.slot, Ok(page), at);
        }
        let token_us = scraper.own().find_map(|r| r.signals.token_us);
        if token_us.is_some_and(|us| us > 60_000_000) {
            return Err(format!("time per output token out of range: {token_us:?}"));
        }
        let view = SignalView::from_published(input, u64::MAX, u64::MAX);
        if records.iter().any(|r| view.get(r.slot).is_none()) {
            return Err("a decoded record is not in the view".into());
        }
        match parsed {
            Ok(s) => {
                if f64::from(s.waiting) > signals::MAX_REQUESTS
                    || f64::from(s.running) > signals::MAX_REQUESTS
                {
                    return Err(format!("out of range: {s:?}"));
                }
                ctx.accepted += 1;
                Ok(sig("ok", &format!("{}", s.waiting > 0)))
            }
            Err(e) => Ok(sig("err", &e.to_string())),
        }
    });
}

/// A claim record as the follower reads it, from a placement's reply or any
/// string: what it shares is within its own prompt and the record's.
fn check_claim_record(record: &str, hashes: &[u64]) -> Result<u64, String> {
    match shared_with_claim(record, hashes) {
        Some((shared, total)) => {
            if shared == 0 || shared > total || shared > hashes.len() {
                return Err(format!("shared {shared} of {total} from {record:?}"));
            }
            Ok(sig("shares", &format!("{}", shared == total)))
        }
        None => Ok(sig("no-share", "")),
    }
}

#[test]
fn place_reply_and_claim_record() {
    let spec = Spec {
        target: "place",
        dict: vec![
            b"+OK\r\n",
            b"*1\r\n",
            b"*3\r\n",
            b"$3\r\na:1\r\n",
            b"$3\r\nzz:9\r\n",
            b":-1\r\n",
            b":0\r\n",
            b":9223372036854775807\r\n",
            b"-NOPERM x\r\n",
            b"$-1\r\n",
            b"31:407",
            b"199:4af",
            b",",
            b":",
            b"4294967295:",
            b"18446744073709551615:",
            b"ffffffffffffffff",
        ],
        nest: &[(b"*1\r\n", b""), (b"*3\r\n", b":0\r\n$0\r\n\r\n")],
        grammar: place_reply,
        json: None,
    };
    let candidates = place_candidates();
    let hashes = place_hashes();
    fuzz(spec, |input, ctx| {
        let mut signature = 0u64;
        // Read as the reply of a pipeline without AUTH (2 frames) and with.
        for expected in [2, 3] {
            let res = ctx.alloc("place::chosen", input.len(), 64, 1024 * 1024, || {
                place::chosen(input, expected, &candidates)
            })?;
            let s = match res {
                Ok((index, followed)) => {
                    if index >= candidates.len() {
                        return Err(format!("candidate {index} of {}", candidates.len()));
                    }
                    ctx.accepted += 1;
                    match followed {
                        Some(f) => {
                            if f.record.is_empty() || f.record.len() > MAX_RECORD_BYTES {
                                return Err(format!("followed record of {} bytes", f.record.len()));
                            }
                            check_claim_record(&f.record, &hashes)?.rotate_left(3)
                        }
                        None => sig("placed", ""),
                    }
                }
                Err(PlaceError::Refused(e)) => {
                    if e.chars().count() > place::REFUSAL_CHARS {
                        return Err(format!("refusal of {} chars kept", e.chars().count()));
                    }
                    sig("refused", "")
                }
                Err(e) => sig("error", &format!("{e:?}")),
            };
            signature ^= s.rotate_left(expected as u32);
        }
        // The bytes as a record themselves: whatever a hostile Redis holds.
        if let Ok(text) = std::str::from_utf8(input) {
            signature ^= check_claim_record(text, &hashes)?.rotate_left(7);
        }
        Ok(signature)
    });
}

/// A node address as the cluster code keeps it, the form Envoy's
/// `ORIGINAL_DST` header takes: a host, then `:` and a non-zero port, a host
/// with a `:` (IPv6) in brackets.
fn is_node_address(node: &str) -> bool {
    matches!(node.rsplit_once(':'), Some((host, port))
        if !host.is_empty()
            && port.parse::<u16>().is_ok_and(|p| p > 0)
            && (!host.contains(':') || (host.starts_with('[') && host.ends_with(']'))))
}

#[test]
fn cluster_slots_and_redirects() {
    let spec = Spec {
        target: "cluster",
        dict: vec![
            b"*1\r\n",
            b"*3\r\n",
            b"*4\r\n",
            b":0\r\n",
            b":16383\r\n",
            b":16384\r\n",
            b":-1\r\n",
            b":7000\r\n",
            b":65536\r\n",
            b"$8\r\n10.0.0.1\r\n",
            b"$0\r\n\r\n",
            b"$1\r\n?\r\n",
            b"-MOVED 3999 10.0.0.2:7001\r\n",
            b"-ASK 3999 10.0.0.2:7001\r\n",
            b"-MOVED 3999 fd00::2:7001\r\n",
            b"$7\r\nfd00::2\r\n",
            b"-TRYAGAIN\r\n",
        ],
        nest: &[(b"*1\r\n", b""), (b"*4\r\n:0\r\n:1\r\n", b"*0\r\n")],
        grammar: cluster_reply,
        json: None,
    };
    const SLOTS: u16 = 16_384;
    fuzz(spec, |input, ctx| {
        let Ok((frame, _)) = resp::parse(input) else {
            return Ok(sig("not-a-frame", ""));
        };
        let map = ctx.alloc("SlotMap::parse", input.len(), 64, 64 * 1024, || {
            SlotMap::parse(&frame, Some("10.0.0.9:7000"))
        })?;
        let mut signature = match map {
            Some(mut map) => {
                ctx.accepted += 1;
                let nodes: Vec<String> = map.nodes().iter().map(|n| n.to_string()).collect();
                if nodes.is_empty() || !nodes.iter().all(|n| is_node_address(n)) {
                    return Err(format!("nodes {nodes:?}"));
                }
                let slots: Vec<u16> = (0..8)
                    .map(|_| ctx.rng.below(usize::from(SLOTS)) as u16)
                    .chain([0, SLOTS - 1])
                    .collect();
                let before: Vec<Option<String>> = slots
                    .iter()
                    .map(|&s| map.owner(s).map(str::to_string))
                    .collect();
                if before.iter().flatten().any(|o| !nodes.contains(o)) {
                    return Err(format!("an owner among {before:?} is not one of {nodes:?}"));
                }
                // A MOVED patch moves that slot and no other.
                let moved = slots[ctx.rng.below(slots.len())];
                map.set_owner(moved, "10.0.0.8:7008");
                for (&s, was) in slots.iter().zip(&before) {
                    let now = map.owner(s);
                    let want = if s == moved {
                        Some("10.0.0.8:7008")
                    } else {
                        was.as_deref()
                    };
                    if now != want {
                        return Err(format!(
                            "slot {s}: {now:?} after moving {moved}, want {want:?}"
                        ));
                    }
                }
                sig("slots", &format!("{}", nodes.len().min(4)))
            }
            None => sig("no-map", ""),
        };
        signature ^= match redirect(&frame) {
            Some(Redirect::Moved { slot, node }) => {
                if slot >= SLOTS || !is_node_address(&node) {
                    return Err(format!("MOVED {slot} {node:?}"));
                }
                sig("moved", "")
            }
            Some(Redirect::Ask { node }) => {
                if !is_node_address(&node) {
                    return Err(format!("ASK {node:?}"));
                }
                sig("ask", "")
            }
            Some(Redirect::TryAgain) => sig("tryagain", ""),
            None => sig("no-redirect", ""),
        }
        .rotate_left(1);
        Ok(signature)
    });
}

#[test]
fn handoff_decode() {
    let spec = Spec {
        target: "handoff",
        dict: vec![b"\0\0\0\0\0\0\0\0", b"\xff\xff\xff\xff\xff\xff\xff\xff"],
        nest: &[(b"\x01\0\0\0\0\0\0\0", b"")],
        grammar: handoff_input,
        json: None,
    };
    let mut dirty = DirtySet::new(64);
    fuzz(spec, |input, ctx| {
        let t = ctx.alloc("handoff::decode", input.len(), 4, 1024, || {
            handoff::decode(input)
        })?;
        let Some(t) = t else {
            if input.len() >= 8 {
                return Err(format!("{} bytes not decoded", input.len()));
            }
            return Ok(sig("none", ""));
        };
        let whole = 8 + 12 * ((input.len() - 8) / 12);
        if t.blocks.len() != (input.len() - 8) / 12 || handoff::encode(&t) != input[..whole] {
            return Err(format!(
                "{} blocks from {} bytes",
                t.blocks.len(),
                input.len()
            ));
        }
        for &(b, a) in &t.blocks {
            dirty.mark(b, a);
        }
        if dirty.len() > 64 {
            return Err(format!("dirty set holds {}", dirty.len()));
        }
        if ctx.rng.below(8) == 0 {
            let all: Vec<u64> = dirty.blocks().map(|(b, _)| b).collect();
            dirty.clear(&all);
        }
        ctx.accepted += 1;
        Ok(sig("some", &format!("{}", log2_bucket(t.blocks.len()))))
    });
}

#[test]
fn config_from_json() {
    let mut extra: Vec<&'static str> = vec!["\"sync\":{\"enabled\":true}", "\"membership\":{}"];
    extra.extend(CONFIG_KEYS.iter().copied());
    let spec = Spec {
        target: "config",
        dict: json_dict(&extra),
        nest: JSON_NEST,
        grammar: config_input,
        json: Some(JsonShape {
            keys: CONFIG_KEYS,
            strings: CONFIG_STRINGS,
            ids: None,
        }),
    };
    fuzz(spec, |input, ctx| {
        let res = ctx.alloc("Settings::from_json", input.len(), 512, 256 * 1024, || {
            Settings::from_json(input)
        })?;
        match res {
            Ok(s) => {
                if s.block_size == 0 || s.pools.is_empty() {
                    return Err(format!("accepted {s:?}"));
                }
                let pools = s.static_pools();
                let endpoints: HashSet<&String> = pools.values().flatten().collect();
                let _ = s.retire_secs();
                let _ = s.cluster_pools();
                if endpoints.len() > MAX_SLOTS {
                    return Err(format!("{} endpoints accepted", endpoints.len()));
                }
                ctx.accepted += 1;
                Ok(sig("ok", &doc_shape(input, CONFIG_KEYS)))
            }
            Err(e) => {
                // The error names a field: a known one, or the key in the
                // input it refuses (unknown fields). Only input that is not
                // a JSON object at all has no field to name.
                let object =
                    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(input)
                        .ok();
                let first = e.field.split('.').next().unwrap_or("");
                let named = CONFIG_FIELDS.contains(&first)
                    || object.as_ref().is_some_and(|o| o.contains_key(&e.field));
                // A key given twice (at any depth) is named from serde's
                // message: the key serde refused (as decoded: it may hold
                // escaped characters).
                let in_input = !e.field.is_empty() && e.reason.contains(&format!("`{}`", e.field));
                let ok = match (&object, e.field.as_str()) {
                    (None, "<root>") => true,
                    (Some(_), "<root>") => false,
                    _ => named || in_input,
                };
                if !ok || e.reason.is_empty() {
                    return Err(format!("error names no field: {e}"));
                }
                Ok(err_sig(&e.field, &e.reason))
            }
        }
    });
}

/// The seed inputs of a text target (saved failures, `.bin`, may be anything).
fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let mut files = load_corpus(target);
    files.retain(|(name, _)| !name.ends_with(".bin"));
    files
}

/// Every seed file of the structured targets is a valid input (or, named
/// `bad_*`, a refused one), so the mutations start from something real.
#[test]
fn corpus_inputs_are_valid() {
    for (name, bytes) in seeds("resp") {
        let mut pos = 0;
        let mut n = 0;
        while pos < bytes.len() {
            let (_, used) = resp::parse(&bytes[pos..]).unwrap_or_else(|e| panic!("{name}: {e}"));
            pos += used;
            n += 1;
        }
        assert!(resp::parse_pipeline_reply(&bytes, n).is_ok(), "{name}");
    }
    for (target, kind) in [
        ("parse_body_completions", ApiKind::Completions),
        ("parse_body_chat", ApiKind::ChatCompletions),
    ] {
        for (name, bytes) in seeds(target) {
            assert!(parse_body(kind, &bytes).is_ok(), "{target}/{name}");
        }
    }
    for (name, bytes) in seeds("prefixcache") {
        let (id, payload) = split_id(&bytes);
        assert!(id.parse::<u64>().is_ok(), "{name}");
        serde_json::from_slice::<BlockPayload>(payload).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for (name, bytes) in seeds("podload") {
        serde_json::from_slice::<LoadReport>(split_id(&bytes).1)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for (name, bytes) in seeds("members") {
        assert!(Members::decode(&bytes).is_some(), "{name}");
    }
    for (name, bytes) in seeds("config") {
        let res = Settings::from_json(&bytes);
        assert_eq!(res.is_err(), name.starts_with("bad_"), "{name}: {res:?}");
    }
    let candidates = place_candidates();
    for (name, bytes) in seeds("place") {
        let expected = if bytes.starts_with(b"+OK") { 3 } else { 2 };
        let res = place::chosen(&bytes, expected, &candidates);
        assert_eq!(res.is_err(), name.starts_with("bad_"), "{name}: {res:?}");
    }
    for (name, bytes) in seeds("cluster") {
        let (frame, _) = resp::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let read =
            SlotMap::parse(&frame, Some("10.0.0.9:7000")).is_some() || redirect(&frame).is_some();
        assert!(read, "{name}");
    }
    for (name, bytes) in seeds("clusters") {
        let res = parse_clusters(&bytes, "pods", PodNaming::Hostname);
        assert_eq!(res.is_err(), name.starts_with("empty"), "{name}: {res:?}");
    }
}
