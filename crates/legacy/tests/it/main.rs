//! The legacy engine and the built-in compaction.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod compaction;
mod cut;
mod engine;
