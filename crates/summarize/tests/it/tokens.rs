use vilvona_summarize::{TokenizerKind, estimator};

const SAMPLES: [(&str, &str); 4] = [
    (
        "english",
        "The quick brown fox jumps over the lazy dog while the compaction loop keeps the context under budget.",
    ),
    (
        "code",
        "fn main() { let store = Store::open(&dir)?; for item in store.context(id)? { println!(\"{item:?}\"); } }",
    ),
    (
        "cjk",
        "上下文引擎决定模型在每次运行时看到什么。日本語のテキストも数えます。",
    ),
    ("emoji", "Deploy done 🚀🎉 tests green ✅ coffee ☕ next 🙂"),
];

#[test]
fn heuristic_and_bpe_agree_within_reason() {
    let heuristic = estimator(TokenizerKind::Heuristic, 1.0);
    for kind in [TokenizerKind::O200k, TokenizerKind::Cl100k] {
        let bpe = estimator(kind, 1.0);
        for (name, text) in SAMPLES {
            let (h, b) = (heuristic.text_tokens(text), bpe.text_tokens(text));
            assert!(b > 0 && h > 0, "{name}");
            let ratio = h as f64 / b as f64;
            assert!(
                (0.4..=2.5).contains(&ratio),
                "{kind:?} {name}: heuristic {h} vs bpe {b}"
            );
        }
    }
}

#[test]
fn bpe_counts_are_exact_and_offline() {
    // The vocabularies are compiled into the binary: these counts need no network.
    let o200k = estimator(TokenizerKind::O200k, 1.0);
    let cl100k = estimator(TokenizerKind::Cl100k, 1.0);
    assert_eq!(o200k.text_tokens("hello world"), 2);
    assert_eq!(cl100k.text_tokens("hello world"), 2);
    assert_eq!(o200k.text_tokens(""), 0);
}

#[test]
fn a_calibration_multiplier_scales_counts() {
    let plain = estimator(TokenizerKind::O200k, 1.0);
    let calibrated = estimator(TokenizerKind::O200k, 1.5);
    let text = SAMPLES[0].1;
    assert_eq!(
        calibrated.text_tokens(text),
        (plain.text_tokens(text) as f64 * 1.5).ceil() as u64
    );
    let heuristic = estimator(TokenizerKind::Heuristic, 2.0);
    assert_eq!(heuristic.text_tokens("abcdefgh"), 4);
    // Nonsense multipliers fall back to 1.
    assert_eq!(
        estimator(TokenizerKind::Heuristic, -3.0).text_tokens("abcdefgh"),
        2
    );
}
