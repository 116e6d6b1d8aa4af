//! Table inspection: the answer to `GET <inspect.path>` on the listener
//! whose filter chain the operator names (`inspect.filter_chain`), built from the prefix table's buckets
//! and the name registries as the [`SharedStore`] holds them. The filter
//! answers it itself; such a request is never routed or sent upstream.
//!
//! Cost is bounded: one request reads at most `inspect.max_buckets` bucket
//! values (each at most [`crate::route::table::MAX_SLOTS_PER_BUCKET`] records) plus the two
//! registries, and the answer says where it stopped (`read.next_from`), so a
//! larger table is read page by page (`?from=<bucket>`). Requests on any
//! other path cost nothing here: the path is compared in memory, and only a
//! request on the inspect path reads the filter chain's name (one hostcall).
//!
//! Hits per prefix are not tracked: a record keeps only its last access, and
//! counting hits would be a shared-data write per routed request on top of
//! the table's. What the answer ranks instead is the anchors (a prompt's
//! first block, or a later segment's) holding the most records, blocks ×
//! pods: the prefixes the table spends most room on.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::InspectSettings;
use crate::route::table::{
    bucket_key, decode_bucket, is_other_layout, Record, TableConfig, LAYOUT_VERSION,
};
use crate::shared::registry::{NameRegistry, Registry, MAX_SLOTS};
use crate::shared::store::{SharedStore, StoreError};

/// Anchors listed in `top_anchors`.
pub(crate) const TOP_ANCHORS: usize = 10;

/// What the filter does with a request's head when inspection is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Not the inspect path: an ordinary request.
    Pass,
    /// The inspect path: answer it if it came in on the named filter
    /// chain, reading from bucket `from`.
    Inspect { get: bool, from: u32 },
}

/// Whether `path` (with its query) asks for the inspection.
pub(crate) fn ask(settings: &InspectSettings, method: &str, path: &str) -> Ask {
    if settings.path.is_empty() {
        return Ask::Pass;
    }
    let (bare, query) = path.split_once('?').unwrap_or((path, ""));
    if bare != settings.path {
        return Ask::Pass;
    }
    let from = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("from="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ask::Inspect {
        get: method == "GET",
        from,
    }
}

/// One record as the answer shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Shown {
    pub(crate) pod: String,
    pub(crate) model: String,
    /// The block hash, hex.
    pub(crate) block: String,
    pub(crate) last_access: u32,
    pub(crate) age_secs: u32,
}

/// Records of one pod or one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Count {
    pub(crate) name: String,
    pub(crate) records: u64,
}

/// One anchor's share of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct AnchorShare {
    /// The anchor (low 32 bits of its first block's hash), hex.
    pub(crate) anchor: String,
    pub(crate) records: u64,
    pub(crate) blocks: u64,
    pub(crate) pods: Vec<String>,
    pub(crate) newest_age_secs: u32,
}

/// The table's fixed bounds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Bounds {
    pub(crate) layout_version: u8,
    pub(crate) buckets: u32,
    pub(crate) slots_per_bucket: usize,
    pub(crate) capacity_records: u64,
    pub(crate) idle_expiry_secs: u32,
    pub(crate) registry_slots: usize,
}

/// What this request read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Read {
    pub(crate) from: u32,
    pub(crate) buckets_read: u32,
    /// `inspect.max_buckets`: the cap on buckets one request reads.
    pub(crate) max_buckets_per_request: u32,
    /// Records those buckets can hold: the cap on records read.
    pub(crate) max_records_per_request: u64,
    /// Every bucket was read by this request.
    pub(crate) complete: bool,
    /// Where the next page starts (`?from=`), None after the last bucket.
    pub(crate) next_from: Option<u32>,
}

