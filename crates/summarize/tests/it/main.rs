//! The extractive summarizer and the tokenizers, at their public boundary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod extractive;
mod tokens;
