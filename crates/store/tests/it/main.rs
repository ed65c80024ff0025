//! Store tests on real SQLite files and real tantivy indexes in temporary directories.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod archive;
mod basics;
mod conformance;
mod damage;
mod faults;
mod forget;
mod model;
mod processes;
mod recovery;
mod search;
mod support;
