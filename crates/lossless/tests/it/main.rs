//! The lossless engine: conformance through the host, compaction invariants, recall, isolation,
//! faults.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod catch_up;
mod compaction;
mod conformance;
mod faults;
mod forget;
mod isolation;
mod model;
mod overflow;
mod recall;
mod replay;
mod stand_ins;
mod support;
mod turns;
