//! A deterministic generator of coding-agent conversations in OpenClaw's transcript format,
//! with planted facts ("needles") to check recall after compaction.
//!
//! It has the shapes of `shared/workloads/gen_session.py` (a request naming a file, one to three
//! tool calls with code or log results, an answer; needles stated once by the user as "Please
//! remember: the ticket for X is OPS-NNNNN and NAME owns it."), with its own random stream:
//! same arguments, same output, but not the same bytes as the Python generator. The demo and
//! tests use it so that nothing needs Python at run time.

pub mod meaning;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use vilvona_core::message::AgentMessage;
use vilvona_transcript::{MessageEntry, SessionHeader};

const WORDS: &str = "parser cache index shard buffer token budget window summary session agent tool result \
config schema migration writer reader cursor batch commit rollback snapshot lease queue \
worker retry backoff timeout deadline latency throughput memory allocation handle stream \
request response header payload checksum digest segment column row table query plan \
error warning panic trace span metric counter gauge histogram sample bucket range offset \
layout module crate trait struct enum field method closure iterator future task runtime \
thread lock mutex channel signal socket listener client server route handler middleware";
const VERBS: &str = "refactor fix add remove rename split merge move document test benchmark profile inline \
extract simplify harden validate cache batch stream parse serialize index compact";
const MODULES: [&str; 9] = [
    "store", "engine", "assemble", "compact", "recall", "runtime", "config", "cli", "bench",
];
const EXTENSIONS: [&str; 6] = ["rs", "rs", "rs", "toml", "md", "json"];
const TOOLS: [&str; 4] = ["read", "exec", "edit", "grep"];
const PEOPLE: [&str; 10] = [
    "Priya Raman",
    "Tomasz Wojcik",
    "Amara Okafor",
    "Jonas Lindqvist",
    "Mei Tanaka",
    "Rafael Duarte",
    "Ines Moreau",
    "Kwame Mensah",
    "Sofia Petrova",
    "Arjun Mehta",
];
const SUBJECTS: [&str; 10] = [
    "staging database password rotation",
    "quarterly load test",
    "billing export job",
    "search reindex window",
    "cold storage migration",
    "on-call handover",
    "TLS certificate renewal",
    "nightly backup verification",
    "feature flag cleanup",
    "schema freeze",
];

/// A planted fact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Needle {
    pub turn: usize,
    pub subject: String,
    pub answer: String,
    pub owner: String,
    pub statement: String,
    pub question: String,
    pub query: String,
}

/// A generated session.
#[derive(Clone, Debug)]
pub struct Workload {
    pub header: SessionHeader,
    pub entries: Vec<MessageEntry>,
    /// For each turn, the range of `entries` it spans (user message first).
    pub turns: Vec<std::ops::Range<usize>>,
    pub needles: Vec<Needle>,
}

/// splitmix64: small, fast, and the same everywhere.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.next() as usize % items.len()]
    }

    fn chance(&mut self, per_thousand: u64) -> bool {
        self.next() % 1000 < per_thousand
    }
}

#[derive(Debug)]
struct Generator {
    rng: Rng,
    words: Vec<&'static str>,
    verbs: Vec<&'static str>,
    clock_ms: i64,
    count: usize,
    parent: Option<String>,
}