/// Occupancy of the buckets read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Occupancy {
    pub(crate) live_records: u64,
    /// Records past idle expiry, still holding their slot until reused.
    pub(crate) expired_records: u64,
    /// Slots the buckets read can hold.
    pub(crate) slots_read: u64,
    /// `live_records / slots_read`.
    pub(crate) live_share: f64,
    /// Buckets never written.
    pub(crate) empty_buckets: u32,
    /// Buckets holding another layout version's value (an older or newer
    /// module's): they read as empty and are written anew on the next
    /// write (counted in `table.layout_resets`).
    pub(crate) other_layout_buckets: u32,
}

/// The whole answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct View {
    pub(crate) now: u32,
    pub(crate) bounds: Bounds,
    pub(crate) read: Read,
    pub(crate) occupancy: Occupancy,
    pub(crate) per_pod: Vec<Count>,
    pub(crate) per_model: Vec<Count>,
    pub(crate) oldest: Option<Shown>,
    pub(crate) newest: Option<Shown>,
    pub(crate) top_anchors: Vec<AnchorShare>,
    pub(crate) hits: &'static str,
}

/// What `hits` says in every answer.
pub(crate) const HITS_NOTE: &str = "not tracked: a record keeps only its last access; \
     top_anchors ranks the anchors holding the most records (blocks x pods) instead";

/// Reads buckets `from..` (at most `max_buckets`) and the registries.
pub(crate) fn view<S: SharedStore + ?Sized>(
    store: &S,
    cfg: &TableConfig,
    max_buckets: u32,
    from: u32,
    now: u32,
) -> Result<View, StoreError> {
    let pods = NameRegistry::pods(store).load()?;
    let models = NameRegistry::models(store).load()?;
    let from = from.min(cfg.buckets);
    let end = from.saturating_add(max_buckets).min(cfg.buckets);
    let mut occ = Occupancy {
        live_records: 0,
        expired_records: 0,
        slots_read: u64::from(end - from) * cfg.slots as u64,
        live_share: 0.0,
        empty_buckets: 0,
        other_layout_buckets: 0,
    };
    let mut per_pod: BTreeMap<usize, u64> = BTreeMap::new();
    let mut per_model: BTreeMap<usize, u64> = BTreeMap::new();
    let mut oldest: Option<Record> = None;
    let mut newest: Option<Record> = None;
    // Every record of an anchor is in the anchor's one bucket, so anchors
    // are ranked bucket by bucket: memory holds one bucket and the leaders.
    let mut top: Vec<Ranked> = Vec::new();
    for bucket in from..end {
        let (value, _) = store.get(&bucket_key(bucket))?;
        let bytes = value.unwrap_or_default();
        if bytes.is_empty() {
            occ.empty_buckets += 1;
            continue;
        }
        if is_other_layout(&bytes) {
            occ.other_layout_buckets += 1;
            continue;
        }
        let mut live = Vec::with_capacity(cfg.slots);
        for r in decode_bucket(&bytes, cfg.slots) {
            if r.last_access == 0 {
                continue;
            }
            if !cfg.is_live(&r, now) {
                occ.expired_records += 1;
                continue;
            }
            occ.live_records += 1;
            *per_pod.entry(r.pod.index()).or_default() += 1;
            *per_model.entry(usize::from(r.model)).or_default() += 1;
            if oldest.map_or(true, |o| r.last_access < o.last_access) {
                oldest = Some(r);
            }
            if newest.map_or(true, |n| r.last_access > n.last_access) {
                newest = Some(r);
            }
            live.push(r);
        }
        live.sort_unstable_by_key(|r| r.anchor);
        top.extend(live.chunk_by(|a, b| a.anchor == b.anchor).map(Ranked::of));
        if top.len() > 4 * TOP_ANCHORS {
            Ranked::keep_leaders(&mut top);
        }
    }
    Ranked::keep_leaders(&mut top);
    if occ.slots_read > 0 {
        occ.live_share = occ.live_records as f64 / occ.slots_read as f64;
    }
    let show = |r: Record| Shown {
        pod: name(&pods, r.pod.index(), "pod"),
        model: name(&models, usize::from(r.model), "model"),
        block: format!("{:016x}", r.block),
        last_access: r.last_access,
        age_secs: now.saturating_sub(r.last_access),
    };
    let top = top
        .into_iter()
        .map(|t| AnchorShare {
            anchor: format!("{:08x}", t.anchor),
            records: t.records,
            blocks: t.blocks,
            pods: t.pods.into_iter().map(|p| name(&pods, p, "pod")).collect(),
            newest_age_secs: now.saturating_sub(t.newest),
        })
        .collect();
    let counts = |m: BTreeMap<usize, u64>, reg: &Registry, what: &str| {
        let mut out: Vec<Count> = m
            .into_iter()
            .map(|(slot, records)| Count {
                name: name(reg, slot, what),
                records,
            })
            .collect();
        out.sort_by(|a, b| b.records.cmp(&a.records).then(a.name.cmp(&b.name)));
        out
    };
    Ok(View {
        now,
        bounds: Bounds {
            layout_version: LAYOUT_VERSION,
            buckets: cfg.buckets,
            slots_per_bucket: cfg.slots,
            capacity_records: u64::from(cfg.buckets) * cfg.slots as u64,
            idle_expiry_secs: cfg.idle_expiry_secs,
            registry_slots: MAX_SLOTS,
        },
        read: Read {
            from,
            buckets_read: end - from,
            max_buckets_per_request: max_buckets,
            max_records_per_request: u64::from(max_buckets) * cfg.slots as u64,
            complete: from == 0 && end == cfg.buckets,
            next_from: (end < cfg.buckets).then_some(end),
        },
        occupancy: occ,
        per_pod: counts(per_pod, &pods, "pod"),
        per_model: counts(per_model, &models, "model"),
        oldest: oldest.map(show),
        newest: newest.map(show),
        top_anchors: top,
        hits: HITS_NOTE,
    })
}

