//! Where compaction cuts: keep the most recent `keep_recent_tokens`, never at a tool result or
//! between a tool call and its results, metadata before the cut stays with the kept side, and a
//! cut inside a turn marks the turn's prefix for a summary of its own.

/// What an entry of the current context is, for the cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    User,
    /// An assistant message without tool calls.
    Assistant,
    /// An assistant message that calls tools.
    ToolCall,
    ToolResult,
    /// A non-message entry (model change, label, …).
    Metadata,
}

/// The decided cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CutPoint {
    /// Index of the first entry kept verbatim.
    pub first_kept: usize,
    /// When the cut falls inside a turn: the index of that turn's user message. Entries
    /// `turn_start..first_kept` are summarized separately from the history before them.
    pub turn_start: Option<usize>,
}

/// Finds the cut for entries of the given kinds and token counts, or `None` when there is
/// nothing to summarize (the whole context fits in `keep_recent_tokens`).
pub fn find_cut(entries: &[(EntryKind, u64)], keep_recent_tokens: u64) -> Option<CutPoint> {
    find_cut_within(entries, keep_recent_tokens, u64::MAX)
}

/// [`find_cut`], with the kept side held to `max_kept_tokens` where a later valid cut allows
/// it: when the newest units are large, the cut moves forward (keeping less than
/// `keep_recent_tokens`) rather than keep a tail that leaves no room beside the prompt. If even
/// the newest unit is larger, the cut keeps just that unit.
pub fn find_cut_within(
    entries: &[(EntryKind, u64)],
    keep_recent_tokens: u64,
    max_kept_tokens: u64,
) -> Option<CutPoint> {
    let mut cut = walk_back(entries, keep_recent_tokens)?;
    let kept = |from: usize| {
        entries[from..]
            .iter()
            .map(|(_, tokens)| tokens)
            .sum::<u64>()
    };
    if kept(cut) > max_kept_tokens {
        let later = (cut + 1..entries.len())
            .filter(|&index| {
                matches!(
                    entries[index].0,
                    EntryKind::User | EntryKind::Assistant | EntryKind::ToolCall
                )
            })
            .map(|index| {
                let mut start = index;
                while start > 0 && entries[start - 1].0 == EntryKind::Metadata {
                    start -= 1;
                }
                start
            });
        let mut last = None;
        for candidate in later {
            last = Some(candidate);
            if kept(candidate) <= max_kept_tokens {
                break;
            }
        }
        if let Some(candidate) = last {
            cut = candidate;
        }
    }
    Some(CutPoint {
        first_kept: cut,
        turn_start: turn_start(entries, cut),
    })
}

fn first_message_from(entries: &[(EntryKind, u64)], index: usize) -> Option<EntryKind> {
    entries[index..]
        .iter()
        .find(|(kind, _)| *kind != EntryKind::Metadata)
        .map(|(kind, _)| *kind)
}

/// The turn the kept side starts in: split only if its first message is not a user message.
fn turn_start(entries: &[(EntryKind, u64)], cut: usize) -> Option<usize> {
    if matches!(
        first_message_from(entries, cut),
        Some(EntryKind::User) | None
    ) {
        None
    } else {
        entries[..cut]
            .iter()
            .rposition(|(kind, _)| *kind == EntryKind::User)
    }
}

/// Walks back from the end until `keep_recent_tokens` are kept, then to a valid cut: never a
/// tool result first, metadata with what follows it. `None` when nothing would be summarized.
fn walk_back(entries: &[(EntryKind, u64)], keep_recent_tokens: u64) -> Option<usize> {
    let mut kept_tokens = 0;
    let mut cut = entries.len();
    while cut > 0 && kept_tokens < keep_recent_tokens {
        cut -= 1;
        kept_tokens += entries[cut].1;
    }
    if kept_tokens < keep_recent_tokens {
        return None;
    }
    // Never start the kept side with a tool result: move back to the call that made it.
    while cut > 0 && first_message_from(entries, cut) == Some(EntryKind::ToolResult) {
        cut -= 1;
    }
    // Metadata right before the cut belongs to what follows it.
    while cut > 0 && entries[cut - 1].0 == EntryKind::Metadata {
        cut -= 1;
    }
    (cut > 0).then_some(cut)
}
