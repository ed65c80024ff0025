//! The recall tools: `vilvona_grep`, `vilvona_describe`, `vilvona_expand`, and
//! `vilvona_expand_query` (grep, expand within a cap, then one answer with citations).
//!
//! Each has a name, a description and a JSON schema a host can hand to a model, and a call API
//! that takes the calling session and JSON arguments and returns JSON. Every read is scoped:
//! the caller's conversation and its earlier sessions (same session key); other conversations
//! of the agent only when the config allows; other agents only when the config names them; a
//! subagent also reaches what its live grants allow.

use serde_json::{Value, json};
use vilvona_core::admin::{ToolCaller, ToolDefinition};
use vilvona_core::summarize::{Evidence, QuestionRequest, SummarizeError, SummaryKind};
use vilvona_store::*;
use vilvona_summarize::format_utc_rfc3339;

use crate::arguments;
use crate::dates;
use crate::engine::LosslessEngine;
use crate::errors::ToolError;
use crate::render::{DESCRIBE_TOOL, EXPAND_QUERY_TOOL, EXPAND_TOOL, GREP_TOOL};

/// Hits of the query `vilvona_expand_query` reads evidence from.
const QUESTION_HITS: u64 = 8;
/// Tokens an answer may take.
const ANSWER_TOKENS: u64 = 400;

/// Most bytes of stored content one `vilvona_describe` call returns.
const MAX_DESCRIBE_BYTES: usize = 64 * 1024;
/// Hex digits of a whole summary id (`sum_` and 16).
const SUMMARY_ID_DIGITS: usize = 16;
/// The fewest digits that name a summary by the start of its id (the DAG picture shows 8).
const MIN_ID_PREFIX: usize = 6;

/// The recall tools.
pub fn tool_definitions() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: GREP_TOOL.to_owned(),
            description: "Search the full conversation history, including parts folded into summaries, \
                          by words and meaning together (hybrid, the default: a question need not use \
                          the answer's words), by words only (text, phrase, regex) or by meaning only \
                          (semantic). A date the query names (2026-05-14, May 2026, May 14 2026) puts what was written \
                          then first. Returns matching messages and summaries with snippets; a message hit names the \
                          summary that currently covers it.".to_owned(),
            parameters: arguments::schema::<arguments::Grep>(),
        },
        ToolDefinition {
            name: DESCRIBE_TOOL.to_owned(),
            description: "Describe a summary (depth, time range, tokens, children, covered messages), a \
                          message, or stored large content (metadata, description, and a range of its lines).".to_owned(),
            parameters: arguments::schema::<arguments::Describe>(),
        },
        ToolDefinition {
            name: EXPAND_TOOL.to_owned(),
            description: "Read what a summary covers: its child summaries, or for a leaf its source messages, \
                          within a token cap. Pass the returned cursor to continue.".to_owned(),
            parameters: arguments::schema::<arguments::Expand>(),
        },
        ToolDefinition {
            name: EXPAND_QUERY_TOOL.to_owned(),
            description: "Answer a question from the full history: searches it for the query, reads the \
                          matching messages and what matching summaries cover (within tokenCap), and \
                          answers with the ids of the messages the answer rests on.".to_owned(),
            parameters: arguments::schema::<arguments::ExpandQuery>(),
        },
    ]
}

/// Where a caller may read.
pub(crate) struct Scope {
    /// `(agent, conversations)` pairs.
    pub(crate) reach: Vec<(String, Vec<ConversationId>)>,
    /// Conversations whose grant ended (for a clear refusal).
    ended: Vec<ConversationId>,
    token_cap: Option<u64>,
    pub(crate) own: Conversation,
}

impl Scope {
    /// Every conversation in reach.
    fn conversations(&self) -> Vec<ConversationId> {
        self.reach
            .iter()
            .flat_map(|(_, conversations)| conversations.iter().copied())
            .collect()
    }

    fn contains(&self, conversation: ConversationId) -> bool {
        self.reach
            .iter()
            .any(|(_, conversations)| conversations.contains(&conversation))
    }
}

