//! Learning how long the pods keep a prefix (`feedback.cached_tokens`).
//!
//! The table only learns that a pod holds a prefix; it never learns that the
//! pod evicted it. An OpenAI-compatible server says in every answer how much
//! of the prompt it found cached: `usage.prompt_tokens_details.cached_tokens`
//! (vLLM, SGLang, podsim; in a streamed answer, in the final usage chunk when
//! the request asked for `stream_options.include_usage`).
//!
//! For a request routed on a predicted match of `M` blocks on pod `P`, whose
//! prefix was last sent to `P` `a` seconds before (the match's age, see
//! `PodMatch::newest_access`), the filter scans the answer's body chunks as
//! they pass (no buffering, never pausing) with [`UsageScanner`], converts
//! the cached tokens to prompt bytes with the same answer's `prompt_tokens`
//! and the prompt's byte length ([`learned_blocks`]), and counts one
//! observation for `P`: held at age `a`, or evicted at age `a` when the pod
//! cached clearly less than predicted ([`clearly_less`]). [`TrustLearner`]
//! turns a pod's observations into its *trust horizon*: the age that best
//! splits its held matches (younger) from its evicted ones (older). The
//! load-aware policy gives a match that old no queue credit (the learned
//! horizon is when a match on the pod stops buying queueing). The table itself
//! is not changed: the answer reports what `P` held *before* the request,
//! and `P` has just cached the whole prompt again, so the records are true
//! once more. Unmatched requests, matches younger than [`MIN_HORIZON_SECS`]
//! (they could not move a horizon), the AIBrix policy and the setting off
//! read no answer at all.
//!
//! This module reads the answers; [`trust`] learns from what they say and
//! shares it between worker VMs and replicas.

pub(crate) mod trust;

pub(crate) use trust::{TrustLearner, MIN_HORIZON_SECS};

use crate::shared::registry::PodSlot;

/// Most body chunks read per answer (one hostcall each); past it the answer
/// is not checked. A non-streamed answer is one or two chunks; a streamed
/// one is a chunk per token or so.
pub(crate) const MAX_CHUNK_READS: u32 = 1024;
/// Most answer bytes scanned per answer.
pub(crate) const MAX_SCAN_BYTES: usize = 8 * 1024 * 1024;
/// The pod must have cached at least this many blocks fewer than predicted...
pub(crate) const MARGIN_MIN_BLOCKS: u32 = 2;
/// ...and less than this fraction (numerator / denominator) of the
/// prediction: tokens become bytes at the answer's average bytes per token,
/// the pod's template adds tokens the filter does not hash, and the pod
/// counts whole blocks of its own (16 tokens in vLLM), so a small shortfall
/// is noise, not an eviction.
pub(crate) const MARGIN_FRACTION: (u64, u64) = (3, 4);

/// What to check in one answer: the prediction the request was routed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) pod: PodSlot,
    /// Blocks the table said the pod holds (`M > 0`).
    pub(crate) predicted: u32,
    /// Bytes of the prompt as hashed.
    pub(crate) prompt_bytes: usize,
    /// Whole seconds since the prefix was last sent to the pod, when the
    /// request was routed (the match's age).
    pub(crate) age_secs: u32,
}

/// Whole blocks of `block_size` bytes the pod held, from its answer:
/// `cached_tokens` of `prompt_tokens` at the prompt's bytes per token. None
/// for values no honest server sends (no prompt tokens, more cached than
/// prompt tokens).
pub fn learned_blocks(
    cached_tokens: u64,
    prompt_tokens: u64,
    prompt_bytes: usize,
    block_size: usize,
) -> Option<u32> {
    if prompt_tokens == 0 || cached_tokens > prompt_tokens || block_size == 0 {
        return None;
    }
    let bytes = u128::from(cached_tokens) * prompt_bytes as u128 / u128::from(prompt_tokens);
    let blocks = bytes / block_size as u128;
    Some(u32::try_from(blocks).unwrap_or(u32::MAX))
}

/// Whether `learned` blocks is clearly less than the `predicted` match (see
/// [`MARGIN_MIN_BLOCKS`] and [`MARGIN_FRACTION`]).
pub(crate) fn clearly_less(learned: u32, predicted: u32) -> bool {
    let (num, den) = MARGIN_FRACTION;
    learned.saturating_add(MARGIN_MIN_BLOCKS) <= predicted
        && u64::from(learned) * den < u64::from(predicted) * num
}

/// Whether a request asks for a streamed answer without a usage chunk
/// (`stream`, as the body parser read `"stream": true`, and no
/// `"include_usage": true` in `body`): such an answer carries no
/// `cached_tokens`, so it is not read at all. Only a streamed request's body
/// is scanned.
pub fn streams_without_usage(stream: bool, body: &[u8]) -> bool {
    stream && !key_is_true(body, b"\"include_usage\"")
}

