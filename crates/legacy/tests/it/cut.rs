//! Cut points in a compact fixture language: `u` user, `a` assistant text, `t` assistant tool
//! call, `r` tool result, `m` metadata entry; every message costs 100 tokens. The expected
//! string marks the first kept entry with `|` and a split turn's start with `^`.

use vilvona_legacy::{EntryKind, find_cut_within};

fn check(spec: &str, keep_entries: u64, expected: &str) {
    check_within(spec, keep_entries, u64::MAX, expected);
}

/// As [`check`], with the kept side held to `max_entries` where a later cut allows it.
fn check_within(spec: &str, keep_entries: u64, max_entries: u64, expected: &str) {
    let entries: Vec<(EntryKind, u64)> = spec
        .chars()
        .map(|c| match c {
            'u' => (EntryKind::User, 100),
            'a' => (EntryKind::Assistant, 100),
            't' => (EntryKind::ToolCall, 100),
            'r' => (EntryKind::ToolResult, 100),
            'm' => (EntryKind::Metadata, 0),
            other => panic!("unknown fixture letter {other}"),
        })
        .collect();
    let actual = match find_cut_within(
        &entries,
        keep_entries * 100,
        max_entries.saturating_mul(100),
    ) {
        None => "none".to_owned(),
        Some(cut) => spec
            .chars()
            .enumerate()
            .flat_map(|(index, c)| {
                let mut out = String::new();
                if cut.turn_start == Some(index) {
                    out.push('^');
                }
                if cut.first_kept == index {
                    out.push('|');
                }
                out.push(c);
                out.chars().collect::<Vec<_>>()
            })
            .collect(),
    };
    assert_eq!(actual, expected, "{spec} keeping {keep_entries}");
}

#[test]
fn plain_turns() {
    check("uaua", 2, "ua|ua");
    check("uauaua", 3, "ua^u|aua");
    check("uauaua", 4, "ua|uaua");
}

#[test]
fn long_tool_loops_cut_inside_the_turn() {
    check("utrtrtrtra", 3, "^utrtrtr|tra");
    check("utrtrtrtra", 4, "^utrtr|trtra");
}

#[test]
fn parallel_tool_calls_stay_with_their_results() {
    check("uatrrra", 2, "^ua|trrra");
    check("uatrrrua", 3, "^ua|trrrua");
}

#[test]
fn a_trailing_tool_result_keeps_its_call() {
    check("uatruatr", 1, "uatr^ua|tr");
}

#[test]
fn metadata_before_the_cut_stays_with_the_kept_side() {
    check("uammua", 2, "ua|mmua");
    check("uatmra", 2, "^ua|tmra");
}

#[test]
fn too_small_to_compact() {
    check("uaua", 4, "none");
    check("uaua", 9, "none");
    check("", 1, "none");
    check("trr", 1, "none");
}

#[test]
fn a_large_tail_moves_the_cut_forward_to_fit_the_cap() {
    // Walking back to 4 entries must start at the call (`t`), 6 entries kept; a cap of 3
    // moves the cut to the next valid start that fits.
    check_within("uauatrrr", 4, 8, "ua^ua|trrr");
    check_within("uauatrrra", 4, 3, "ua^uatrrr|a");
    // Nothing later fits: the newest valid start is the cut.
    check_within("uatrrr", 2, 1, "^ua|trrr");
}
