//! The session over time: a record per committed turn ([`TurnRecord`]) — the context its model
//! call was assembled from by kind, what the host added, the folds its compaction made, and the
//! provider's usage — kept in the conversation's state, so it goes with the session when it is
//! forgotten and travels in its archive.
//!
//! Bounded: the records are kept in [`CHUNKS`] chunks of [`CHUNK`] turns each (`turns.0` …),
//! a ring: turn `n` goes to chunk `(n / CHUNK) % CHUNKS`, which starts over when it held an
//! older hundred. So the newest 901 to 1,000 turns are kept, and a turn rewrites at most one
//! chunk of 100 records (about 25 KB).

use std::collections::BTreeMap;

use vilvona_core::admin::{TurnRecord, TurnUsage};
use vilvona_core::engine::EngineError;
use vilvona_core::message::AgentMessage;
use vilvona_store::ConversationId;

use crate::compaction::CompactionReport;
use crate::engine::LosslessEngine;
use crate::errors::store_error;

/// Turns a chunk holds.
const CHUNK: u64 = 100;
/// Chunks kept.
const CHUNKS: u64 = 10;
/// The state key of the last recorded turn's number.
const LAST_TURN: &str = "turns.last";

fn chunk_key(turn: u64) -> String {
    format!("turns.{}", (turn / CHUNK) % CHUNKS)
}

/// What the provider reported for a turn's model calls, summed (`None`: nothing reported).
pub(crate) fn turn_usage(messages: &[AgentMessage]) -> Option<TurnUsage> {
    let mut sum = TurnUsage::default();
    for message in messages {
        let AgentMessage::Assistant(assistant) = message else {
            continue;
        };
        let Some(usage) = assistant
            .usage
            .as_ref()
            .filter(|usage| usage.input.is_some())
        else {
            continue;
        };
        sum.calls += 1;
        sum.input += usage.input.unwrap_or(0);
        sum.cache_read += usage.cache_read.unwrap_or(0);
        sum.cache_write += usage.cache_write.unwrap_or(0);
        sum.output += usage.output.unwrap_or(0);
        // OpenClaw prices each call from its model's configured prices (zeros by default).
        if let Some(cost) = usage
            .extra
            .get("cost")
            .and_then(|cost| cost["total"].as_f64())
            .filter(|cost| *cost > 0.0)
        {
            *sum.cost.get_or_insert(0.0) += cost;
        }
    }
    (sum.calls > 0).then_some(sum)
}

impl LosslessEngine {
    /// Notes what an assembly of the conversation held, by kind: the turn that commits next
    /// records the last one.
    pub(crate) fn note_assembled(
        &self,
        conversation: ConversationId,
        by_kind: BTreeMap<String, u64>,
    ) {
        self.memory(conversation, |memory| {
            memory.assembled_kinds = Some(by_kind)
        });
    }

    /// Records a committed turn (numbered here: one more than the last recorded).
    pub(crate) async fn record_turn(
        &self,
        conversation: ConversationId,
        mut record: TurnRecord,
    ) -> Result<(), EngineError> {
        let last = self.last_recorded_turn(conversation).await?.unwrap_or(0);
        record.turn = last + 1;
        let (kinds, recalled) = self.memory(conversation, |memory| {
            (memory.assembled_kinds.take(), memory.recall.take())
        });
        record.context = kinds.unwrap_or_default();
        // What recall at assembly brought into the turn's prompt (`crate::recall`); the next
        // turn recalls anew.
        record.recalled = recalled
            .and_then(|(_, block)| block)
            .map(|block| block.items)
            .unwrap_or_default();
        let mut chunk = self.turn_chunk(conversation, record.turn).await?;
        // A chunk that held an older hundred starts over.
        chunk.retain(|kept| kept.turn / CHUNK == record.turn / CHUNK && kept.turn < record.turn);
        chunk.push(record);
        // The record and the newest turn's number in one transaction: a crash between two
        // writes would number the next record as this one, which it would then replace.
        let text = serde_json::to_string(&chunk)
            .map_err(|error| EngineError::caused_by("lossless: writing a turn's record", error))?;
        self.inner
            .store
            .set_states(
                conversation,
                vec![
                    (chunk_key(last + 1), text),
                    (LAST_TURN.to_owned(), (last + 1).to_string()),
                ],
            )
            .await
            .map_err(|error| store_error("recording a turn", error))
    }