/// One anchor's records in a bucket, before names are looked up.
struct Ranked {
    anchor: u32,
    records: u64,
    blocks: u64,
    /// Pod slots, sorted, each once.
    pods: Vec<usize>,
    newest: u32,
}

impl Ranked {
    /// `group`: the live records of one anchor (never empty).
    fn of(group: &[Record]) -> Ranked {
        let mut blocks: Vec<u64> = group.iter().map(|r| r.block).collect();
        blocks.sort_unstable();
        blocks.dedup();
        let mut pods: Vec<usize> = group.iter().map(|r| r.pod.index()).collect();
        pods.sort_unstable();
        pods.dedup();
        Ranked {
            anchor: group.first().map_or(0, |r| r.anchor),
            records: group.len() as u64,
            blocks: blocks.len() as u64,
            pods,
            newest: group.iter().map(|r| r.last_access).max().unwrap_or(0),
        }
    }

    /// Keeps the [`TOP_ANCHORS`] holding the most records (ties: the
    /// lower anchor).
    fn keep_leaders(top: &mut Vec<Ranked>) {
        top.sort_by(|a, b| b.records.cmp(&a.records).then(a.anchor.cmp(&b.anchor)));
        top.truncate(TOP_ANCHORS);
    }
}

/// A slot's name, or `<what>#<slot>` for a slot the registry no longer
/// names (given up since the record was written).
fn name(reg: &Registry, slot: usize, what: &str) -> String {
    match reg.slots.get(slot) {
        Some(Some(named)) => named.name.clone(),
        _ => format!("{what}#{slot}"),
    }
}

/// The answer's body: the view as JSON, or the error as a JSON object.
pub(crate) fn body(view: &Result<View, StoreError>) -> Vec<u8> {
    match view {
        Ok(v) => serde_json::to_vec_pretty(v).unwrap_or_default(),
        Err(e) => {
            serde_json::to_vec(&serde_json::json!({ "error": e.to_string() })).unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests;
