//! Integration tests of the contract crate, at its public boundary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod archive;
mod host;
mod messages;
mod registry;
