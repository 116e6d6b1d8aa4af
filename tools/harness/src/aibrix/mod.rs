//! An independent AIBrix oracle for the integration tests and prefix-bench:
//! what an AIBrix Go gateway (`vllm-project/aibrix`) hashes, writes to and
//! reads from Redis, written from AIBrix's Go source and not from the
//! filter's crate (nothing here calls its request parsing, hashing or sync
//! code). The XXH64 is
//! `twox-hash`, not the `xxhash-rust` the filter uses, so the hash is not
//! checked against itself.
//!
//! Sources (AIBrix repository paths, functions):
//! - text of a chat request: `pkg/plugins/gateway/util.go` `parseChatMessages`
//!   (contents joined by one space; a string content unquoted, any other
//!   content as its raw JSON bytes) and `validateChatRequest`, which sets the
//!   prefix-match text to `combinePrefixText(message, systemText,
//!   canonicalToolsText(tools))`; `systemText` is only for `/v1/messages`.
//!   `canonicalToolsText` / `combinePrefixText` / `canonicalJSON` are in the
//!   gateway package's prefix-text file (env `AIBRIX_PREFIX_CACHE_INCLUDE_TOOLS`,
//!   default true); `pkg/types` `RoutingContext.PrefixText` picks that text
//!   when it is not empty, else the messages text.
//! - text of a completions request: `util.go` `validateCompletionRequest`
//!   (`Prompt string`: any other shape fails the unmarshal, a 400).
//! - tokens: `pkg/utils/tokenizer/local_characters.go` (the default
//!   "character" tokenizer: the text's UTF-8 bytes).
//! - block hashes: `pkg/utils/prefixcacheindexer/hash.go` `getPrefixHashes`
//!   (block size `AIBRIX_PREFIX_CACHE_BLOCK_SIZE`, default 4; an incomplete
//!   last block is not hashed; parent starts as the seed;
//!   `h = XXH64(seed, le64(parent) || block)`), lookup `seqSearchPrefix` +
//!   `matchPods`, write `AddPrefix`.
//! - Redis: `pkg/plugins/gateway/statesync/redissync.go` (`redisKeyForEntity`
//!   `%s:{%s}:e:%s`, prefix `aibrix`, `defaultRecordTTL` 2 minutes, `SETEX`,
//!   pull = SCAN + MGET + `ApplyRemote`, then delta push), and
//!   `pkg/utils/prefixcacheindexer/sync.go` (namespace `prefixcache`, id =
//!   block hash in decimal, `blockWire {"model_to_pods": {model: {pod:
//!   UnixNano}}}` through Go's `json.Marshal`, `ApplyRemoteForSync` merge:
//!   per model and pod the newer time wins, other pods are kept).
//! - pod selection: `pkg/plugins/gateway/algorithms/prefix_cache.go`
//!   `getTargetPodFromMatchedPodsFromCounts` (matched pods shuffled, then
//!   stable-sorted by match percent desc, running requests asc; the first
//!   whose count is within mean + `AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR`
//!   (default 1) x stddev of all ready pods' counts).
//!
//! One module per part: [`json`] (a span-keeping JSON reader), [`text`],
//! [`keys`] (hashes, Redis keys and values), [`select`] and [`gateway`]
//! (a writer and a reader over Redis).

pub mod gateway;
pub mod json;
pub mod keys;
pub mod select;
pub mod text;

pub use crate::redis::RedisAt;
pub use gateway::{AibrixConfig, AibrixReader, AibrixWriter};
pub use json::{canonical_json, parse_json, write_json_string, Kind, Node};
pub use keys::{
    decode_block, encode_block, entity_key, merge_newer, now_nanos, prefix_hashes, xxh64,
    ModelToPods, DEFAULT_BLOCK_SIZE, DEFAULT_KEY_PREFIX, DEFAULT_RECORD_TTL_SECS,
    PREFIX_CACHE_NAMESPACE, STATESYNC_SEED,
};
pub use select::{select_target, seq_search, PrefixMatch, DEFAULT_STDDEV_FACTOR};
pub use text::{
    canonical_tools_text, chat_messages_text, chat_prefix_text, combine_prefix_text,
    completion_prefix_text, prefix_text,
};