/// Whether some occurrence of `key` (with its quotes) is followed by `:` and
/// `true`. A quote inside a JSON string is escaped (`\"`), so a prompt
/// cannot fake a key.
fn key_is_true(body: &[u8], key: &[u8]) -> bool {
    let mut from = 0;
    while let Some(at) = find(&body[from..], key) {
        let mut rest = &body[from + at + key.len()..];
        rest = skip_ws(rest);
        if let Some(r) = rest.strip_prefix(b":") {
            if skip_ws(r).starts_with(b"true") {
                return true;
            }
        }
        from += at + 1;
    }
    false
}

fn skip_ws(mut b: &[u8]) -> &[u8] {
    while let Some((c, rest)) = b.split_first() {
        if !c.is_ascii_whitespace() {
            break;
        }
        b = rest;
    }
    b
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let last_start = hay.len().checked_sub(needle.len())?;
    let mut from = 0;
    while from <= last_start {
        // Jump to the next candidate first byte (a quote: rare in a prompt).
        let at = from + hay[from..=last_start].iter().position(|&b| b == first)?;
        if hay.get(at + 1..at + needle.len()) == Some(rest) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

const PROMPT_KEY: &[u8] = b"\"prompt_tokens\"";
const CACHED_KEY: &[u8] = b"\"cached_tokens\"";
/// Digits of a value at most (a longer number is not a token count).
const MAX_DIGITS: u8 = 19;

/// Where one key's match stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// This many bytes of the key (with its quotes) matched.
    Key(usize),
    /// After the key: whitespace, then `:`.
    Colon,
    /// After the colon: whitespace, then the first digit.
    Value,
    /// Digits so far: the value and how many.
    Digits(u64, u8),
}

/// One key's incremental matcher.
#[derive(Debug, Clone, Copy)]
struct KeyMatch {
    key: &'static [u8],
    phase: Phase,
    value: Option<u64>,
}

impl KeyMatch {
    const fn new(key: &'static [u8]) -> Self {
        Self {
            key,
            phase: Phase::Key(0),
            value: None,
        }
    }

    /// Restarts the key match at byte `b` (a key starts with a quote and
    /// holds no other before its last byte).
    fn restart(&mut self, b: u8) {
        self.phase = Phase::Key(usize::from(self.key.first() == Some(&b)));
    }

    fn feed(&mut self, b: u8) {
        match self.phase {
            Phase::Key(n) => {
                if self.key.get(n) == Some(&b) {
                    self.phase = if n + 1 == self.key.len() {
                        Phase::Colon
                    } else {
                        Phase::Key(n + 1)
                    };
                } else {
                    self.restart(b);
                }
            }
            Phase::Colon => match b {
                b':' => self.phase = Phase::Value,
                _ if b.is_ascii_whitespace() => {}
                _ => self.restart(b),
            },
            Phase::Value => match b {
                b'0'..=b'9' => self.phase = Phase::Digits(u64::from(b - b'0'), 1),
                _ if b.is_ascii_whitespace() => {}
                _ => self.restart(b),
            },
            Phase::Digits(v, n) => match b {
                b'0'..=b'9' => {
                    let next = v
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(u64::from(b - b'0')));
                    self.phase = match next {
                        Some(v) if n < MAX_DIGITS => Phase::Digits(v, n + 1),
                        // Too long to be a token count: not a value.
                        _ => Phase::Key(0),
                    };
                }
                b',' | b'}' | b']' => {
                    if self.value.is_none() {
                        self.value = Some(v);
                    }
                    self.restart(b);
                }
                _ if b.is_ascii_whitespace() => {
                    if self.value.is_none() {
                        self.value = Some(v);
                    }
                    self.restart(b);
                }
                // `1.5`, `1e9`, `12abc`: not a token count.
                _ => self.restart(b),
            },
        }
    }
}

/// Finds `"prompt_tokens":N` and `"cached_tokens":N` in an answer fed in
/// chunks of any size (a key or value may straddle chunks). The first
/// complete occurrence of each counts; anything but a plain non-negative
/// integer of at most 19 digits is no value. A quote inside a JSON string is
/// escaped, so generated text cannot fake a key.
#[derive(Debug, Clone, Copy)]
pub struct UsageScanner {
    prompt: KeyMatch,
    cached: KeyMatch,
}

impl Default for UsageScanner {
    fn default() -> Self {
        Self {
            prompt: KeyMatch::new(PROMPT_KEY),
            cached: KeyMatch::new(CACHED_KEY),
        }
    }
}

impl UsageScanner {
    /// Scans one more chunk; stops early once both values are known.
    pub fn feed(&mut self, chunk: &[u8]) {
        for &b in chunk {
            if self.found().is_some() {
                return;
            }
            self.prompt.feed(b);
            self.cached.feed(b);
        }
    }

