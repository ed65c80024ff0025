//! The summary DAG as a graph (petgraph), built from the edge table: the structural checks of
//! the integrity report, and the view `vilvona context dag` draws.

use std::collections::HashSet;

use petgraph::algo::is_cyclic_directed;
use petgraph::graphmap::DiGraphMap;
use petgraph::visit::Dfs;
use rusqlite::{Connection, params};

use crate::error::Result;
use crate::types::*;

/// A row of the DAG.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Node {
    Message(i64),
    Summary(i64),
}

fn node(message: Option<i64>, summary: Option<i64>) -> Option<Node> {
    message
        .map(Node::Message)
        .or_else(|| summary.map(Node::Summary))
}

/// Problems of the DAG's shape across the whole store: a cycle, and rows no context reaches
/// (following edges down from every context item).
pub(crate) fn structure_problems(connection: &Connection) -> Result<Vec<String>> {
    let ids = |sql: &str| -> Result<Vec<i64>> {
        let mut statement = connection.prepare(sql)?;
        let ids = statement
            .query_map([], |row| row.get::<_, i64>(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(ids)
    };
    let messages = ids("SELECT id FROM messages")?;
    let mut statement = connection.prepare("SELECT id, conversation_id FROM summaries")?;
    let summaries = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut statement = connection
        .prepare("SELECT parent_id, child_message_id, child_summary_id FROM summary_edges")?;
    let edges = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut statement = connection.prepare("SELECT message_id, summary_id FROM context_items")?;
    let roots = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(problems_of(&messages, &summaries, &edges, &roots))
}

/// The structural problems of a store's rows, whichever database they were read from: a
/// cycle, a row under two summaries of one conversation (each conversation folds a row once; a
/// fork and its parent may each fold it), and rows that no context item reaches. `summaries`
/// are (id, conversation); `edges` (parent, child message, child summary); `roots` the context
/// items' (message, summary).
pub(crate) fn problems_of(
    messages: &[i64],
    summaries: &[(i64, i64)],
    edges: &[(i64, Option<i64>, Option<i64>)],
    roots: &[(Option<i64>, Option<i64>)],
) -> Vec<String> {
    let mut graph: DiGraphMap<Node, ()> = DiGraphMap::new();
    for id in messages {
        graph.add_node(Node::Message(*id));
    }
    let conversation_of: std::collections::HashMap<i64, i64> = summaries.iter().copied().collect();
    for (id, _) in summaries {
        graph.add_node(Node::Summary(*id));
    }
    // (child, the parent's conversation): a second edge is a second fold.
    let mut folded: HashSet<(Node, i64)> = HashSet::with_capacity(edges.len());
    let mut folded_twice = 0;
    for (parent, message, summary) in edges {
        if let (Some(child), Some(conversation)) =
            (node(*message, *summary), conversation_of.get(parent))
            && !folded.insert((child, *conversation))
        {
            folded_twice += 1;
        }
    }
    for (parent, message, summary) in edges {
        let parent = Node::Summary(*parent);
        // Edges to rows that do not exist are reported by their own check.
        if let Some(child) = node(*message, *summary)
            && graph.contains_node(parent)
            && graph.contains_node(child)
        {
            graph.add_edge(parent, child, ());
        }
    }
    let mut problems = Vec::new();
    if is_cyclic_directed(&graph) {
        problems.push(
            "the summary DAG has a cycle (a summary is below itself); restore the database from a backup"
                .to_owned(),
        );
    }
    if folded_twice > 0 {
        problems.push(format!(
            "{folded_twice} rows folded twice by one conversation (under two of its summaries); its context may show them twice"
        ));
    }
    let mut reached: HashSet<Node> = HashSet::with_capacity(graph.node_count());
    for (message, summary) in roots {
        let Some(root) = node(*message, *summary) else {
            continue;
        };
        if !graph.contains_node(root) || reached.contains(&root) {
            continue;
        }
        let mut walk = Dfs::new(&graph, root);
        while let Some(found) = walk.next(&graph) {
            reached.insert(found);
        }
    }
    let (mut messages, mut summaries) = (0, 0);
    for row in graph.nodes() {
        if !reached.contains(&row) {
            match row {
                Node::Message(_) => messages += 1,
                Node::Summary(_) => summaries += 1,
            }
        }
    }
    if messages > 0 {
        problems.push(format!("{messages} messages unreachable from the context"));
    }
    if summaries > 0 {
        problems.push(format!(
            "{summaries} summaries unreachable from the context"
        ));
    }
    problems
}

pub use vilvona_core::admin::{DagSummary, DagView};

pub(crate) fn view(connection: &Connection, conversation: ConversationId) -> Result<DagView> {
    let mut view = DagView::default();
    let mut statement = connection.prepare_cached(
        "SELECT s.id, s.summary_id, s.depth, s.kind, s.tokens,
                EXISTS (SELECT 1 FROM context_items ci WHERE ci.summary_id = s.id),
                (SELECT count(*) FROM summary_edges e WHERE e.parent_id = s.id
                     AND e.child_message_id IS NOT NULL),
                (SELECT coalesce(sum(m.tokens), 0) FROM summary_edges e
                     JOIN messages m ON m.id = e.child_message_id WHERE e.parent_id = s.id),
                s.level, s.summarizer, s.created_at, s.earliest_at, s.latest_at
         FROM summaries s WHERE s.conversation_id = ?1 ORDER BY s.depth DESC, s.id",
    )?;
    let rows = statement.query_map([conversation.0], |row| {
        Ok(DagSummary {
            row_id: row.get(0)?,
            summary_id: row.get(1)?,
            depth: row.get(2)?,
            kind: row.get(3)?,
            tokens: row.get::<_, i64>(4)?.max(0) as u64,
            in_context: row.get(5)?,
            child_summaries: Vec::new(),
            child_messages: row.get::<_, i64>(6)?.max(0) as u64,
            child_message_tokens: row.get::<_, i64>(7)?.max(0) as u64,
            level: row.get(8)?,
            summarizer: row.get(9)?,
            created_at_ms: row.get(10)?,
            earliest_at_ms: row.get(11)?,
            latest_at_ms: row.get(12)?,
        })
    })?;
    for row in rows {
        view.summaries.push(row?);
    }
    let mut children = connection.prepare_cached(
        "SELECT child_summary_id FROM summary_edges
         WHERE parent_id = ?1 AND child_summary_id IS NOT NULL ORDER BY ordinal",
    )?;
    for summary in &mut view.summaries {
        summary.child_summaries = children
            .query_map(params![summary.row_id], |row| row.get(0))?
            .collect::<rusqlite::Result<_>>()?;
    }
    let (count, tokens): (i64, i64) = connection.query_row(
        "SELECT count(*), coalesce(sum(tokens), 0) FROM context_items
         WHERE conversation_id = ?1 AND message_id IS NOT NULL",
        [conversation.0],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    view.raw_messages = count.max(0) as u64;
    view.raw_message_tokens = tokens.max(0) as u64;
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_under_two_summaries_of_one_conversation_is_a_problem_and_of_two_is_not() {
        let messages = [1, 2];
        // Summaries 10 and 11 of conversation 7, 12 of its fork 8: all over message 1.
        let summaries = [(10, 7), (11, 7), (12, 8)];
        let roots = [(None, Some(10)), (None, Some(11)), (None, Some(12))];
        let fork_and_parent = [
            (10, Some(1), None),
            (10, Some(2), None),
            (12, Some(1), None),
        ];
        assert!(problems_of(&messages, &summaries[..], &fork_and_parent, &roots[..]).is_empty());
        let twice = [
            (10, Some(1), None),
            (11, Some(1), None),
            (11, Some(2), None),
        ];
        let problems = problems_of(&messages, &summaries[..2], &twice, &roots[..2]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("1 rows folded twice"),
            "{problems:?}"
        );
    }
}
