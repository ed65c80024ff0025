//! `vilvona context dag`: a session's summary DAG as Graphviz DOT or as a PNG — one row per
//! depth (deepest on top), each summary with its kind and tokens, the messages under each leaf
//! counted, the raw messages of the context beside them. A row with more summaries than fit
//! is summarized: the first ones, then one box for the rest with their count and tokens.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use vilvona_core::admin::{DagSummary, DagView};

/// A summary's node number in the DAG.
type SummaryRowId = i64;

use crate::treemap::{Canvas, HEIGHT, Style, WIDTH, fit};

/// Above this many summaries the DOT output shows one node per depth.
const DOT_DETAIL_LIMIT: usize = 400;
/// Characters of a summary's id its box shows (`sum_` and 8 digits).
const LABEL_ID_CHARS: usize = 12;
/// Boxes in one row of the picture.
const ROW_BOXES: usize = 10;

/// Graphviz DOT of the DAG.
pub(crate) fn dot(session: &str, view: &DagView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", escape(session));
    let _ = writeln!(
        out,
        "  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];"
    );
    if view.summaries.len() > DOT_DETAIL_LIMIT {
        // Summarized by depth: one node per level, edges between consecutive levels.
        let levels = view.by_depth();
        let mut previous: Option<u32> = None;
        for (depth, summaries) in levels.iter().rev() {
            let tokens: u64 = summaries.iter().map(|s| s.tokens).sum();
            let in_context = summaries.iter().filter(|s| s.in_context).count();
            let _ = writeln!(
                out,
                "  \"depth{depth}\" [label=\"depth {depth}\\n{} summaries, {tokens} tok\\n{in_context} in the context\"];",
                summaries.len()
            );
            if let Some(above) = previous {
                let _ = writeln!(out, "  \"depth{above}\" -> \"depth{depth}\";");
            }
            previous = Some(*depth);
        }
        let messages: u64 = view.summaries.iter().map(|s| s.child_messages).sum();
        let _ = writeln!(
            out,
            "  \"messages\" [label=\"{messages} summarized messages\"];"
        );
        if let Some(lowest) = previous {
            let _ = writeln!(out, "  \"depth{lowest}\" -> \"messages\";");
        }
    } else {
        for summary in &view.summaries {
            let _ = writeln!(
                out,
                "  \"{}\" [label=\"{}\\ndepth {} {}\\n{} tok\"{}];",
                summary.summary_id,
                summary.summary_id,
                summary.depth,
                summary.kind,
                summary.tokens,
                if summary.in_context {
                    ", style=bold"
                } else {
                    ""
                }
            );
        }
        let ids: HashMap<SummaryRowId, &str> = view
            .summaries
            .iter()
            .map(|s| (s.row_id, s.summary_id.as_str()))
            .collect();
        for summary in &view.summaries {
            for child in &summary.child_summaries {
                if let Some(child) = ids.get(child) {
                    let _ = writeln!(out, "  \"{}\" -> \"{child}\";", summary.summary_id);
                }
            }
            if summary.child_messages > 0 {
                let _ = writeln!(
                    out,
                    "  \"{0}.messages\" [label=\"{1} messages\\n{2} tok\", shape=note];\n  \"{0}\" -> \"{0}.messages\";",
                    summary.summary_id, summary.child_messages, summary.child_message_tokens
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "  \"context\" [label=\"raw in the context\\n{} messages, {} tok\", shape=note];",
        view.raw_messages, view.raw_message_tokens
    );
    out.push_str("}\n");
    out
}

fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A box of the picture: what it shows and where.
struct Placed {
    x: usize,
    y: usize,
    w: usize,
    h: usize,
}

impl Placed {
    fn top(&self) -> (usize, usize) {
        (self.x + self.w / 2, self.y)
    }

    fn bottom(&self) -> (usize, usize) {
        (self.x + self.w / 2, self.y + self.h)
    }
}

/// The row's boxes: each summary until the row is full, then one for the rest.
fn row_labels(summaries: &[&DagSummary]) -> Vec<(Vec<SummaryRowId>, String, String, bool)> {
    let shown = if summaries.len() > ROW_BOXES {
        ROW_BOXES - 1
    } else {
        summaries.len()
    };
    let mut boxes: Vec<(Vec<SummaryRowId>, String, String, bool)> = summaries[..shown]
        .iter()
        .map(|s| {
            (
                vec![s.row_id],
                // The start of the id, which `describe` and `expand` resolve.
                s.summary_id.chars().take(LABEL_ID_CHARS).collect(),
                format!("{} tok", s.tokens),
                s.in_context,
            )
        })
        .collect();
    if summaries.len() > shown {
        let rest = &summaries[shown..];
        boxes.push((
            rest.iter().map(|s| s.row_id).collect(),
            format!("+{} more", rest.len()),
            format!("{} tok", rest.iter().map(|s| s.tokens).sum::<u64>()),
            rest.iter().any(|s| s.in_context),
        ));
    }
    boxes
}

/// Draws the DAG to a PNG at `out`.
pub(crate) fn png(session: &str, view: &DagView, out: &Path) -> Result<()> {
    const TITLE_HEIGHT: usize = 44;
    const BOX_HEIGHT: usize = 44;
    let mut canvas = Canvas::new();
    canvas.fill(0, 0, WIDTH, TITLE_HEIGHT, [30, 30, 30]);
    let title = format!(
        "vilvona summary DAG - {session} - {} summaries, {} raw messages in the context",
        view.summaries.len(),
        view.raw_messages
    );
    canvas.text(
        12,
        10,
        &fit(&title, WIDTH - 24, Style::TITLE),
        Style::TITLE,
        [255, 255, 255],
    );
    let levels = view.by_depth();
    let rows = levels.len() + 1;
    let row_height = (HEIGHT - TITLE_HEIGHT - 20) / rows.max(1);
    let mut placed: HashMap<SummaryRowId, usize> = HashMap::new();
    let mut boxes: Vec<Placed> = Vec::new();
    let mut row_of_summaries: Vec<Vec<(usize, &DagSummary)>> = Vec::new();
    // Deepest first, on top.
    for (row, (depth, summaries)) in levels.iter().rev().enumerate() {
        let y = TITLE_HEIGHT + 14 + row * row_height;
        canvas.text(8, y + 12, &format!("d{depth}"), Style::STRONG, [60, 60, 60]);
        let labels = row_labels(summaries);
        let slot = (WIDTH - 60) / labels.len().max(1);
        let w = slot.saturating_sub(12).min(150);
        for (index, (members, name, detail, in_context)) in labels.iter().enumerate() {
            let x = 50 + index * slot + (slot - w) / 2;
            let color = if *depth == 0 { LEAF } else { CONDENSED };
            let placed_box = Placed {
                x,
                y,
                w,
                h: BOX_HEIGHT,
            };
            let border = if *in_context { Some(IN_CONTEXT) } else { None };
            draw_box(&mut canvas, &placed_box, color, border, name, detail);
            for member in members {
                placed.insert(*member, boxes.len());
            }
            boxes.push(placed_box);
        }
        row_of_summaries.push(
            summaries
                .iter()
                .map(|summary| (placed[&summary.row_id], *summary))
                .collect(),
        );
    }
    // The messages row: the leaves' messages, and the raw context.
    let y = TITLE_HEIGHT + 14 + levels.len() * row_height;
    let summarized: u64 = view.summaries.iter().map(|s| s.child_messages).sum();
    let summarized_tokens: u64 = view.summaries.iter().map(|s| s.child_message_tokens).sum();
    let message_boxes = [
        (
            format!("{summarized} messages"),
            format!("under leaves, {summarized_tokens} tok"),
        ),
        (
            format!("{} messages", view.raw_messages),
            format!("raw in the context, {} tok", view.raw_message_tokens),
        ),
    ];
    let slot = (WIDTH - 60) / 2;
    let w = slot.saturating_sub(12).min(320);
    let mut message_box = Vec::new();
    for (index, (name, detail)) in message_boxes.iter().enumerate() {
        let x = 50 + index * slot + (slot - w) / 2;
        let placed_box = Placed {
            x,
            y,
            w,
            h: BOX_HEIGHT,
        };
        draw_box(&mut canvas, &placed_box, MESSAGES, None, name, detail);
        message_box.push(placed_box);
    }
    // Edges: each summary to its child summaries' boxes, each leaf to its messages.
    for row in &row_of_summaries {
        for (from, summary) in row {
            let start = boxes[*from].bottom();
            for child in &summary.child_summaries {
                if let Some(to) = placed.get(child) {
                    canvas.line(start, boxes[*to].top(), [90, 90, 90]);
                }
            }
            if summary.child_messages > 0 {
                canvas.line(start, message_box[0].top(), [150, 150, 150]);
            }
        }
    }
    // The legend.
    let y = HEIGHT - 30;
    let mut x = 12;
    for (color, label) in [
        (LEAF, "leaf summary"),
        (CONDENSED, "condensed summary"),
        (MESSAGES, "messages"),
        (IN_CONTEXT, "border: in the context"),
    ] {
        canvas.fill(x, y + 2, x + 20, y + 22, color);
        x += 28 + canvas.text(x + 28, y + 3, label, Style::LABEL, [20, 20, 20]) + 24;
    }
    canvas.write_png(out)
}

/// A box with a name and a detail line; a coloured, thicker border when `border` is given.
fn draw_box(
    canvas: &mut Canvas,
    at: &Placed,
    fill_color: [u8; 3],
    border: Option<[u8; 3]>,
    name: &str,
    detail: &str,
) {
    let (x, y, w, h) = (at.x, at.y, at.w, at.h);
    canvas.fill(x, y, x + w, y + h, fill_color);
    match border {
        Some(color) => canvas.frame(x, y, x + w, y + h, color, 3),
        None => canvas.frame(x, y, x + w, y + h, [255, 255, 255], 1),
    }
    for (line, top, style, color) in [
        (name, 5, Style::STRONG, [255, 255, 255]),
        (detail, 24, Style::LABEL, [235, 235, 235]),
    ] {
        canvas.text(x + 6, y + top, &fit(line, w - 12, style), style, color);
    }
}

const LEAF: [u8; 3] = [46, 139, 87];
const MESSAGES: [u8; 3] = [110, 110, 110];
const CONDENSED: [u8; 3] = [52, 101, 164];
const IN_CONTEXT: [u8; 3] = [250, 200, 40];
