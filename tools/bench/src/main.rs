#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

macro_rules! env {
    ("CARGO_MANIFEST_DIR") => {
        concat!(::core::env!("CARGO_MANIFEST_DIR"), "/../..")
    };
}
#[path = "../../../tests/support/mod.rs"]
mod support;

fn main() {
    println!("{}", support::repo_root().display());
    println!("{}", support::envoy_bin().display());
}
