//! A workload run's figures held against figures recorded earlier (`workload --hold FILE`): a
//! regression check with margins wide enough for another machine of the same kind and the noise of
//! one run, not a timed assertion. Times may double (ten runs of one build spread by up to 1.3×,
//! and CI's machine runs slower than a quiet one), plus a slack for the shortest; the median of
//! text grep, which CI measured at three times a quiet run's, may triple. `.ci/run` holds a T =
//! 20,000 run against `benches/hold/workload-20000.json`.

use serde_json::Value;

/// How far a figure may move from the recorded one and still hold.
#[derive(Clone, Copy, Debug)]
enum Margin {
    /// A time: at most `factor ×` the recorded one, plus `slack_ms` (short times are noisy).
    Time { factor: f64, slack_ms: f64 },
    /// A size: at most `factor ×` the recorded one.
    Size { factor: f64 },
    /// A count that must not fall.
    NoFewer,
}

/// The figures held, by their place in the runner's JSON, and their margins.
const HELD: &[(&str, Margin)] = &[
    (
        "/ingest/median_ms",
        Margin::Time {
            factor: 2.0,
            slack_ms: 0.3,
        },
    ),
    (
        "/ingest/p99_ms",
        Margin::Time {
            factor: 2.0,
            slack_ms: 1.0,
        },
    ),
    (
        "/assemble/median_ms",
        Margin::Time {
            factor: 2.0,
            slack_ms: 0.3,
        },
    ),
    (
        "/grep/median_ms",
        // CI measured 1.76 ms on a build this machine measures at 0.56 ms alone (2026-12-05),
        // against a bound of 2.19 ms with half a millisecond of slack: too close for noise. At
        // 2 ms the bound (3.7 ms) still fails the walk up the DAG that grew with the history
        // (4.3 ms at this size).
        Margin::Time {
            factor: 3.0,
            slack_ms: 2.0,
        },
    ),
    (
        "/grep/p99_ms",
        Margin::Time {
            factor: 2.0,
            slack_ms: 1.0,
        },
    ),
    (
        "/grepSemantic/median_ms",
        Margin::Time {
            factor: 2.0,
            slack_ms: 1.0,
        },
    ),
    (
        "/grepHybrid/median_ms",
        Margin::Time {
            factor: 2.0,
            slack_ms: 1.0,
        },
    ),
    (
        "/compaction/median_ms",
        Margin::Time {
            factor: 2.0,
            slack_ms: 2.0,
        },
    ),
    (
        "/compaction/p99_ms",
        Margin::Time {
            factor: 2.0,
            slack_ms: 10.0,
        },
    ),
    // Through the turns and grep; the runner's own closing merge of the index into one
    // segment (an operator's step) is left out.
    // 1.15 × the recorded 174 MiB is the 200 MiB the months-of-history issue set at this size;
    // ten runs of one build peaked at 156–185 MiB.
    (
        "/peakRssBeforeMaintenanceMib",
        Margin::Size { factor: 1.15 },
    ),
    ("/storeToTranscript", Margin::Size { factor: 1.1 }),
    ("/needlesFound", Margin::NoFewer),
];

/// One held figure's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    pub figure: &'static str,
    pub recorded: f64,
    pub now: f64,
    /// The most (or, for a count, the least) it may be.
    pub bound: f64,
    pub holds: bool,
}

/// Each held figure of `now` against `recorded` (both the runner's `--json` documents); an
/// error names a figure either lacks.
pub fn hold(now: &Value, recorded: &Value) -> anyhow::Result<Vec<Held>> {
    HELD.iter()
        .map(|(figure, margin)| {
            let read = |document: &Value, which: &str| {
                document
                    .pointer(figure)
                    .and_then(Value::as_f64)
                    .ok_or_else(|| anyhow::anyhow!("the {which} figures have no {figure}"))
            };
            let (recorded, now) = (read(recorded, "recorded")?, read(now, "run's")?);
            let (bound, holds) = match *margin {
                Margin::Time { factor, slack_ms } => {
                    let bound = recorded * factor + slack_ms;
                    (bound, now <= bound)
                }
                Margin::Size { factor } => (recorded * factor, now <= recorded * factor),
                Margin::NoFewer => (recorded, now >= recorded),
            };
            Ok(Held {
                figure,
                recorded,
                now,
                bound,
                holds,
            })
        })
        .collect()
}

/// The outcomes as lines, one a figure.
pub fn report(held: &[Held]) -> String {
    held.iter()
        .map(|held| {
            format!(
                "{} {:<30} {:>10.3} (recorded {:.3}, bound {:.3})\n",
                if held.holds { "holds " } else { "BROKEN" },
                held.figure,
                held.now,
                held.recorded,
                held.bound
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn figures(scale: f64, needles: u64) -> Value {
        let spread =
            |ms: f64| json!({"median_ms": ms * scale, "p99_ms": 4.0 * ms * scale, "count": 10});
        json!({
            "ingest": spread(0.2), "assemble": spread(0.3), "grep": spread(0.3),
            "grepSemantic": spread(3.0), "grepHybrid": spread(3.0), "compaction": spread(10.0),
            "peakRssBeforeMaintenanceMib": 180.0 * scale, "storeToTranscript": 1.3 * scale, "needlesFound": needles,
        })
    }

    #[test]
    fn a_run_like_the_recorded_one_holds_and_a_regression_does_not() {
        let recorded = figures(1.0, 10);
        assert!(
            hold(&figures(1.05, 10), &recorded)
                .unwrap()
                .iter()
                .all(|held| held.holds)
        );
        let broken: Vec<&str> = hold(&figures(5.0, 9), &recorded)
            .unwrap()
            .into_iter()
            .filter(|held| !held.holds)
            .map(|held| held.figure)
            .collect();
        assert!(broken.contains(&"/grepSemantic/median_ms"), "{broken:?}");
        assert!(
            broken.contains(&"/peakRssBeforeMaintenanceMib"),
            "{broken:?}"
        );
        assert!(broken.contains(&"/needlesFound"), "{broken:?}");
        // Short times have slack: a 0.2 ms ingest at 0.6 ms holds (three times, past the
        // factor of two).
        let mut slow_start = figures(1.0, 10);
        slow_start["ingest"]["median_ms"] = json!(0.6);
        assert!(
            hold(&slow_start, &recorded)
                .unwrap()
                .iter()
                .all(|held| held.holds)
        );
    }

    #[test]
    fn a_missing_figure_is_named() {
        let error = hold(&json!({}), &figures(1.0, 10)).unwrap_err();
        assert!(error.to_string().contains("/ingest/median_ms"), "{error}");
    }
}
