//! Approximate tokenizer and chat rendering.
//!
//! podsim has no real vocabulary. Text is cut into chunks of
//! [`BYTES_PER_TOKEN`] bytes of its UTF-8 encoding (the last chunk may be
//! shorter); each chunk is one token, whose id is the 32-bit FNV-1a hash of
//! the chunk modulo [`VOCAB_SIZE`]. So `n` bytes of text are `ceil(n / 4)`
//! tokens, equal texts give equal ids, and two texts sharing their first `k`
//! bytes share their first `floor(k / 4)` tokens.
//!
//! Chat messages are rendered to one text, in order, as
//! `<|role|>\n` + content + `\n` per message, followed by `<|assistant|>\n`
//! (the generation prompt) unless the request sets
//! `add_generation_prompt: false`. A conversation's next turn therefore
//! starts with the whole text of the previous turn, as with real chat
//! templates, and its prefix is cached.

/// Bytes of text per token.
pub const BYTES_PER_TOKEN: usize = 4;
/// Token ids are in `0..VOCAB_SIZE`.
pub const VOCAB_SIZE: u32 = 100_000;

/// Token id of one chunk of text.
pub fn token_id(chunk: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for byte in chunk {
        h = (h ^ u32::from(*byte)).wrapping_mul(0x0100_0193);
    }
    h % VOCAB_SIZE
}

/// Token ids of `text`.
pub fn tokenize(text: &str) -> Vec<u32> {
    text.as_bytes()
        .chunks(BYTES_PER_TOKEN)
        .map(token_id)
        .collect()
}

/// One chat message, its content already flattened to text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Render chat messages to the prompt text (see the module doc).
pub fn render_chat(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|");
        out.push_str(&m.role);
        out.push_str("|>\n");
        out.push_str(&m.content);
        out.push('\n');
    }
    if add_generation_prompt {
        out.push_str("<|assistant|>\n");
    }
    out
}

const WORDS: [&str; 16] = [
    " the",
    " quick",
    " brown",
    " fox",
    " jumps",
    " over",
    " a",
    " lazy",
    " dog",
    " while",
    " cached",
    " prefixes",
    " make",
    " prefill",
    " cheap",
    ".",
];

/// Text of the `index`-th generated token (a fixed cycle of words).
pub fn output_token_text(index: u64) -> &'static str {
    let i = usize::try_from(index % WORDS.len() as u64).unwrap_or(0);
    WORDS.get(i).copied().unwrap_or(".")
}

/// The whole generated text of `n` tokens.
pub fn output_text(n: u64) -> String {
    (0..n).map(output_token_text).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn four_bytes_per_token() {
        assert_eq!(tokenize("").len(), 0);
        assert_eq!(tokenize("abc").len(), 1);
        assert_eq!(tokenize("abcd").len(), 1);
        assert_eq!(tokenize("abcde").len(), 2);
        assert_eq!(tokenize(&"x".repeat(400)).len(), 100);
        // Multi-byte characters count by bytes.
        assert_eq!(tokenize("éé").len(), 1);
        assert!(tokenize("hello world, again")
            .iter()
            .all(|t| *t < VOCAB_SIZE));
    }

    #[test]
    fn deterministic_and_prefix_stable() {
        let a = tokenize("The same long prefix, then one ending");
        let b = tokenize("The same long prefix, then another");
        assert_eq!(a, tokenize("The same long prefix, then one ending"));
        // 27 shared bytes -> 6 shared tokens.
        assert_eq!(a[..6], b[..6]);
        assert_ne!(a[6], b[6]);
    }

    #[test]
    fn chat_rendering_keeps_turn_prefix() {
        let turn1 = vec![
            ChatMessage {
                role: "system".into(),
                content: "Be brief.".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: "Hi".into(),
            },
        ];
        let r1 = render_chat(&turn1, true);
        assert_eq!(r1, "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n");
        let mut turn2 = turn1.clone();
        turn2.push(ChatMessage {
            role: "assistant".into(),
            content: "Hello".into(),
        });
        turn2.push(ChatMessage {
            role: "user".into(),
            content: "More".into(),
        });
        let r2 = render_chat(&turn2, true);
        assert!(r2.starts_with(&r1));
        assert_eq!(
            render_chat(&turn1, false),
            "<|system|>\nBe brief.\n<|user|>\nHi\n"
        );
    }

    #[test]
    fn output_words_cycle() {
        assert_eq!(output_token_text(0), " the");
        assert_eq!(output_token_text(16), " the");
        assert_eq!(output_text(3), " the quick brown");
        assert_eq!(output_text(0), "");
    }
}