impl Generator {
    fn words(&mut self, low: u64, high: u64) -> String {
        let count = self.rng.range(low, high);
        (0..count)
            .map(|_| *self.rng.pick(&self.words))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn sentence(&mut self) -> String {
        let mut text = self.words(6, 18);
        if let Some(first) = text.get_mut(0..1) {
            first.make_ascii_uppercase();
        }
        text.push('.');
        text
    }

    fn paragraph(&mut self, low: u64, high: u64) -> String {
        let count = self.rng.range(low, high);
        (0..count)
            .map(|_| self.sentence())
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn path(&mut self) -> String {
        format!(
            "crates/{}/src/{}_{}.{}",
            self.rng.pick(&MODULES),
            self.rng.pick(&self.words),
            self.rng.range(1, 99),
            self.rng.pick(&EXTENSIONS)
        )
    }

    fn code(&mut self, lines: u64) -> String {
        (0..lines)
            .map(|line| {
                format!(
                    "    let {}_{} = {}.{}({}); // line {line}",
                    self.rng.pick(&self.words),
                    self.rng.range(0, 9999),
                    self.rng.pick(&self.words),
                    self.rng.pick(&self.verbs),
                    self.rng.range(0, 1 << 20)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn tick(&mut self, low: u64, high: u64) -> i64 {
        self.clock_ms += self.rng.range(low, high) as i64 * 1000;
        self.clock_ms
    }

    fn entry(&mut self, message: Value) -> MessageEntry {
        self.count += 1;
        let id = format!("e{:08x}", self.count);
        MessageEntry {
            id: id.clone(),
            parent_id: self.parent.replace(id),
            timestamp: Some(iso(self.clock_ms)),
            message: serde_json::from_value::<AgentMessage>(message)
                .unwrap_or_else(|_| AgentMessage::user_text("unparseable")),
            extra: Map::new(),
        }
    }
}

fn iso(ms: i64) -> String {
    let seconds = ms.div_euclid(1000);
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    // Days from 1970-01-01 to a civil date (Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        (of_day % 3600) / 60,
        of_day % 60
    )
}

fn usage() -> Value {
    json!({"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0})
}

/// A session being generated turn by turn (so that a long one need not be held whole): an
/// iterator over its turns' entries.
#[derive(Debug)]
pub struct Generation {
    generator: Generator,
    next_turn: usize,
    turns: usize,
    /// The session's header line.
    pub header: SessionHeader,
    /// The facts the turns will plant, in turn order.
    pub needles: Vec<Needle>,
}

/// Generates `turns` turns with up to `needle_count` needles, from `seed`.
pub fn generate(turns: usize, seed: u64, needle_count: usize) -> Workload {
    let mut generation = Generation::new(turns, seed, needle_count);
    let mut entries = Vec::new();
    let mut ranges = Vec::with_capacity(turns);
    for turn in generation.by_ref() {
        let start = entries.len();
        entries.extend(turn);
        ranges.push(start..entries.len());
    }
    Workload {
        header: generation.header,
        entries,
        turns: ranges,
        needles: generation.needles,
    }
}

/// Writes the session [`generate`] makes as JSONL to `out`, a turn at a time; returns its
/// needles. The bytes are `generate(…).to_jsonl()`'s.
pub fn write_jsonl(
    turns: usize,
    seed: u64,
    needle_count: usize,
    out: &mut impl std::io::Write,
) -> std::io::Result<Vec<Needle>> {
    let mut generation = Generation::new(turns, seed, needle_count);
    writeln!(out, "{}", typed_line(&generation.header, "session"))?;
    for entry in generation.by_ref().flatten() {
        writeln!(out, "{}", typed_line(&entry, "message"))?;
    }
    Ok(generation.needles)
}

/// One JSONL line: `item` with its `type` field.
fn typed_line(item: &impl Serialize, kind: &str) -> Value {
    let mut value = serde_json::to_value(item).unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut value {
        fields.insert("type".to_owned(), Value::String(kind.to_owned()));
    }
    value
}

impl Generation {
    /// The session of `turns` turns with up to `needle_count` needles, from `seed`.
    pub fn new(turns: usize, seed: u64, needle_count: usize) -> Generation {
        let generator = Generator {
            rng: Rng(seed),
            words: WORDS.split_whitespace().collect(),
            verbs: VERBS.split_whitespace().collect(),
            // 2026-03-02T09:00:00Z
            clock_ms: 1_772_442_000_000,
            count: 0,
            parent: None,
        };
        let mut needle_rng = Rng(seed ^ 0x5eed);
        let mut needle_turns: Vec<usize> = Vec::new();
        let candidates = turns.saturating_sub(1).max(1);
        while needle_turns.len() < needle_count.min(candidates) {
            let turn = needle_rng.next() as usize % candidates;
            if !needle_turns.contains(&turn) {
                needle_turns.push(turn);
            }
        }
        needle_turns.sort_unstable();
        let needles: Vec<Needle> = needle_turns
            .iter()
            .enumerate()
            .map(|(index, &turn)| {
                let subject = SUBJECTS[index % SUBJECTS.len()];
                let answer = format!("OPS-{}", needle_rng.range(10_000, 99_999));
                let owner = *needle_rng.pick(&PEOPLE);
                Needle {
                    turn,
                    subject: subject.to_owned(),
                    statement: format!(
                        "Please remember: the ticket for the {subject} is {answer} and {owner} owns it."
                    ),
                    question: format!("What is the ticket for the {subject}?"),
                    query: subject.to_owned(),
                    answer,
                    owner: owner.to_owned(),
                }
            })
            .collect();
        let header = SessionHeader {
            id: format!("synthetic-rs-{seed}-{turns}"),
            version: Some(3),
            timestamp: Some(iso(generator.clock_ms)),
            cwd: Some("/workspace".to_owned()),
            extra: Map::new(),
        };
        Generation {
            generator,
            next_turn: 0,
            turns,
            header,
            needles,
        }
    }
}

impl Iterator for Generation {
    type Item = Vec<MessageEntry>;

    /// The next turn's entries, the user's message first.
    fn next(&mut self) -> Option<Vec<MessageEntry>> {
        if self.next_turn == self.turns {
            return None;
        }
        let turn = self.next_turn;
        self.next_turn += 1;
        let mut entries = Vec::new();
        let g = &mut self.generator;
        let ms = g.tick(20, 600);
        let mut verb_cap = String::from(*g.rng.pick(&g.verbs));
        if let Some(first) = verb_cap.get_mut(0..1) {
            first.make_ascii_uppercase();
        }
        let mut ask = format!(
            "{verb_cap} {} in {} (turn {turn}). {}",
            g.words(2, 5),
            g.path(),
            g.paragraph(1, 4)
        );
        if let Some(needle) = self.needles.iter().find(|needle| needle.turn == turn) {
            ask.push(' ');
            ask.push_str(&needle.statement);
        }
        entries.push(g.entry(json!({"role": "user", "content": ask, "timestamp": ms})));
        let calls = *g.rng.pick(&[1, 1, 2, 2, 3]);
        let mut blocks = vec![json!({"type": "text", "text": g.paragraph(1, 2)})];
        let mut ids = Vec::new();
        for k in 0..calls {
            let tool = *g.rng.pick(&TOOLS);
            let id = format!("call_{turn}_{k}");
            let arguments = if tool == "read" || tool == "edit" {
                json!({"path": g.path()})
            } else {
                json!({"command": format!("cargo test -p vilvona-{} {}", g.rng.pick(&MODULES), g.rng.pick(&g.words))})
            };
            blocks
                .push(json!({"type": "toolCall", "id": id, "name": tool, "arguments": arguments}));
            ids.push((id, tool));
        }
        let ms = g.tick(2, 30);
        entries.push(g.entry(
            json!({"role": "assistant", "content": blocks, "stopReason": "toolUse",
        "api": "openai-completions", "provider": "synthetic", "model": "synthetic-1",
        "usage": usage(), "timestamp": ms}),
        ));
        for (id, tool) in ids {
            let ms = g.tick(1, 20);
            let body = if tool == "read" || tool == "grep" {
                let lines = g.rng.range(5, 90);
                g.code(lines)
            } else {
                g.paragraph(2, 12)
            };
            let is_error = g.rng.chance(50);
            entries.push(g.entry(
                json!({"role": "toolResult", "toolCallId": id, "toolName": tool,
            "content": [{"type": "text", "text": body}], "isError": is_error, "timestamp": ms}),
            ));
        }
        let ms = g.tick(2, 60);
        let answer = g.paragraph(2, 8);
        entries.push(g.entry(json!({"role": "assistant", "content": [{"type": "text", "text": answer}],
        "stopReason": "stop", "api": "openai-completions", "provider": "synthetic", "model": "synthetic-1",
        "usage": usage(), "timestamp": ms})));
        Some(entries)
    }
}

impl Workload {
    /// The transcript as JSONL text.
    pub fn to_jsonl(&self) -> String {
        let mut out = typed_line(&self.header, "session").to_string();
        out.push('\n');
        for entry in &self.entries {
            out.push_str(&typed_line(entry, "message").to_string());
            out.push('\n');
        }
        out
    }

    /// The messages of one turn.
    pub fn turn_messages(&self, turn: usize) -> Vec<AgentMessage> {
        self.entries[self.turns[turn].clone()]
            .iter()
            .map(|entry| entry.message.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_session() {
        let a = generate(20, 7, 5);
        let b = generate(20, 7, 5);
        assert_eq!(a.to_jsonl(), b.to_jsonl());
        assert_ne!(a.to_jsonl(), generate(20, 8, 5).to_jsonl());
        assert_eq!(a.needles.len(), 5);
        for needle in &a.needles {
            let user = a.entries[a.turns[needle.turn].start].message.plain_text();
            assert!(user.contains(&needle.statement), "{user}");
        }
        assert_eq!(iso(1_772_442_351_000), "2026-03-02T09:05:51Z");
    }

    #[test]
    fn written_a_turn_at_a_time_is_the_same_session() {
        let mut written = Vec::new();
        let needles = write_jsonl(40, 7, 5, &mut written).unwrap();
        let whole = generate(40, 7, 5);
        assert_eq!(String::from_utf8(written).unwrap(), whole.to_jsonl());
        assert_eq!(needles, whole.needles);
    }
}