pub(crate) fn message_id_string(id: MessageId) -> String {
    format!("msg_{}", id.0)
}

fn kind_name(kind: SummaryKind) -> &'static str {
    match kind {
        SummaryKind::Leaf => "leaf",
        SummaryKind::Condensed => "condensed",
    }
}

fn time(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |ms| Value::String(format_utc_rfc3339(ms)))
}

impl LosslessEngine {
    /// Calls a recall tool for `caller`.
    pub async fn call_tool(
        &self,
        caller: &ToolCaller,
        name: &str,
        arguments: &Value,
    ) -> Result<Value, ToolError> {
        match name {
            GREP_TOOL => self.grep_tool(caller, arguments::parse(arguments)?).await,
            DESCRIBE_TOOL => {
                self.describe_tool(caller, arguments::parse(arguments)?)
                    .await
            }
            EXPAND_TOOL => self.expand_tool(caller, arguments::parse(arguments)?).await,
            EXPAND_QUERY_TOOL => {
                self.expand_query_tool(caller, arguments::parse(arguments)?)
                    .await
            }
            other => Err(ToolError::UnknownTool(other.to_owned())),
        }
    }

    pub(crate) async fn scope(&self, caller: &ToolCaller) -> Result<Scope, ToolError> {
        let store = self.store();
        let config = self.config();
        // Isolation follows the agent, not only the session id: a key of another agent
        // (`agent:<id>:…`, OpenClaw's form) does not read this agent's sessions.
        if let Some(key_agent) = caller
            .session_key
            .as_deref()
            .and_then(|key| key.strip_prefix("agent:"))
            .and_then(|rest| rest.split(':').next())
            .filter(|key_agent| *key_agent != config.agent_id)
        {
            return Err(ToolError::OtherAgent {
                key_agent: key_agent.to_owned(),
                agent: config.agent_id.clone(),
            });
        }
        let own = self
            .conversation(&caller.session_id, caller.session_key.as_deref())
            .await?;
        // The key's other sessions and its grants, read at once (a read waits for a thread of
        // its own: one after the other, a search waited for both).
        let (by_key, grants) = match &caller.session_key {
            Some(key) => tokio::try_join!(
                store.conversations_by_session_key(&config.agent_id, key),
                store.grants(key),
            )?,
            None => (Vec::new(), Vec::new()),
        };
        let mut mine = vec![own.id];
        for conversation in by_key {
            if !mine.contains(&conversation.id) {
                mine.push(conversation.id);
            }
        }
        if config.recall_all_conversations {
            for conversation in store.conversations(Some(&config.agent_id)).await? {
                if !mine.contains(&conversation.id) {
                    mine.push(conversation.id);
                }
            }
        }
        let mut ended = Vec::new();
        let mut token_cap = None;
        let now = self.now_ms();
        for grant in grants {
            if grant.revoked || grant.expires_at_ms <= now {
                ended.push(grant.conversation);
                continue;
            }
            if !mine.contains(&grant.conversation) {
                mine.push(grant.conversation);
            }
            token_cap =
                Some(token_cap.map_or(grant.token_cap, |cap: u64| cap.min(grant.token_cap)));
        }
        let mut reach = vec![(config.agent_id.clone(), mine)];
        for agent in &config.recall_agents {
            let conversations = store
                .conversations(Some(agent))
                .await?
                .into_iter()
                .map(|c| c.id)
                .collect();
            reach.push((agent.clone(), conversations));
        }
        Ok(Scope {
            reach,
            ended,
            token_cap,
            own,
        })
    }

