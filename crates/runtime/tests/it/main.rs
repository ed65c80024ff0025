//! Host runtime tests: lifecycle, configuration, concurrency, rotation, the model client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod config;
mod http;
mod lifecycle;
mod pruning;
mod replay;
mod support;
