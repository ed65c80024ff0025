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
    let mut kept_tokens = 0;
    let mut cut = entries.len();
    while cut > 0 && kept_tokens < keep_recent_tokens {
        cut -= 1;
        kept_tokens += entries[cut].1;
    }
    if kept_tokens < keep_recent_tokens {
        return None;
    }
    let first_message_from = |index: usize| {
        entries[index..]
            .iter()
            .find(|(kind, _)| *kind != EntryKind::Metadata)
            .map(|(kind, _)| *kind)
    };
    // Never start the kept side with a tool result: move back to the call that made it.
    while cut > 0 && first_message_from(cut) == Some(EntryKind::ToolResult) {
        cut -= 1;
    }
    // Metadata right before the cut belongs to what follows it.
    while cut > 0 && entries[cut - 1].0 == EntryKind::Metadata {
        cut -= 1;
    }
    if cut == 0 {
        return None;
    }
    // The turn the kept side starts in: split only if its first message is not a user message.
    let turn_start = if matches!(first_message_from(cut), Some(EntryKind::User) | None) {
        None
    } else {
        entries[..cut]
            .iter()
            .rposition(|(kind, _)| *kind == EntryKind::User)
    };
    Some(CutPoint {
        first_kept: cut,
        turn_start,
    })
}
