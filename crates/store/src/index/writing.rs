//! tantivy's writer on a thread of its own. The store's writer thread hands it every change
//! of the index in order (a document added, a key removed, a commit) and goes on with the
//! next command: a commit on the timer, which waits for tantivy's indexing threads to write
//! their segments (tens of milliseconds on two busy cores), no longer holds the turn that
//! arrives behind it. What needs an answer (a flush, a merge, a rebuild) waits for it, and so
//! for every change handed over before.
//!
//! A change nobody waits for that fails keeps its error until the next call that can report
//! it ([`IndexThread::failed`] or [`IndexThread::call`]), as a failed commit on the timer
//! reported its own before.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use tantivy::{IndexWriter, TantivyDocument};

use crate::error::{Result, StoreError};

type Writer = IndexWriter<TantivyDocument>;
type Change = Box<dyn FnOnce(&mut Writer) + Send>;

pub(crate) struct IndexThread {
    changes: Option<Sender<Change>>,
    /// The first error of a change nobody waited for, until it is reported.
    failed: Arc<Mutex<Option<StoreError>>>,
    thread: Option<JoinHandle<()>>,
    /// The index's directory, named by its errors.
    dir: PathBuf,
}

impl IndexThread {
    /// Moves the writer of the index in `dir` to a new thread (an error when the thread cannot
    /// start: the writer is dropped, releasing the index's lock).
    pub(crate) fn start(mut writer: Writer, dir: &Path) -> Result<IndexThread> {
        let (changes, received) = mpsc::channel::<Change>();
        let thread = std::thread::Builder::new()
            .name("vilvona-index".into())
            .spawn(move || {
                for change in received {
                    change(&mut writer);
                }
            })
            .map_err(|source| StoreError::Io {
                path: dir.to_owned(),
                source,
            })?;
        Ok(IndexThread {
            changes: Some(changes),
            failed: Arc::default(),
            thread: Some(thread),
            dir: dir.to_owned(),
        })
    }

    /// Hands a change over without waiting; its error is kept for [`Self::failed`].
    pub(crate) fn post(&self, change: impl FnOnce(&mut Writer) -> Result<()> + Send + 'static) {
        let failed = Arc::clone(&self.failed);
        let sent = self.send(Box::new(move |writer| {
            if let Err(error) = change(writer) {
                failed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert(error);
            }
        }));
        if let Err(error) = sent {
            // The thread is gone: the change is lost, and the index must be rebuilt.
            self.failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert(error);
        }
    }

    /// Runs `call` after every change handed over before it and waits for its answer; when
    /// one of those failed, its error is the answer and `call` does not run.
    pub(crate) fn call<T: Send + 'static>(
        &self,
        call: impl FnOnce(&mut Writer) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (answer, answered) = mpsc::sync_channel(1);
        let failed = Arc::clone(&self.failed);
        self.send(Box::new(move |writer| {
            let earlier = failed.lock().unwrap_or_else(PoisonError::into_inner).take();
            let _ = answer.send(match earlier {
                Some(error) => Err(error),
                None => call(writer),
            });
        }))?;
        answered.recv().map_err(|_| self.stopped())?
    }

    /// The error of a change handed over earlier that failed, once.
    pub(crate) fn failed(&self) -> Result<()> {
        match self
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn send(&self, change: Change) -> Result<()> {
        self.changes
            .as_ref()
            .ok_or_else(|| self.stopped())?
            .send(change)
            .map_err(|_| self.stopped())
    }

    /// The thread ended (a change panicked): an error of the index's files, so that the
    /// store rebuilds it with a writer of its own.
    fn stopped(&self) -> StoreError {
        StoreError::Io {
            path: self.dir.clone(),
            source: std::io::Error::other("the recall index's writer thread stopped"),
        }
    }
}

impl Drop for IndexThread {
    /// The changes handed over are made, then the writer is dropped (what was not committed
    /// is discarded, as when the writer was dropped on the store's thread) and its lock freed.
    fn drop(&mut self) {
        self.changes = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::RecvTimeoutError;
    use std::time::Duration;

    use tantivy::schema::{STORED, Schema, TEXT};
    use tantivy::{Index, doc};

    use super::*;

    fn thread() -> (IndexThread, Index, tantivy::schema::Field) {
        let mut schema = Schema::builder();
        let text = schema.add_text_field("text", TEXT | STORED);
        let index = Index::create_in_ram(schema.build());
        let writer = index.writer_with_num_threads(1, 15_000_000).unwrap();
        (
            IndexThread::start(writer, Path::new("in-memory")).unwrap(),
            index,
            text,
        )
    }

    /// A change handed over does not wait for a slow one before it (the store's writer goes
    /// on); a call waits for both, in order.
    #[test]
    fn a_slow_change_holds_the_caller_only_when_it_asks() {
        let (thread, index, text) = thread();
        let (open, gate) = mpsc::channel::<()>();
        let (started, waiting) = mpsc::channel::<()>();
        thread.post(move |_| {
            started.send(()).unwrap();
            gate.recv().unwrap();
            Ok(())
        });
        waiting.recv().unwrap();
        thread.post(move |writer| Ok(writer.add_document(doc!(text => "after")).map(drop)?));
        let (answered, answer) = mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let count = thread.call(|writer| {
                    writer.commit()?;
                    Ok(writer.index().reader()?.searcher().num_docs())
                });
                answered.send(count).unwrap();
            });
            assert_eq!(
                answer.recv_timeout(Duration::from_millis(200)).unwrap_err(),
                RecvTimeoutError::Timeout,
                "a call waits for the slow change before it"
            );
            open.send(()).unwrap();
            assert_eq!(answer.recv().unwrap().unwrap(), 1);
        });
        assert_eq!(index.reader().unwrap().searcher().num_docs(), 1);
    }

    /// A change nobody waited for that failed is reported once, by `failed` or by the next
    /// call (before the call runs).
    #[test]
    fn a_failure_nobody_waited_for_is_reported_once() {
        let (thread, ..) = thread();
        thread.post(|_| Err(StoreError::InjectedFault("the first".into())));
        thread.post(|_| Err(StoreError::InjectedFault("the second".into())));
        let ran = Arc::new(Mutex::new(false));
        let marked = Arc::clone(&ran);
        let error = thread
            .call(move |_| {
                *marked.lock().unwrap() = true;
                Ok(())
            })
            .unwrap_err();
        assert!(error.to_string().contains("the first"), "{error}");
        assert!(!*ran.lock().unwrap(), "the call did not run");
        assert!(thread.failed().is_ok(), "reported once");
        thread.post(|_| Err(StoreError::InjectedFault("later".into())));
        thread.call(|_| Ok(())).unwrap_err();
    }

    /// A change that panics ends the thread: every later call names the index's directory.
    #[test]
    fn a_panicking_change_leaves_calls_failing_with_the_directory() {
        let (thread, ..) = thread();
        thread.post(|_| panic!("a change panicked"));
        let error = thread.call(|_| Ok(())).unwrap_err();
        assert!(matches!(&error, StoreError::Io { path, .. } if path == Path::new("in-memory")));
        thread.post(|_| Ok(()));
        assert!(thread.failed().is_err());
    }
}
