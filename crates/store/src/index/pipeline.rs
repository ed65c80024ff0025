//! A local model's vectors made on a thread of their own as documents arrive, instead of all
//! at once when the index commits while the store's writer (and the turn behind it) waits: a
//! commit takes the documents whose vectors are made (see `IndexSink::commit_ready`).
//! Documents leave in the order they came; one removed while its vectors are made is dropped
//! when they come back.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};

use tantivy::TantivyDocument;

use super::{IndexedRow, Watermark};
use vilvona_embed::{EmbedError, Embedder};

/// Documents that may wait for their vectors: past this, the sink waits until half as many
/// do (the thread cannot keep up, and waiting documents hold their text in memory).
pub(super) const MOST_WAITING: usize = 512;

/// The embedding thread's nice value on Linux (0 is the default; 19 the lowest priority).
const BACKGROUND_NICE: i32 = 10;

/// A document's text to embed: the text, how many chunks it may have, its neighbour.
type Job = (String, usize, Option<String>);

/// A document's chunk vectors, or why the model could not make them.
type Made = Result<Vec<Vec<f32>>, EmbedError>;

/// A document that waits for its vectors: its row, whether it is beyond the rows indexed
/// before it (not a row indexed again), and the document (`None` once removed).
struct Waiting {
    row: IndexedRow,
    advances: bool,
    document: Option<TantivyDocument>,
}

/// The sink's side of the embedding thread.
pub(super) struct Pipeline {
    jobs: Sender<Job>,
    made: Receiver<Made>,
    waiting: VecDeque<Waiting>,
}

impl Pipeline {
    /// Starts the thread; `None` (documents are then embedded at the commit, as they wait)
    /// when the system would not start one.
    pub(super) fn start(embedder: Arc<dyn Embedder>) -> Option<Pipeline> {
        let (jobs, received) = channel::<Job>();
        let (finished, made) = channel::<Made>();
        let spawned = std::thread::Builder::new()
            .name("vilvona-embedding".to_owned())
            .spawn(move || {
                yield_to_turns();
                for (text, most, neighbour) in received {
                    let texts = [(text.as_str(), most, neighbour.as_deref())];
                    let vectors = super::embed_documents(&*embedder, &texts)
                        .map(|mut documents| documents.pop().unwrap_or_default());
                    if finished.send(vectors).is_err() {
                        return;
                    }
                }
            });
        match spawned {
            Ok(_) => Some(Pipeline {
                jobs,
                made,
                waiting: VecDeque::new(),
            }),
            Err(error) => {
                tracing::warn!(%error, "could not start the embedding thread; documents are embedded when the index commits");
                None
            }
        }
    }

    /// Hands a document's text to the thread. A thread that stopped answers with an error.
    pub(super) fn push(
        &mut self,
        row: IndexedRow,
        advances: bool,
        document: TantivyDocument,
        job: Job,
    ) {
        // A stopped thread: the receive below says so for this document.
        let _ = self.jobs.send(job);
        self.waiting.push_back(Waiting {
            row,
            advances,
            document: Some(document),
        });
    }

    /// Drops the waiting documents of `key` (removed, or added again with their vectors).
    pub(super) fn drop_key(&mut self, key: u64) {
        for waiting in self
            .waiting
            .iter_mut()
            .filter(|waiting| super::key_of(waiting.row) == key)
        {
            waiting.document = None;
        }
    }

    /// Drops every waiting document.
    pub(super) fn drop_all(&mut self) {
        for waiting in &mut self.waiting {
            waiting.document = None;
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether a row indexed again waits (its old document is deleted in the next commit).
    pub(super) fn holds_indexed_again(&self) -> bool {
        self.waiting.iter().any(|waiting| !waiting.advances)
    }

    /// `watermark` lowered below the first waiting new row of each kind: the rows the index
    /// holds once what was taken is committed (documents leave in the order they came, and
    /// each kind's new rows come in id order). A row indexed again does not lower it.
    pub(super) fn below_waiting(&self, mut watermark: Watermark) -> Watermark {
        for waiting in self.waiting.iter().filter(|waiting| waiting.advances) {
            match waiting.row {
                IndexedRow::Message(id) => watermark.messages = watermark.messages.min(id - 1),
                IndexedRow::Summary(id) => watermark.summaries = watermark.summaries.min(id - 1),
            }
        }
        watermark
    }

    /// The documents whose vectors are made, in the order they came, each with its vectors or
    /// why there are none, after waiting (if need be) until at most `left` still wait.
    /// Dropped documents are left out.
    pub(super) fn take(&mut self, left: usize) -> Vec<(TantivyDocument, Made)> {
        let mut done = Vec::new();
        while !self.waiting.is_empty() {
            let made = if self.waiting.len() > left {
                self.made.recv().map_err(|_| stopped())
            } else {
                match self.made.try_recv() {
                    Ok(made) => Ok(made),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => Err(stopped()),
                }
            };
            let made = made.and_then(|made| made);
            if let Some(Waiting {
                document: Some(document),
                ..
            }) = self.waiting.pop_front()
            {
                done.push((document, made));
            }
        }
        done
    }
}

/// Lowers the calling thread's priority (on Linux, a thread's own nice value), so that the
/// vectors are made in the time the store's turns leave free rather than in theirs.
fn yield_to_turns() {
    #[cfg(target_os = "linux")]
    if let Err(error) =
        rustix::process::setpriority_process(Some(rustix::thread::gettid()), BACKGROUND_NICE)
    {
        tracing::debug!(%error, "could not lower the embedding thread's priority");
    }
}

fn stopped() -> EmbedError {
    EmbedError::Failed("the embedding thread stopped".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(text: &str) -> Job {
        (text.to_owned(), 1, None)
    }

    #[test]
    fn documents_leave_in_order_and_hold_the_watermark_below_them() {
        let mut pipeline = Pipeline::start(vilvona_embed::builtin()).unwrap();
        let document = TantivyDocument::default;
        pipeline.push(IndexedRow::Message(7), true, document(), job("the first"));
        pipeline.push(IndexedRow::Summary(3), true, document(), job("a summary"));
        pipeline.push(IndexedRow::Message(8), true, document(), job("removed"));
        pipeline.push(IndexedRow::Message(2), false, document(), job("again"));
        pipeline.drop_key(super::super::key_of(IndexedRow::Message(8)));
        let watermark = Watermark {
            messages: 8,
            summaries: 3,
            changes: 0,
        };
        // A row indexed again does not lower it; the first new row of each kind does.
        let below = pipeline.below_waiting(watermark);
        assert_eq!((below.messages, below.summaries), (6, 2));
        assert!(pipeline.holds_indexed_again());
        let taken = pipeline.take(0);
        // The removed document is left out; every other one has its vectors.
        assert_eq!(taken.len(), 3);
        assert!(
            taken
                .iter()
                .all(|(_, made)| made.as_ref().is_ok_and(|chunks| !chunks.is_empty()))
        );
        assert!(pipeline.is_empty());
        assert_eq!(pipeline.below_waiting(watermark), watermark);
    }
}