    /// The summary an id names: a whole id (`sum_…`), or the start of one as the DAG picture
    /// labels it (`fbe93013` or `sum_fbe93013`) when exactly one summary in reach starts so.
    async fn summary_named(&self, scope: &Scope, id: &str) -> Result<StoredSummary, ToolError> {
        if let Some(summary) = self.store().summary_by_id(id).await? {
            return Ok(summary);
        }
        let digits = id.strip_prefix("sum_").unwrap_or(id);
        if !(MIN_ID_PREFIX..SUMMARY_ID_DIGITS).contains(&digits.len())
            || !digits.bytes().all(|byte| byte.is_ascii_hexdigit())
        {
            return Err(ToolError::NotFound(id.to_owned()));
        }
        let prefix = format!("sum_{}", digits.to_ascii_lowercase());
        let mut named = Vec::new();
        for conversation in scope.conversations() {
            let view = self.store().dag_view(conversation).await?;
            named.extend(
                view.summaries
                    .into_iter()
                    .map(|summary| summary.summary_id)
                    .filter(|summary_id| summary_id.starts_with(&prefix)),
            );
        }
        match named.as_slice() {
            [] => Err(ToolError::NotFound(id.to_owned())),
            [whole] => self
                .store()
                .summary_by_id(whole)
                .await?
                .ok_or_else(|| ToolError::NotFound(id.to_owned())),
            several => Err(ToolError::InvalidArguments(format!(
                "{id} starts {} summary ids ({}, …): give more of it",
                several.len(),
                several[..2].join(", ")
            ))),
        }
    }

    fn check_scope(
        &self,
        scope: &Scope,
        conversation: ConversationId,
        id: &str,
    ) -> Result<(), ToolError> {
        if scope.contains(conversation) {
            Ok(())
        } else if scope.ended.contains(&conversation) {
            Err(ToolError::GrantEnded(id.to_owned()))
        } else {
            Err(ToolError::OutOfScope(id.to_owned()))
        }
    }

    /// The summary that currently covers an item: its topmost ancestor.
    async fn covering_summary(&self, item: ItemRef) -> Result<Option<StoredSummary>, ToolError> {
        Ok(self.store().top_ancestor(item).await?)
    }

    async fn grep_tool(
        &self,
        caller: &ToolCaller,
        arguments: arguments::Grep,
    ) -> Result<Value, ToolError> {
        let query = arguments::required(arguments.query, "query")?;
        let (mode, target, order) = (arguments.mode.0, arguments.scope.0, arguments.order.0);
        let limit = match arguments.limit {
            None => 10,
            Some(limit) if (1..=50).contains(&limit) => limit as usize,
            Some(_) => {
                return Err(ToolError::InvalidArguments(
                    "limit must be between 1 and 50".to_owned(),
                ));
            }
        };
        let since_ms = arguments::millis(arguments.since, "since")?;
        let before_ms = arguments::millis(arguments.before, "before")?;
        let scope = self.scope(caller).await?;
        let search = SearchQuery {
            agent_id: String::new(),
            conversations: Vec::new(),
            text: query.clone(),
            mode,
            target,
            since_ms,
            before_ms,
            limit,
            order,
        };
        let (hits, named) = self.search_dated(&scope, search).await?;
        let dated = named.map(|(date, hits)| {
            json!({
                "said": date.said,
                "since": format_utc_rfc3339(date.since_ms),
                "before": format_utc_rfc3339(date.before_ms),
                "hits": hits,
            })
        });
        let mut results = Vec::with_capacity(hits.len());
        for hit in hits {
            let mut entry = json!({
                "time": time(Some(hit.time_ms)),
                "snippet": hit.snippet,
                "score": hit.score,
            });
            match &hit.source {
                HitSource::Message { id, seq, role } => {
                    entry["id"] = json!(message_id_string(*id));
                    entry["kind"] = json!("message");
                    entry["role"] = json!(role);
                    entry["seq"] = json!(seq);
                }
                HitSource::Summary {
                    summary_id,
                    depth,
                    kind,
                    ..
                } => {
                    entry["id"] = json!(summary_id);
                    entry["kind"] = json!("summary");
                    entry["depth"] = json!(depth);
                    entry["summaryKind"] = json!(kind_name(*kind));
                }
            }
            if let Some(covering) = &hit.covered_by {
                entry["coveredBy"] = json!(covering);
            }
            if let Some(file) = &hit.file {
                entry["file"] = json!(file);
            }
            if hit.conversation != scope.own.id {
                entry["conversation"] = json!(hit.conversation.0);
            }
            results.push(entry);
        }
        let mut answer = json!({"query": query, "results": results});
        if let Some(dated) = dated {
            answer["dated"] = dated;
        }
        Ok(answer)
    }

