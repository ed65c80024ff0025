//! Token estimators: the heuristic (from the contract crate) and BPE vocabularies embedded in
//! the binary (no download), with an optional calibration multiplier per model family.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tiktoken_rs::CoreBPE;
use vilvona_core::tokens::{HeuristicEstimator, TokenEstimator};

/// Which tokenizer counts tokens (`tokenizer` in an engine's config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// ≈4 characters per token, CJK and emoji weighted. Fast; the default.
    #[default]
    Heuristic,
    /// The `o200k_base` BPE vocabulary.
    O200k,
    /// The `cl100k_base` BPE vocabulary.
    Cl100k,
}

/// Counts with a BPE vocabulary; multiplies by a calibration factor when the provider's own
/// tokenizer differs (e.g. 1.15 for a family that counts ~15% more).
pub struct BpeEstimator {
    bpe: &'static CoreBPE,
    kind: TokenizerKind,
    multiplier: f64,
}

impl std::fmt::Debug for BpeEstimator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpeEstimator")
            .field("kind", &self.kind)
            .field("multiplier", &self.multiplier)
            .finish()
    }
}

impl TokenEstimator for BpeEstimator {
    fn text_tokens(&self, text: &str) -> u64 {
        let raw = self.bpe.encode_ordinary(text).len() as f64;
        (raw * self.multiplier).ceil() as u64
    }
}

/// Scales another estimator.
#[derive(Debug)]
struct Calibrated<E> {
    inner: E,
    multiplier: f64,
}

impl<E: TokenEstimator> TokenEstimator for Calibrated<E> {
    fn text_tokens(&self, text: &str) -> u64 {
        ((self.inner.text_tokens(text) as f64) * self.multiplier).ceil() as u64
    }
}

/// The estimator for a configured tokenizer and calibration multiplier (1.0 = none).
pub fn estimator(kind: TokenizerKind, multiplier: f64) -> Arc<dyn TokenEstimator> {
    let multiplier = if multiplier.is_finite() && multiplier > 0.0 {
        multiplier
    } else {
        1.0
    };
    match kind {
        TokenizerKind::Heuristic if (multiplier - 1.0).abs() < f64::EPSILON => {
            Arc::new(HeuristicEstimator)
        }
        TokenizerKind::Heuristic => Arc::new(Calibrated {
            inner: HeuristicEstimator,
            multiplier,
        }),
        TokenizerKind::O200k => Arc::new(BpeEstimator {
            bpe: tiktoken_rs::o200k_base_singleton(),
            kind,
            multiplier,
        }),
        TokenizerKind::Cl100k => Arc::new(BpeEstimator {
            bpe: tiktoken_rs::cl100k_base_singleton(),
            kind,
            multiplier,
        }),
    }
}
