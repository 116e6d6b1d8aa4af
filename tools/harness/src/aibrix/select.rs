//! Lookup and pod selection, independent of where blocks are stored:
//! `seqSearchPrefix` + `matchPods`, then the target among the matched pods.

use std::collections::{BTreeMap, BTreeSet};

use super::keys::{now_nanos, ModelToPods};

/// `prefix_cache.go` `defaultStandardDeviationFactor`.
pub const DEFAULT_STDDEV_FACTOR: f64 = 1.0;

/// and the number of leading blocks it holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefixMatch {
    pub hashes: Vec<u64>,
    /// pod -> (percent, matched blocks)
    pub pods: BTreeMap<String, (usize, usize)>,
}

/// `seqSearchPrefix` + `matchPods`: walk the blocks in order; at block i,
/// every still-ready pod that holds it (for `model`) gets percent
/// `(i+1)*100/n`, the ready pods that do not are dropped; stop at the first
/// block that is missing, has no pod for the model, or has none of the
/// remaining ready pods.
pub fn seq_search(
    hashes: &[u64],
    model: &str,
    ready: &[&str],
    mut block_of: impl FnMut(usize, u64) -> Option<ModelToPods>,
) -> PrefixMatch {
    let mut ready: BTreeSet<String> = ready.iter().map(|p| p.to_string()).collect();
    let mut found = PrefixMatch {
        hashes: hashes.to_vec(),
        pods: BTreeMap::new(),
    };
    for (i, &h) in hashes.iter().enumerate() {
        let percent = (i + 1) * 100 / hashes.len();
        let Some(block) = block_of(i, h) else { break };
        let Some(pods) = block.get(model).filter(|p| !p.is_empty()) else {
            break;
        };
        let mut matched = false;
        ready.retain(|pod| {
            if pods.contains_key(pod) {
                found.pods.insert(pod.clone(), (percent, i + 1));
                matched = true;
                true
            } else {
                false
            }
        });
        if !matched {
            break;
        }
    }
    found
}

/// `getTargetPodFromMatchedPodsFromCounts`: among the matched pods (`pod ->
/// percent`), sorted by percent desc then running requests asc (ties in a
/// random order), the first whose running requests are within mean +
/// `factor` x stddev of all ready pods' counts. `counts` has one entry per
/// ready pod (a pod missing from it counts 0, as a missing metric does).
pub fn select_target(
    matched: &BTreeMap<String, usize>,
    ready: &[&str],
    counts: &BTreeMap<String, i64>,
    factor: f64,
) -> Option<String> {
    let loads: Vec<f64> = ready
        .iter()
        .map(|p| counts.get(*p).copied().unwrap_or(0) as f64)
        .collect();
    if loads.is_empty() {
        return None;
    }
    let mean = loads.iter().sum::<f64>() / loads.len() as f64;
    let var = loads.iter().map(|l| (l - mean) * (l - mean)).sum::<f64>() / loads.len() as f64;
    let bound = mean + factor * var.sqrt();
    let count = |p: &String| counts.get(p).copied().unwrap_or(0);
    let mut pods: Vec<&String> = matched.keys().collect();
    // rand.Shuffle before the stable sort: equal (percent, count) in any order.
    let mut state = (now_nanos() as u64) | 1;
    for i in (1..pods.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        pods.swap(i, (state % (i as u64 + 1)) as usize);
    }
    pods.sort_by(|a, b| matched[*b].cmp(&matched[*a]).then(count(a).cmp(&count(b))));
    pods.into_iter().find(|p| count(p) as f64 <= bound).cloned()
}