    /// A search in which a date the question names selects what was written then, unless the
    /// query sets times of its own: those hits first (searched by the question's other words),
    /// then the undated search's, when there is room for them. Also answers the date named and
    /// how many hits it gave.
    pub(crate) async fn search_dated(
        &self,
        scope: &Scope,
        search: SearchQuery,
    ) -> Result<(Vec<SearchHit>, Option<(dates::NamedDate, usize)>), ToolError> {
        let named = match (search.since_ms, search.before_ms, search.mode) {
            (None, None, SearchMode::Text | SearchMode::Hybrid | SearchMode::Semantic) => {
                dates::named_date(&search.text).filter(|date| !date.rest.is_empty())
            }
            _ => None,
        };
        let mut hits = Vec::new();
        let mut dated = None;
        if let Some(date) = named {
            hits = self
                .search_reach(
                    scope,
                    SearchQuery {
                        text: date.rest.clone(),
                        since_ms: Some(date.since_ms),
                        before_ms: Some(date.before_ms),
                        ..search.clone()
                    },
                )
                .await?;
            let found = hits.len();
            dated = Some((date, found));
        }
        if hits.len() < search.limit {
            let room = search.limit - hits.len();
            let undated = self.search_reach(scope, search).await?;
            let first: Vec<HitSource> = hits.iter().map(|hit| hit.source.clone()).collect();
            hits.extend(
                undated
                    .into_iter()
                    .filter(|hit| !first.contains(&hit.source))
                    .take(room),
            );
        }
        Ok((hits, dated))
    }

    /// One search over every conversation the scope reaches (each agent's conversations in
    /// turn, `search`'s agent and conversations set to them): its best `search.limit` hits.
    async fn search_reach(
        &self,
        scope: &Scope,
        search: SearchQuery,
    ) -> Result<Vec<SearchHit>, ToolError> {
        let mut hits = Vec::new();
        for (agent, conversations) in &scope.reach {
            let query = SearchQuery {
                agent_id: agent.clone(),
                conversations: conversations.clone(),
                ..search.clone()
            };
            hits.extend(self.store().search(query).await.map_err(search_error)?);
        }
        if scope.reach.len() > 1 {
            match search.order {
                SearchOrder::Relevance => hits.sort_by(|a, b| b.score.total_cmp(&a.score)),
                SearchOrder::Recency => hits.sort_by_key(|hit| std::cmp::Reverse(hit.time_ms)),
            }
            hits.truncate(search.limit);
        }
        Ok(hits)
    }

