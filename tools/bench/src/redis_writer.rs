//! Entities written into Redis the way a peer replica's sync push does
//! (SETEX chunks, each followed by its change-log entry), so a replica under
//! test sees a realistic peer, or preloaded plainly. Over the harness's RESP
//! client ([`harness::redis::Conn`]), not the filter's codec.

use harness::redis::{cmd, Conn};

/// The Redis key layout of one namespace (as `src/sync/keys.rs` defines it).
#[derive(Clone, Debug)]
pub struct Namespace {
    pub prefix: String,
    pub ns: String,
}

impl Namespace {
    pub fn entity_key(&self, id: &str) -> String {
        format!("{}:{{{}}}:e:{id}", self.prefix, self.ns)
    }

    pub fn log_key(&self) -> String {
        format!("{}:{{{}}}:log", self.prefix, self.ns)
    }
}

/// Writes `entities` as a peer replica's push does: chunks of `chunk`
/// SETEX, each chunk followed by `XADD log MAXLEN ~ max * o origin i ids`
/// and `EXPIRE log ttl`. Chunks are pipelined `per_write` at a time.
pub fn push_like_a_peer(
    conn: &mut Conn,
    ns: &Namespace,
    entities: &[(String, Vec<u8>)],
    ttl_secs: u64,
    origin: &str,
    chunk: usize,
) {
    let ttl = ttl_secs.to_string();
    let log = ns.log_key();
    let mut batch = Vec::new();
    for part in entities.chunks(chunk.max(1)) {
        for (id, payload) in part {
            batch.push(cmd(&[
                b"SETEX",
                ns.entity_key(id).as_bytes(),
                ttl.as_bytes(),
                payload,
            ]));
        }
        let ids: Vec<&str> = part.iter().map(|(id, _)| id.as_str()).collect();
        batch.push(cmd(&[
            b"XADD",
            log.as_bytes(),
            b"MAXLEN",
            b"~",
            b"4096",
            b"*",
            b"o",
            origin.as_bytes(),
            b"i",
            ids.join(",").as_bytes(),
        ]));
        batch.push(cmd(&[b"EXPIRE", log.as_bytes(), ttl.as_bytes()]));
        if batch.len() >= 1000 {
            conn.pipeline_ok(&std::mem::take(&mut batch));
        }
    }
    if !batch.is_empty() {
        conn.pipeline_ok(&batch);
    }
}

/// Plain SETEX of many entities (no change log), pipelined 1000 at a time.
pub fn setex_all(conn: &mut Conn, ns: &Namespace, entities: &[(String, Vec<u8>)], ttl_secs: u64) {
    let ttl = ttl_secs.to_string();
    for part in entities.chunks(1000) {
        let batch: Vec<Vec<Vec<u8>>> = part
            .iter()
            .map(|(id, payload)| {
                cmd(&[
                    b"SETEX",
                    ns.entity_key(id).as_bytes(),
                    ttl.as_bytes(),
                    payload,
                ])
            })
            .collect();
        conn.pipeline_ok(&batch);
    }
}
