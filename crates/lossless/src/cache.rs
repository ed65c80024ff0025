//! The engine's bounded caches, so assembly and compaction parse only what is new: rendered
//! context items ([`RenderedItems`], by their [`Rendition`]) and the last assembly of recently
//! assembled conversations ([`Assemblies`]). Both are bounded by estimated bytes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use vilvona_core::engine::*;
use vilvona_core::message::AgentMessage;
use vilvona_store::*;

/// A cache's lock, taken even when a panic poisoned it (a cache is never left half-changed).
pub(crate) fn lock_map<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Bytes the rendered items may take together, estimated from their tokens (a few contexts'
/// worth; two generations of half each).
pub(crate) const RENDERED_BYTES: usize = 16 << 20;

/// Bytes the kept assemblies may take together, estimated from their tokens (a gateway with
/// thousands of sessions keeps the recently active ones; the others are rebuilt from the
/// store).
const ASSEMBLED_BYTES: usize = 16 << 20;

/// What `items` items of `tokens` tokens together cost held in memory: about four bytes of
/// text a token, and each message's structure around it.
fn estimated_bytes(tokens: u64, items: usize) -> usize {
    usize::try_from(tokens)
        .unwrap_or(usize::MAX / 8)
        .saturating_mul(4)
        .saturating_add(items.saturating_mul(256))
}

/// One rendering of a context item. A message never changes; a summary is rewritten in place
/// (re-summarized, or narrowed by forgetting; here or by another process), which changes its
/// tokens, level or span: a rendering of the old text is then not this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Rendition {
    pub(crate) item: ItemRef,
    summary: Option<(u64, SummaryShape)>,
}

impl Rendition {
    pub(crate) fn of(entry: &ContextRef) -> Rendition {
        Rendition {
            item: entry.item,
            summary: entry.summary.map(|shape| (entry.tokens, shape)),
        }
    }

    pub(crate) fn message(id: MessageId) -> Rendition {
        Rendition {
            item: ItemRef::Message(id),
            summary: None,
        }
    }
}

/// A rendered item: the rendition, the message, a message's seq, and its estimated bytes.
type RenderedEntry = (Rendition, Arc<AgentMessage>, Option<u64>, usize);

/// Rendered context items, so assembly and compaction parse only what is new. An entry is used
/// only for the same rendition; one that left the context is dropped. Bounded by estimated
/// bytes in two generations: when the young one fills, the old one is dropped whole and the
/// young one takes its place; an old entry used again becomes young.
#[derive(Default)]
pub(crate) struct RenderedItems {
    young: HashMap<ItemRef, RenderedEntry>,
    old: HashMap<ItemRef, RenderedEntry>,
    young_bytes: usize,
    old_bytes: usize,
}

impl RenderedItems {
    pub(crate) fn get(&mut self, rendition: &Rendition) -> Option<Arc<AgentMessage>> {
        self.get_with_seq(rendition).map(|(message, _)| message)
    }

    /// The rendering, and for a message its seq.
    pub(crate) fn get_with_seq(
        &mut self,
        rendition: &Rendition,
    ) -> Option<(Arc<AgentMessage>, Option<u64>)> {
        if let Some((kept, message, seq, _)) = self.young.get(&rendition.item) {
            return (kept == rendition).then(|| (Arc::clone(message), *seq));
        }
        let (kept, message, seq, bytes) = self.old.remove(&rendition.item)?;
        self.old_bytes -= bytes;
        if kept != *rendition {
            return None;
        }
        self.insert((kept, Arc::clone(&message), seq, bytes));
        Some((message, seq))
    }

    /// Keeps a rendering of `tokens` tokens; `seq` for a message.
    pub(crate) fn keep(
        &mut self,
        rendition: Rendition,
        message: Arc<AgentMessage>,
        seq: Option<u64>,
        tokens: u64,
    ) {
        self.insert((rendition, message, seq, estimated_bytes(tokens, 1)));
    }

    fn insert(&mut self, entry: RenderedEntry) {
        let item = entry.0.item;
        self.young_bytes += entry.3;
        if let Some((_, _, _, replaced)) = self.young.insert(item, entry) {
            self.young_bytes -= replaced;
        }
        if let Some((_, _, _, stale)) = self.old.remove(&item) {
            self.old_bytes -= stale;
        }
        if self.young_bytes > RENDERED_BYTES / 2 {
            self.old = std::mem::take(&mut self.young);
            self.old_bytes = std::mem::take(&mut self.young_bytes);
        }
    }

    /// Drops items that left the context (a summary took their place).
    pub(crate) fn forget(&mut self, items: impl IntoIterator<Item = ItemRef>) {
        for item in items {
            if let Some((_, _, _, bytes)) = self.young.remove(&item) {
                self.young_bytes -= bytes;
            }
            if let Some((_, _, _, bytes)) = self.old.remove(&item) {
                self.old_bytes -= bytes;
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        *self = RenderedItems::default();
    }

    /// Items kept, and their estimated bytes.
    pub(crate) fn size(&self) -> (usize, usize) {
        (
            self.young.len() + self.old.len(),
            self.young_bytes + self.old_bytes,
        )
    }
}

/// The last assembly of recently assembled conversations, least recently used evicted first.
#[derive(Default)]
pub(crate) struct Assemblies {
    entries: HashMap<ConversationId, KeptAssembly>,
    items: usize,
    bytes: usize,
    clock: u64,
}

struct KeptAssembly {
    used: u64,
    items: Vec<Rendition>,
    messages: Messages,
    bytes: usize,
}

impl Assemblies {
    pub(crate) fn take(
        &mut self,
        conversation: ConversationId,
    ) -> Option<(Vec<Rendition>, Messages)> {
        let kept = self.entries.remove(&conversation)?;
        self.items -= kept.items.len();
        self.bytes -= kept.bytes;
        Some((kept.items, kept.messages))
    }

    /// Keeps a conversation's assembly of `tokens` tokens.
    pub(crate) fn keep(
        &mut self,
        conversation: ConversationId,
        items: Vec<Rendition>,
        messages: Messages,
        tokens: u64,
    ) {
        self.take(conversation);
        self.clock += 1;
        let bytes = estimated_bytes(tokens, items.len());
        self.items += items.len();
        self.bytes += bytes;
        let kept = KeptAssembly {
            used: self.clock,
            items,
            messages,
            bytes,
        };
        self.entries.insert(conversation, kept);
        while self.bytes > ASSEMBLED_BYTES && self.entries.len() > 1 {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, kept)| kept.used)
                .map(|(id, _)| *id)
            else {
                break;
            };
            self.take(oldest);
        }
    }

    /// Context items the kept assemblies hold together, and their estimated bytes.
    pub(crate) fn size(&self) -> (usize, usize) {
        (self.items, self.bytes)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}