    async fn describe_tool(
        &self,
        caller: &ToolCaller,
        arguments: arguments::Describe,
    ) -> Result<Value, ToolError> {
        let id = arguments::required(arguments.id, "id")?;
        let scope = self.scope(caller).await?;
        if id.starts_with("file_") {
            let info = self
                .store()
                .blob_info(&id)
                .await?
                .ok_or_else(|| ToolError::NotFound(id.clone()))?;
            // Scoped by reference: any conversation whose messages reference it may read it.
            let readers = self.store().blob_readers(&id).await?;
            let reader = readers
                .iter()
                .copied()
                .find(|conversation| scope.contains(*conversation))
                .unwrap_or(info.conversation);
            self.check_scope(&scope, reader, &id)?;
            let content = self.store().blob_content(&id).await?.unwrap_or_default();
            let (first, last) = match arguments.lines {
                None => (1, 200),
                Some(range) => {
                    let (a, b) = range.split_once('-').unwrap_or((&range, &range));
                    let parse = |text: &str| {
                        text.trim().parse::<usize>().map_err(|_| {
                            ToolError::InvalidArguments(format!(
                                "lines {range:?}: use a range like \"1-200\""
                            ))
                        })
                    };
                    (parse(a)?.max(1), parse(b)?)
                }
            };
            let lines: Vec<&str> = content
                .lines()
                .skip(first - 1)
                .take(last.saturating_sub(first) + 1)
                .collect();
            let mut shown = lines.join("\n");
            // A range of huge lines (a 50 MB line of minified output) is cut, and says so.
            let truncated = shown.len() > MAX_DESCRIBE_BYTES;
            if truncated {
                let mut end = MAX_DESCRIBE_BYTES;
                while !shown.is_char_boundary(end) {
                    end -= 1;
                }
                shown.truncate(end);
            }
            let mut described = json!({
                "id": info.blob_id,
                "kind": info.kind,
                "bytes": info.bytes,
                "lines": info.lines,
                "description": info.description,
                "range": format!("{first}-{}", first + lines.len().saturating_sub(1)),
                "content": shown,
            });
            if truncated {
                described["truncatedAtBytes"] = json!(MAX_DESCRIBE_BYTES);
            }
            return Ok(described);
        }
        if let Some(number) = id.strip_prefix("msg_") {
            let mut message_id = number
                .parse::<i64>()
                .map(MessageId)
                .map_err(|_| ToolError::InvalidArguments(format!("{id} is not a message id")))?;
            let mut message = self.store().message(message_id).await?;
            // An imported session's messages have new ids: the one a citation names may be a
            // former id of a message in scope.
            let mine = message
                .as_ref()
                .is_some_and(|found| scope.contains(found.conversation));
            let mut former = None;
            if !mine
                && let Some(now) = self
                    .imported_message_id(&scope.conversations(), message_id.0)
                    .await?
            {
                former = Some(id.clone());
                message_id = now;
                message = self.store().message(now).await?;
            }
            let message = message.ok_or_else(|| ToolError::NotFound(id.clone()))?;
            let id = message_id_string(message_id);
            self.check_scope(&scope, message.conversation, &id)?;
            let covering = self.covering_summary(ItemRef::Message(message_id)).await?;
            let mut described = json!({
                "id": id,
                "kind": "message",
                "role": message.role,
                "seq": message.seq,
                "time": time(Some(message.created_at_ms)),
                "tokens": message.tokens,
                "coveredBy": covering.map(|summary| summary.summary_id),
                "text": message.text(),
            });
            if let Some(former) = former {
                described["formerId"] = json!(former);
            }
            return Ok(described);
        }
        let summary = self.summary_named(&scope, &id).await?;
        self.check_scope(&scope, summary.conversation, &id)?;
        let children = self.store().children(summary.row_id).await?;
        let child_ids: Vec<String> = children
            .iter()
            .map(|child| match child {
                ItemContent::Message(message) => message_id_string(message.id),
                ItemContent::Summary(summary) => summary.summary_id.clone(),
            })
            .collect();
        let child_tokens: u64 = children
            .iter()
            .map(|child| match child {
                ItemContent::Message(message) => message.tokens,
                ItemContent::Summary(summary) => summary.tokens,
            })
            .sum();
        Ok(json!({
            "id": summary.summary_id,
            "kind": kind_name(summary.kind),
            "depth": summary.depth,
            "level": format!("{:?}", summary.level).to_lowercase(),
            "earliest": time(summary.earliest_at_ms),
            "latest": time(summary.latest_at_ms),
            "tokens": summary.tokens,
            "childTokens": child_tokens,
            "coveredMessages": {"firstSeq": summary.first_seq, "lastSeq": summary.last_seq},
            "children": child_ids,
            "summarizer": summary.summarizer,
            "content": summary.content,
        }))
    }

