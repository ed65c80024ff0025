//! What each session's client already holds of its context: the revision and message hashes
//! `assemble` last sent it, from which a reply is a delta (the runs that stayed, the new
//! messages) instead of the whole context.

use std::collections::HashMap;
use std::sync::Mutex as StdMutex;

use serde_json::{Value, json};
use vilvona_core::engine::{AssembleResult, Messages};
use vilvona_core::message::AgentMessage;

use super::lock;

/// How many sessions' last assembled context the server remembers (as hashes); past it, it
/// starts over and those clients get whole replies once.
const SENT_SESSIONS: usize = 4096;

/// What each session's client was last sent by `assemble`: a revision and one hash per message.
pub(super) struct SentContexts {
    next_revision: u64,
    sessions: HashMap<String, (u64, Vec<u64>)>,
}

impl Default for SentContexts {
    /// Revisions start from the clock (a thousand a millisecond, more than any process
    /// assembles), so a process started after another one died never names a revision the
    /// client holds from the dead one: the client is sent whole contexts until it holds one
    /// of this process's.
    fn default() -> SentContexts {
        SentContexts {
            next_revision: u64::try_from(vilvona_core::clock::now_ms()).unwrap_or(0) * 1_000,
            sessions: HashMap::new(),
        }
    }
}

impl SentContexts {
    /// Remembers what a session's client is sent now (`hashes`, one per message) and returns
    /// the revision it names and the runs of it the client already holds (when it holds the
    /// last revision sent: `held`).
    pub(super) fn record(
        &mut self,
        session_id: &str,
        held: Option<u64>,
        hashes: Vec<u64>,
    ) -> (u64, Vec<[usize; 3]>) {
        let runs = match (held, self.sessions.get(session_id)) {
            (Some(held), Some((revision, sent))) if held == *revision => held_runs(sent, &hashes),
            _ => Vec::new(),
        };
        self.next_revision += 1;
        // Full: the session sent to longest ago leaves (its client is sent its whole context
        // next time); the others keep what their clients hold.
        if self.sessions.len() >= SENT_SESSIONS
            && !self.sessions.contains_key(session_id)
            && let Some(idle) = self
                .sessions
                .iter()
                .min_by_key(|(_, (revision, _))| *revision)
                .map(|(id, _)| id.clone())
        {
            self.sessions.remove(&idle);
        }
        self.sessions
            .insert(session_id.to_owned(), (self.next_revision, hashes));
        (self.next_revision, runs)
    }
}

/// The runs `[at, from, count]` of `now` found in `sent`: a compaction replaces a stretch of
/// the context with a summary and the messages on either side stay, shifted.
pub(super) fn held_runs(sent: &[u64], now: &[u64]) -> Vec<[usize; 3]> {
    let mut first: HashMap<u64, usize> = HashMap::with_capacity(sent.len());
    for (index, hash) in sent.iter().enumerate().rev() {
        first.insert(*hash, index);
    }
    let mut runs = Vec::new();
    let mut at = 0;
    while at < now.len() {
        match first.get(&now[at]) {
            Some(&from) => {
                let count = now[at..]
                    .iter()
                    .zip(&sent[from..])
                    .take_while(|(now, sent)| now == sent)
                    .count();
                runs.push([at, from, count]);
                at += count;
            }
            None => at += 1,
        }
    }
    runs
}

/// The reply to an `assemble` whose client holds revision `held`: the result whole, or only
/// the messages the client does not hold (`held` says where the rest come from); either way
/// with the revision the client holds next.
pub(super) fn assembled_reply(
    sent: &StdMutex<SentContexts>,
    session_id: &str,
    held: Option<u64>,
    mut result: AssembleResult,
) -> Result<Value, serde_json::Error> {
    let hashes = result
        .messages
        .iter()
        .map(message_hash)
        .collect::<Result<Vec<u64>, _>>()?;
    let (revision, runs) = lock(sent).record(session_id, held, hashes);
    if !runs.is_empty() {
        let mut covered = vec![false; result.messages.len()];
        for [at, _, count] in &runs {
            covered[*at..at + count].fill(true);
        }
        result.messages = Messages::from(
            result
                .messages
                .iter()
                .zip(covered)
                .filter(|(_, covered)| !covered)
                .map(|(message, _)| message.clone())
                .collect::<Vec<_>>(),
        );
    }
    let mut value = serde_json::to_value(result)?;
    if let Value::Object(fields) = &mut value {
        fields.insert("revision".to_owned(), revision.into());
        if !runs.is_empty() {
            fields.insert("held".to_owned(), json!(runs));
        }
    }
    Ok(value)
}

