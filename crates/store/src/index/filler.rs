//! Vectors made in the background: for a model behind an endpoint, always (text search never
//! waits for the network); for a local model, when a whole index is rebuilt or caught up (a
//! new model, a lost index), so that opening the store does not wait for it. Documents are
//! indexed at once without vectors, and the index's maintainer hands the ones that wait to a
//! thread of this filler a batch at a time, then adds each again with its vectors (see
//! `IndexSink::add_with_vectors`). What waits is read from the index itself (documents with no
//! vectors), so it survives restarts.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::time::{Duration, Instant};

use vilvona_embed::{EmbedError, Embedder, Vectors};

use super::IndexRow;

/// Documents sent to the model in one batch.
pub(crate) const FILL_BATCH: usize = 256;
/// The first wait after the model could not be reached, doubled up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_secs(1);
const LONGEST_WAIT: Duration = Duration::from_secs(60);
/// How often the maintainer looks for documents that wait, while it finds none.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// A batch's rows (as they were read when it was sent) and their vectors, stored form.
pub(crate) struct Filled {
    pub(crate) rows: Vec<IndexRow>,
    pub(crate) vectors: Vec<Vec<u8>>,
}

/// The rows' vectors, as stored (empty for a row with nothing to embed), in the rows' order.
pub(crate) fn embed_rows(
    embedder: &dyn Embedder,
    rows: &[IndexRow],
) -> Result<Vec<Vec<u8>>, EmbedError> {
    let texts: Vec<(&str, usize, Option<&str>)> = rows
        .iter()
        .map(|row| {
            (
                row.text.as_str(),
                vilvona_embed::chunks_for(&row.role),
                row.neighbour.as_deref(),
            )
        })
        .collect();
    Ok(super::embed_documents(embedder, &texts)?
        .iter()
        .map(|chunks| Vectors::encode(chunks).0)
        .collect())
}

/// A batch as the filler thread answers it: the rows sent, and their vectors or why the model
/// could not make them.
type Embedded = (Vec<IndexRow>, Result<Vec<Vec<u8>>, EmbedError>);

/// The maintainer's side of the filler thread.
pub(crate) struct VectorFiller {
    jobs: Sender<Vec<IndexRow>>,
    done: Receiver<Embedded>,
    in_flight: bool,
    /// After a failure: no batch is sent before this.
    retry_at: Option<Instant>,
    wait: Duration,
    /// When the maintainer last looked for documents that wait.
    looked_at: Option<Instant>,
    /// Documents filled since the last report, for progress in the log.
    filled: u64,
    model: String,
}

impl VectorFiller {
    /// A filler for `embedder`, if there is one.
    pub(crate) fn for_embedder(embedder: Option<&Arc<dyn Embedder>>) -> Option<VectorFiller> {
        let embedder = embedder?.clone();
        let model = embedder.name().to_owned();
        let (jobs, received) = channel::<Vec<IndexRow>>();
        let (finished, done) = channel();
        let spawned = std::thread::Builder::new()
            .name("vilvona-embedding-filler".to_owned())
            .spawn(move || {
                // Ends when the maintainer drops its side.
                while let Ok(rows) = received.recv() {
                    let vectors = match embed_rows(&*embedder, &rows) {
                        Ok(vectors) => Ok(vectors),
                        // Refused for what was sent (not for being unreachable): asking
                        // again would fail again, so these documents stop waiting.
                        Err(EmbedError::Failed(detail)) => {
                            tracing::warn!(%detail, documents = rows.len(), "the embedding model refused these documents; they stay without vectors (rebuild-index asks again)");
                            Ok(vec![Vec::new(); rows.len()])
                        }
                        Err(error) => Err(error),
                    };
                    if finished.send((rows, vectors)).is_err() {
                        return;
                    }
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not start the embedding thread; documents stay without vectors");
            return None;
        }
        Some(VectorFiller {
            jobs,
            done,
            in_flight: false,
            retry_at: None,
            wait: FIRST_WAIT,
            looked_at: None,
            filled: 0,
            model,
        })
    }

    /// Whether a batch may be sent now: none is being embedded, and no failure is being
    /// waited out.
    pub(crate) fn ready(&self) -> bool {
        !self.in_flight && self.retry_at.is_none_or(|at| Instant::now() >= at)
    }

    /// Whether a batch is being embedded (the maintainer looks for it soon).
    pub(crate) fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// Whether it is time to look for documents that wait again (once a second at most
    /// while none were found).
    pub(crate) fn due(&self) -> bool {
        self.looked_at.is_none_or(|at| at.elapsed() >= LOOK_AGAIN)
    }

    /// Sends a batch (read from the database just now); an empty one records the look.
    pub(crate) fn send(&mut self, rows: Vec<IndexRow>) {
        self.looked_at = Some(Instant::now());
        if rows.is_empty() {
            if self.filled > 0 {
                tracing::info!(documents = self.filled, model = %self.model, "every indexed document has its vectors");
                self.filled = 0;
            }
            return;
        }
        self.in_flight = self.jobs.send(rows).is_ok();
    }

    /// The batch that was embedded, if it is done; a failure is logged and waited out.
    pub(crate) fn take_done(&mut self) -> Option<Filled> {
        if !self.in_flight {
            return None;
        }
        match self.done.try_recv() {
            Ok((rows, Ok(vectors))) => {
                self.in_flight = false;
                self.retry_at = None;
                self.wait = FIRST_WAIT;
                if self.filled == 0 {
                    tracing::info!(model = %self.model, "embedding indexed documents in the background");
                }
                self.filled += rows.len() as u64;
                Some(Filled { rows, vectors })
            }
            Ok((rows, Err(error))) => {
                self.in_flight = false;
                tracing::warn!(%error, documents = rows.len(), wait_s = self.wait.as_secs(), "documents wait for their vectors; text search finds them meanwhile");
                self.retry_at = Some(Instant::now() + self.wait);
                self.wait = (self.wait * 2).min(LONGEST_WAIT);
                None
            }
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.in_flight = false;
                None
            }
        }
    }
}