    async fn expand_tool(
        &self,
        caller: &ToolCaller,
        arguments: arguments::Expand,
    ) -> Result<Value, ToolError> {
        let id = arguments::required(arguments.id, "id")?;
        let requested = arguments.token_cap;
        let cursor = arguments.cursor.unwrap_or(0) as usize;
        if id.starts_with("msg_") || id.starts_with("file_") {
            return Err(ToolError::InvalidArguments(format!(
                "{id} is not a summary: vilvona_expand takes a summary id (sum_…); vilvona_describe reads a message or a file"
            )));
        }
        let scope = self.scope(caller).await?;
        let summary = self.summary_named(&scope, &id).await?;
        self.check_scope(&scope, summary.conversation, &id)?;
        let mut cap = requested
            .unwrap_or(self.config().max_expand_tokens)
            .min(self.config().max_expand_tokens);
        if summary.conversation != scope.own.id
            && let Some(grant_cap) = scope.token_cap
        {
            cap = cap.min(grant_cap);
        }
        let children = self.store().children(summary.row_id).await?;
        if cursor > 0 && cursor >= children.len() {
            return Err(ToolError::InvalidArguments(format!(
                "cursor {cursor} is past the last child: {} has {} (cursors 0–{})",
                summary.summary_id,
                children.len(),
                children.len().saturating_sub(1)
            )));
        }
        let mut items = Vec::new();
        let mut used = 0;
        let mut next = None;
        for (index, child) in children.iter().enumerate().skip(cursor) {
            let (value, tokens) = match child {
                ItemContent::Message(message) => (
                    json!({"id": message_id_string(message.id), "kind": "message", "role": message.role,
                           "seq": message.seq, "time": time(Some(message.created_at_ms)), "text": message.text()}),
                    message.tokens,
                ),
                ItemContent::Summary(child) => (
                    json!({"id": child.summary_id, "kind": "summary", "depth": child.depth,
                           "earliest": time(child.earliest_at_ms), "latest": time(child.latest_at_ms), "content": child.content}),
                    child.tokens,
                ),
            };
            if used + tokens > cap && !items.is_empty() {
                next = Some(index);
                break;
            }
            used += tokens;
            items.push(value);
            if used >= cap {
                next = (index + 1 < children.len()).then_some(index + 1);
                break;
            }
        }
        Ok(json!({
            "id": summary.summary_id,
            "kind": kind_name(summary.kind),
            "depth": summary.depth,
            "items": items,
            "tokens": used,
            "nextCursor": next,
            "total": children.len(),
        }))
    }
}

