//! One target check and the table of them.

use serde::Serialize;

use crate::report::{verdict, Table};

/// One target check.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub name: String,
    pub detail: String,
    /// PASS, MISS or INFO; `n/a` when a needed row is missing.
    pub verdict: String,
}

pub(super) fn target(name: &str, detail: String, ok: Option<bool>) -> Target {
    Target {
        name: name.into(),
        detail,
        verdict: match ok {
            Some(ok) => verdict(ok).into(),
            None => "n/a".into(),
        },
    }
}

/// The targets as a table.
pub fn targets_table(t: &[Target]) -> Table {
    let mut table = Table::new("Targets", &["target", "measured", "verdict"]);
    for x in t {
        table.row(&[x.name.clone(), x.detail.clone(), x.verdict.clone()]);
    }
    table
}
