//! The index keys of forgotten rows, as both backends queue them for the index to drop. Each
//! backend's `forget` module applies a [`crate::types::ForgetPlan`] in its own SQL.

use crate::index::IndexedRow;

/// The index key of a row, as `index_tasks` holds it.
pub(crate) fn task_key(row: IndexedRow) -> i64 {
    match row {
        IndexedRow::Message(id) => id << 1,
        IndexedRow::Summary(id) => (id << 1) | 1,
    }
}

pub(crate) fn task_row(key: i64) -> IndexedRow {
    if key & 1 == 0 {
        IndexedRow::Message(key >> 1)
    } else {
        IndexedRow::Summary(key >> 1)
    }
}