/// A message's hash over its JSON, written straight into the hasher.
pub(super) fn message_hash(message: &AgentMessage) -> Result<u64, serde_json::Error> {
    use std::hash::Hasher;
    struct Feed(std::collections::hash_map::DefaultHasher);
    impl std::io::Write for Feed {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.write(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut feed = Feed(Default::default());
    serde_json::to_writer(&mut feed, message)?;
    Ok(feed.0.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past its bound the record lets the session sent to longest ago go, one at a time: the
    /// sessions in use keep the revision their clients hold.
    #[test]
    fn sent_contexts_let_the_longest_idle_session_go() {
        let mut sent = SentContexts {
            next_revision: 0,
            sessions: HashMap::new(),
        };
        for session in 0..SENT_SESSIONS {
            sent.record(&format!("s{session}"), None, vec![1, 2]);
        }
        let (revision, _) = sent.record("s0", None, vec![1, 2]);
        sent.record("new", None, vec![1]);
        assert_eq!(sent.sessions.len(), SENT_SESSIONS);
        assert!(!sent.sessions.contains_key("s1"), "the longest idle left");
        let (_, runs) = sent.record("s0", Some(revision), vec![1, 2, 3]);
        assert_eq!(runs, vec![[0, 0, 2]], "s0's client keeps what it holds");
        assert!(
            sent.sessions
                .contains_key(&format!("s{}", SENT_SESSIONS - 1))
        );
    }

    #[test]
    fn held_runs_find_what_stayed_where_it_went() {
        // (sent, now, runs)
        type Case<'a> = (&'a [u64], &'a [u64], &'a [[usize; 3]]);
        let cases: &[Case] = &[
            (&[], &[1, 2], &[]),
            (&[1, 2, 3], &[1, 2, 3, 4], &[[0, 0, 3]]),
            // A compaction: 2 and 3 became summary 9; the rest shifted left.
            (&[1, 2, 3, 4, 5], &[1, 9, 4, 5, 6], &[[0, 0, 1], [2, 3, 2]]),
            // Nothing the client holds.
            (&[1, 2], &[7, 8], &[]),
            // A repeated message is taken from its first place.
            (&[5, 5, 6], &[5, 6], &[[0, 0, 1], [1, 2, 1]]),
        ];
        for (sent, now, runs) in cases {
            assert_eq!(held_runs(sent, now), runs.to_vec(), "{sent:?} -> {now:?}");
        }
    }

    /// A process started after another died numbers its revisions above the dead one's.
    #[test]
    fn revisions_of_a_new_process_follow_the_old_ones() {
        let old = SentContexts::default().record("s", None, vec![1]).0;
        std::thread::sleep(std::time::Duration::from_millis(2));
        let new = SentContexts::default().record("s", None, vec![1]).0;
        assert!(new > old + 1, "{old} then {new}");
    }

    #[test]
    fn a_client_without_the_last_revision_gets_the_whole_context() {
        let mut sent = SentContexts::default();
        let (first, runs) = sent.record("s", None, vec![1, 2]);
        assert!(runs.is_empty());
        let (second, runs) = sent.record("s", Some(first), vec![1, 2, 3]);
        assert_eq!(runs, vec![[0, 0, 2]]);
        // A stale revision (another reply came between): whole.
        let (_, runs) = sent.record("s", Some(first), vec![1, 2, 3]);
        assert!(runs.is_empty());
        assert!(second > first);
    }
}