impl LosslessEngine {
    /// Grep for the query, read the hits (a message's text; what a summary covers, the
    /// children that mention the query first) within the token cap, then one answer from the
    /// summarizer's model — extractive when there is none or it fails — citing what it used.
    async fn expand_query_tool(
        &self,
        caller: &ToolCaller,
        arguments: arguments::ExpandQuery,
    ) -> Result<Value, ToolError> {
        let query = arguments::required(arguments.query, "query")?;
        let question = arguments::required(arguments.question, "question")?;
        let cap = match arguments.token_cap {
            None => self.config().max_expand_tokens,
            Some(cap) if cap >= 100 => cap,
            Some(_) => {
                return Err(ToolError::InvalidArguments(
                    "tokenCap must be an integer of at least 100".to_owned(),
                ));
            }
        };
        let found = self
            .grep_tool(
                caller,
                arguments::Grep {
                    query: Some(query.clone()),
                    // The tool's default: by words and by meaning (text alone when no
                    // embedding model is configured).
                    limit: Some(QUESTION_HITS),
                    ..arguments::Grep::default()
                },
            )
            .await?;
        let words: Vec<String> = query
            .split(|c: char| !c.is_alphanumeric())
            .filter(|word| !word.is_empty())
            .map(str::to_lowercase)
            .collect();
        let mentions = |text: &str| {
            let lower = text.to_lowercase();
            words.iter().any(|word| lower.contains(word.as_str()))
        };
        let estimator = &self.inner.estimator;
        let mut evidence: Vec<Evidence> = Vec::new();
        let mut used = 0;
        let mut offer = |evidence_list: &mut Vec<Evidence>, item: Evidence| -> bool {
            if evidence_list.iter().any(|known| known.id == item.id) {
                return true;
            }
            let tokens = estimator.text_tokens(&item.text);
            if used + tokens > cap {
                return false;
            }
            used += tokens;
            evidence_list.push(item);
            true
        };
        for hit in found["results"].as_array().into_iter().flatten() {
            let id = hit["id"].as_str().unwrap_or_default();
            if let Some(number) = id.strip_prefix("msg_").and_then(|n| n.parse::<i64>().ok()) {
                let Some(message) = self.store().message(MessageId(number)).await? else {
                    continue;
                };
                let mut text = message.text();
                // A huge message (its match in stored large content): the hit's excerpt.
                if estimator.text_tokens(&text) > cap / 2 {
                    text = hit["snippet"].as_str().unwrap_or_default().to_owned();
                }
                offer(
                    &mut evidence,
                    Evidence {
                        id: id.to_owned(),
                        label: message.role.clone(),
                        timestamp_ms: Some(message.created_at_ms),
                        text,
                    },
                );
            } else if let Some(summary) = self.store().summary_by_id(id).await? {
                let mut children = self.store().children(summary.row_id).await?;
                // The children that mention the query first; otherwise in order.
                children.sort_by_key(|child| match child {
                    ItemContent::Message(message) => !mentions(&message.text()),
                    ItemContent::Summary(child) => !mentions(&child.content),
                });
                for child in children {
                    let item = match child {
                        ItemContent::Message(message) => Evidence {
                            id: message_id_string(message.id),
                            label: message.role.clone(),
                            timestamp_ms: Some(message.created_at_ms),
                            text: message.text(),
                        },
                        ItemContent::Summary(child) => Evidence {
                            id: child.summary_id.clone(),
                            label: "summary".to_owned(),
                            timestamp_ms: child.latest_at_ms,
                            text: child.content.clone(),
                        },
                    };
                    if !offer(&mut evidence, item) {
                        break;
                    }
                }
            }
        }
        let request = QuestionRequest {
            question: question.clone(),
            evidence,
            max_answer_tokens: ANSWER_TOKENS,
        };
        let answer = match self.inner.summarizer.answer(&request).await {
            Ok(answer) => answer,
            Err(error) => {
                if !matches!(error, SummarizeError::Unsupported) {
                    tracing::warn!(%error, "the summarizer could not answer; answering extractively");
                }
                vilvona_summarize::extractive_answer(&request, &**estimator)
            }
        };
        // Offline, a question that shares no word with its answer is answered by meaning.
        // (With a local model: a model behind an endpoint would be asked once per sentence.)
        let answer = match self.inner.store.embedder() {
            Some(embedder)
                if embedder.local()
                    && answer.citations.is_empty()
                    && answer.answered_by == vilvona_summarize::ExtractiveSummarizer::ID =>
            {
                let question_vector = embedder.embed_query(&question).ok().flatten();
                question_vector
                    .and_then(|vector| {
                        vilvona_summarize::meaning_answer(&request, &**estimator, |sentence| {
                            embedder
                                .embed_query(sentence)
                                .ok()
                                .flatten()
                                .map(|said| vilvona_embed::similarity(&said, &vector))
                        })
                    })
                    .unwrap_or(answer)
            }
            _ => answer,
        };
        Ok(json!({
            "question": question,
            "query": query,
            "answer": answer.text,
            "citations": answer.citations,
            "evidence": request.evidence.iter().map(|item| item.id.clone()).collect::<Vec<_>>(),
            "tokens": used,
            "answeredBy": answer.answered_by,
        }))
    }
}

/// A store's refusal of a search, as the tool's caller should read it.
fn search_error(error: StoreError) -> ToolError {
    match error {
        StoreError::InvalidRegex { pattern, detail } => {
            // The regex crate draws the pattern and a caret over several
            // lines: an error is one line, so its last line (what is wrong).
            let what = detail
                .lines()
                .rev()
                .find(|line| !line.trim().is_empty())
                .unwrap_or(&detail)
                .trim()
                .trim_start_matches("error: ");
            ToolError::InvalidArguments(format!("regex {pattern:?}: {what}"))
        }
        StoreError::QueryTooLarge(problem) => ToolError::InvalidArguments(problem),
        // Asking by meaning where it is off is the caller's to change.
        StoreError::NoEmbeddings => ToolError::InvalidArguments(format!(
            "{}; the lossless engine's `embedding` setting chooses one",
            StoreError::NoEmbeddings
        )),
        // So is an embedding endpoint that cannot be reached now (the
        // engine is fine; text and hybrid search work meanwhile).
        StoreError::Embedding(error) => {
            ToolError::Unavailable(format!("{error}; text and hybrid search work meanwhile"))
        }
        other => ToolError::Store(other),
    }
}