    /// (prompt tokens, cached tokens) once both were seen.
    pub fn found(&self) -> Option<(u64, u64)> {
        Some((self.prompt.value?, self.cached.value?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn scan(chunks: &[&[u8]]) -> Option<(u64, u64)> {
        let mut s = UsageScanner::default();
        for c in chunks {
            s.feed(c);
        }
        s.found()
    }

    const ANSWER: &[u8] = br#"{"id":"x","choices":[{"text":"say \"cached_tokens\":9999 now"}],"usage":{"prompt_tokens":1200,"completion_tokens":4,"total_tokens":1204,"prompt_tokens_details":{"cached_tokens":512}}}"#;

    #[test]
    fn finds_both_values_in_a_whole_answer() {
        assert_eq!(scan(&[ANSWER]), Some((1200, 512)));
    }

    #[test]
    fn a_value_straddling_any_chunk_boundary_is_found() {
        for cut in 0..=ANSWER.len() {
            let (a, b) = ANSWER.split_at(cut);
            assert_eq!(scan(&[a, b]), Some((1200, 512)), "cut at {cut}");
        }
        // One byte at a time.
        let bytes: Vec<&[u8]> = ANSWER.chunks(1).collect();
        assert_eq!(scan(&bytes), Some((1200, 512)));
    }

    #[test]
    fn streamed_usage_chunk_and_whitespace() {
        let sse = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\": {\"prompt_tokens\" : 30 ,\"prompt_tokens_details\": {\"cached_tokens\" :\n16}}}\n\ndata: [DONE]\n\n";
        assert_eq!(scan(&[sse]), Some((30, 16)));
    }

    #[test]
    fn hostile_values_are_no_values() {
        for bad in [
            &br#"{"prompt_tokens":-5,"cached_tokens":3}"#[..],
            br#"{"prompt_tokens":"5","cached_tokens":3}"#,
            br#"{"prompt_tokens":1.5,"cached_tokens":3}"#,
            br#"{"prompt_tokens":1e9,"cached_tokens":3}"#,
            br#"{"prompt_tokens":null,"cached_tokens":3}"#,
            br#"{"prompt_tokens":99999999999999999999999,"cached_tokens":3}"#,
            br#"{"prompt_tokens":12abc,"cached_tokens":3}"#,
            br#"{"prompt_tokens":12"#,
            br#"{"x":"\"prompt_tokens\":5,\"cached_tokens\":3"}"#,
            br#"{"prompt_tokens_details":{"cached_tokens":3}}"#,
            b"",
        ] {
            assert_eq!(scan(&[bad]), None, "{}", String::from_utf8_lossy(bad));
        }
        // Random bytes never panic.
        let mut rng = crate::rng::SplitMix64::new(11);
        for _ in 0..2000 {
            let mut b = ANSWER.to_vec();
            for _ in 0..4 {
                let i = rng.below(b.len());
                b[i] = rng.next_u64() as u8;
            }
            let _ = scan(&[&b]);
        }
    }

    #[test]
    fn tokens_become_blocks_at_the_prompts_bytes_per_token() {
        // 4 bytes per token, 128-byte blocks: 512 tokens = 2048 bytes = 16.
        assert_eq!(learned_blocks(512, 1200, 4800, 128), Some(16));
        assert_eq!(learned_blocks(0, 1200, 4800, 128), Some(0));
        assert_eq!(learned_blocks(1200, 1200, 4800, 128), Some(37));
        assert_eq!(learned_blocks(1, 0, 4800, 128), None);
        assert_eq!(learned_blocks(1201, 1200, 4800, 128), None);
        assert_eq!(
            learned_blocks(u64::MAX, u64::MAX, usize::MAX, 1),
            Some(u32::MAX)
        );
    }

    #[test]
    fn only_a_clear_shortfall_counts() {
        assert!(clearly_less(0, 2));
        assert!(!clearly_less(0, 1));
        assert!(clearly_less(10, 32));
        assert!(!clearly_less(24, 32), "3/4 of the prediction is noise");
        assert!(clearly_less(23, 32));
        assert!(!clearly_less(40, 32));
        assert!(!clearly_less(u32::MAX, u32::MAX));
    }

    #[test]
    fn streams_without_a_usage_chunk_are_not_read() {
        // `stream` is what the body parser read; only `include_usage` is scanned.
        assert!(streams_without_usage(true, br#"{"stream": true,"x":1}"#));
        assert!(!streams_without_usage(false, br#"{"stream":false}"#));
        assert!(!streams_without_usage(
            true,
            br#"{"stream":true,"stream_options":{"include_usage":true}}"#
        ));
        assert!(streams_without_usage(
            true,
            br#"{"stream":true,"stream_options":{"include_usage": false}}"#
        ));
        // A prompt cannot fake the key: its quotes are escaped.
        assert!(streams_without_usage(
            true,
            br#"{"prompt":"\"include_usage\":true","stream":true}"#
        ));
        assert!(!streams_without_usage(false, b""));
    }
}