    /// Folds made after a turn was recorded (by `maintain`, which OpenClaw calls right after
    /// the commit with its model in reach, or a `compact`) belong to that turn: they are added
    /// to the newest record, with the context they left. Nothing when no turn is recorded.
    pub(crate) async fn record_later_folds(
        &self,
        conversation: ConversationId,
        report: &CompactionReport,
    ) -> Result<(), EngineError> {
        if report.published.is_empty() || self.inner.store.is_read_only() {
            return Ok(());
        }
        let Some(last) = self.last_recorded_turn(conversation).await? else {
            return Ok(());
        };
        let mut chunk = self.turn_chunk(conversation, last).await?;
        let Some(record) = chunk.iter_mut().find(|record| record.turn == last) else {
            return Ok(());
        };
        record.folds.extend(report.published.iter().cloned());
        record.context_after_compaction = report.tokens_after;
        self.keep_turn_chunk(conversation, last, &chunk).await
    }

    /// The number of the newest recorded turn, if any.
    async fn last_recorded_turn(
        &self,
        conversation: ConversationId,
    ) -> Result<Option<u64>, EngineError> {
        Ok(self
            .inner
            .store
            .state(conversation, LAST_TURN)
            .await
            .map_err(|error| store_error("reading the last recorded turn", error))?
            .and_then(|text| text.parse::<u64>().ok()))
    }

    /// The chunk turn `turn` goes to, as stored (empty when none is, or it does not parse: a
    /// writer starts it over).
    async fn turn_chunk(
        &self,
        conversation: ConversationId,
        turn: u64,
    ) -> Result<Vec<TurnRecord>, EngineError> {
        Ok(self
            .inner
            .store
            .state(conversation, &chunk_key(turn))
            .await
            .map_err(|error| store_error("reading the turns' records", error))?
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default())
    }

    /// Stores the chunk turn `turn` goes to.
    async fn keep_turn_chunk(
        &self,
        conversation: ConversationId,
        turn: u64,
        chunk: &[TurnRecord],
    ) -> Result<(), EngineError> {
        let text = serde_json::to_string(chunk)
            .map_err(|error| EngineError::caused_by("lossless: writing a turn's record", error))?;
        self.inner
            .store
            .set_state(conversation, &chunk_key(turn), &text)
            .await
            .map_err(|error| store_error("recording a turn", error))
    }

    /// The conversation's recorded turns, oldest first.
    pub(crate) async fn turn_records(
        &self,
        conversation: ConversationId,
    ) -> Result<Vec<TurnRecord>, EngineError> {
        let mut records = Vec::new();
        for chunk in 0..CHUNKS {
            let text = self
                .inner
                .store
                .state(conversation, &format!("turns.{chunk}"))
                .await
                .map_err(|error| store_error("reading the turns' records", error))?;
            if let Some(text) = text {
                let kept: Vec<TurnRecord> = serde_json::from_str(&text).map_err(|error| {
                    EngineError::caused_by(
                        format!("lossless: the turns' records in turns.{chunk}"),
                        error,
                    )
                })?;
                records.extend(kept);
            }
        }
        records.sort_by_key(|record| record.turn);
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vilvona_core::message::Usage;

    fn answer(input: u64, cache_read: Option<u64>) -> AgentMessage {
        let mut message = AgentMessage::assistant_text("ok");
        if let AgentMessage::Assistant(assistant) = &mut message {
            assistant.usage = Some(Usage {
                input: Some(input),
                output: Some(7),
                cache_read,
                ..Usage::default()
            });
        }
        message
    }

    #[test]
    fn a_turns_usage_sums_its_calls_and_is_none_without_a_report() {
        let turn = [
            AgentMessage::user_text("q"),
            answer(100, Some(900)),
            answer(50, None),
        ];
        assert_eq!(
            turn_usage(&turn),
            Some(TurnUsage {
                calls: 2,
                input: 150,
                cache_read: 900,
                cache_write: 0,
                output: 14,
                cost: None
            })
        );
        assert_eq!(turn_usage(&[AgentMessage::user_text("q")]), None);
    }

    #[test]
    fn the_hosts_prices_are_summed_and_zero_prices_are_none() {
        let priced = |total: f64| {
            let mut message = answer(100, None);
            if let AgentMessage::Assistant(assistant) = &mut message {
                let usage = assistant.usage.as_mut().unwrap();
                usage.extra.insert(
                    "cost".to_owned(),
                    serde_json::json!({"input": 0.0, "total": total}),
                );
            }
            message
        };
        assert_eq!(
            turn_usage(&[priced(0.25), priced(0.5)]).unwrap().cost,
            Some(0.75)
        );
        assert_eq!(turn_usage(&[priced(0.0)]).unwrap().cost, None);
    }

    #[test]
    fn chunks_make_a_ring_of_the_newest_thousand() {
        assert_eq!(chunk_key(1), "turns.0");
        assert_eq!(chunk_key(100), "turns.1");
        assert_eq!(chunk_key(999), "turns.9");
        assert_eq!(chunk_key(1_000), "turns.0");
    }
}
