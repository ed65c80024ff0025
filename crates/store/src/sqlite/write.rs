//! The write transaction every write statement passes through.
//!
//! [`WriteTx`] is the writer's only door to the database while it writes: it owns the SQLite
//! transaction and hands out [`WriteStatement`]s, whose `execute` counts the statement. With the
//! `fault-injection` feature a [`FaultPlan`] turns the N-th counted statement into a failure or
//! a "killed" writer, so the N-th-write tests reach every write without hand-placed hooks.

use std::cell::Cell;

use rusqlite::{CachedStatement, Connection, MappedRows, Params, Row, Transaction};

use crate::error::{Result, StoreError};

/// Faults the writer injects at chosen write statements (tests only).
#[cfg_attr(not(feature = "fault-injection"), allow(unreachable_pub))]
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultPlan {
    /// The N-th write statement (1-based, counted across the store's life) fails; its
    /// transaction rolls back and the caller gets the error.
    pub fail_write_at: Option<u64>,
    /// At the N-th write statement the writer stops as a killed process would: the open
    /// transaction is lost, the index is not committed, every later call fails.
    pub crash_at_write: Option<u64>,
    /// The index is never committed, as if the process died after each SQLite commit.
    pub skip_index_commits: bool,
}

/// Write statements counted over the writer's life, and the faults planned at them.
#[derive(Debug, Default)]
pub(crate) struct WriteCounter {
    writes: Cell<u64>,
    crashed: Cell<bool>,
    plan: FaultPlan,
}

impl WriteCounter {
    pub(crate) fn new(plan: FaultPlan) -> WriteCounter {
        WriteCounter {
            plan,
            ..WriteCounter::default()
        }
    }

    /// True once a planned crash happened: the writer behaves as a dead process.
    pub(crate) fn crashed(&self) -> bool {
        self.crashed.get()
    }

    /// The index is never committed (as if the process died after each SQLite commit).
    pub(crate) fn skips_index_commits(&self) -> bool {
        self.plan.skip_index_commits || self.crashed()
    }

    /// Counts one write statement and applies the plan to it.
    fn count(&self) -> Result<()> {
        let writes = self.writes.get() + 1;
        self.writes.set(writes);
        if self.plan.crash_at_write == Some(writes) {
            self.crashed.set(true);
            return Err(StoreError::InjectedFault(format!(
                "writer killed at write {writes}"
            )));
        }
        if self.plan.fail_write_at == Some(writes) {
            return Err(StoreError::InjectedFault(format!("write {writes} failed")));
        }
        Ok(())
    }
}

/// An open write transaction. Dropped without [`WriteTx::commit`], it rolls back.
pub(crate) struct WriteTx<'c> {
    transaction: Transaction<'c>,
    counter: &'c WriteCounter,
}

impl<'c> WriteTx<'c> {
    pub(crate) fn new(transaction: Transaction<'c>, counter: &'c WriteCounter) -> WriteTx<'c> {
        WriteTx {
            transaction,
            counter,
        }
    }

    /// A statement of this transaction (cached by its SQL).
    pub(crate) fn prepare_cached(&self, sql: &str) -> Result<WriteStatement<'_>> {
        Ok(WriteStatement {
            statement: self.transaction.prepare_cached(sql)?,
            counter: self.counter,
        })
    }

    /// The transaction's view for the read functions (`read::…`), which only select.
    pub(crate) fn reader(&self) -> &Connection {
        &self.transaction
    }

    pub(crate) fn last_insert_rowid(&self) -> i64 {
        self.transaction.last_insert_rowid()
    }

    pub(crate) fn commit(self) -> Result<()> {
        Ok(self.transaction.commit()?)
    }
}

/// A statement of a [`WriteTx`]: `execute` is counted; the queries must only read.
pub(crate) struct WriteStatement<'t> {
    statement: CachedStatement<'t>,
    counter: &'t WriteCounter,
}

impl WriteStatement<'_> {
    /// Runs a write statement (counted).
    pub(crate) fn execute(&mut self, params: impl Params) -> Result<usize> {
        self.counter.count()?;
        Ok(self.statement.execute(params)?)
    }

    /// One row of a query that only reads.
    pub(crate) fn query_row<T>(
        &mut self,
        params: impl Params,
        map: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        debug_assert!(self.statement.readonly(), "a write went through query_row");
        self.statement.query_row(params, map)
    }

    /// The rows of a query that only reads.
    pub(crate) fn query_map<T, F>(
        &mut self,
        params: impl Params,
        map: F,
    ) -> rusqlite::Result<MappedRows<'_, F>>
    where
        F: FnMut(&Row<'_>) -> rusqlite::Result<T>,
    {
        debug_assert!(self.statement.readonly(), "a write went through query_map");
        self.statement.query_map(params, map)
    }
}
