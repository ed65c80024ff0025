//! A squarified treemap rendered to PNG: area ∝ tokens, one colour per group, labels in Noto
//! Sans Mono (anti-aliased glyphs blended into the picture), and a legend that wraps onto as
//! many rows as it needs.

use std::path::Path;

use anyhow::{Context as _, Result};
use noto_sans_mono_bitmap::{
    FontWeight, RasterHeight, RasterizedChar, get_raster, get_raster_width,
};

/// One contributor to the context.
#[derive(Clone, Debug)]
pub(crate) struct Tile {
    pub(crate) group: String,
    pub(crate) label: String,
    pub(crate) weight: u64,
}

pub(crate) const WIDTH: usize = 1280;
pub(crate) const HEIGHT: usize = 860;
const TITLE_HEIGHT: usize = 44;
const LEGEND_ROW_HEIGHT: usize = 30;

/// A text style: the font's weight and size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Style {
    weight: FontWeight,
    height: RasterHeight,
}

impl Style {
    pub(crate) const TITLE: Style = Style {
        weight: FontWeight::Bold,
        height: RasterHeight::Size24,
    };
    pub(crate) const LABEL: Style = Style {
        weight: FontWeight::Regular,
        height: RasterHeight::Size16,
    };
    pub(crate) const STRONG: Style = Style {
        weight: FontWeight::Bold,
        height: RasterHeight::Size16,
    };

    pub(crate) fn advance(self) -> usize {
        get_raster_width(self.weight, self.height)
    }

    pub(crate) fn line_height(self) -> usize {
        self.height.val()
    }
}

#[derive(Clone, Copy, Debug)]
struct Rect {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

impl Rect {
    /// The rectangle mirrored across the diagonal (x with y, width with height), when `turned`.
    fn turned_if(self, turned: bool) -> Rect {
        if turned {
            Rect {
                x: self.y,
                y: self.x,
                w: self.h,
                h: self.w,
            }
        } else {
            self
        }
    }
}

/// Worst aspect ratio of a row of areas laid along a side of length `side`.
fn worst(row: &[f64], side: f64) -> f64 {
    let sum: f64 = row.iter().sum();
    let (max, min) = row.iter().fold((0.0_f64, f64::MAX), |(max, min), &a| {
        (max.max(a), min.min(a))
    });
    if sum <= 0.0 || min <= 0.0 {
        return f64::MAX;
    }
    let side2 = side * side;
    (side2 * max / (sum * sum)).max(sum * sum / (side2 * min))
}

/// Squarified layout (Bruls, Huizing, van Wijk) of `weights` (any order) into `rect`; returns
/// one rectangle per weight, in input order.
fn squarify(weights: &[f64], rect: Rect) -> Vec<Rect> {
    let total: f64 = weights.iter().sum();
    let mut out = vec![
        Rect {
            x: rect.x,
            y: rect.y,
            w: 0.0,
            h: 0.0
        };
        weights.len()
    ];
    if total <= 0.0 || rect.w <= 0.0 || rect.h <= 0.0 {
        return out;
    }
    let scale = rect.w * rect.h / total;
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|a, b| weights[*b].total_cmp(&weights[*a]));
    let areas: Vec<f64> = order.iter().map(|&i| weights[i] * scale).collect();
    let mut free = rect;
    let mut start = 0;
    while start < areas.len() {
        let side = free.w.min(free.h);
        let mut end = start + 1;
        while end < areas.len()
            && worst(&areas[start..=end], side) <= worst(&areas[start..end], side)
        {
            end += 1;
        }
        let row_area: f64 = areas[start..end].iter().sum();
        // Lay the strip as a column along the left side, in a frame turned so that the free
        // space is at least as wide as it is tall.
        let turned = free.w < free.h;
        let mut space = free.turned_if(turned);
        let column = if space.h > 0.0 {
            row_area / space.h
        } else {
            0.0
        };
        let mut y = space.y;
        for (offset, area) in areas[start..end].iter().enumerate() {
            let h = if column > 0.0 { area / column } else { 0.0 };
            out[order[start + offset]] = Rect {
                x: space.x,
                y,
                w: column,
                h,
            }
            .turned_if(turned);
            y += h;
        }
        space.x += column;
        space.w -= column;
        free = space.turned_if(turned);
        start = end;
    }
    out
}

pub(crate) struct Canvas {
    pixels: Vec<u8>,
}

impl Canvas {
    pub(crate) fn new() -> Canvas {
        Canvas {
            pixels: vec![255; WIDTH * HEIGHT * 3],
        }
    }

    pub(crate) fn fill(&mut self, x0: usize, y0: usize, x1: usize, y1: usize, color: [u8; 3]) {
        for y in y0.min(HEIGHT)..y1.min(HEIGHT) {
            for x in x0.min(WIDTH)..x1.min(WIDTH) {
                let offset = (y * WIDTH + x) * 3;
                self.pixels[offset..offset + 3].copy_from_slice(&color);
            }
        }
    }

    pub(crate) fn frame(
        &mut self,
        x0: usize,
        y0: usize,
        x1: usize,
        y1: usize,
        color: [u8; 3],
        thickness: usize,
    ) {
        self.fill(x0, y0, x1, (y0 + thickness).min(y1), color);
        self.fill(x0, y1.saturating_sub(thickness), x1, y1, color);
        self.fill(x0, y0, (x0 + thickness).min(x1), y1, color);
        self.fill(x1.saturating_sub(thickness), y0, x1, y1, color);
    }

    /// A straight line one pixel wide, from one point to another.
    pub(crate) fn line(&mut self, from: (usize, usize), to: (usize, usize), color: [u8; 3]) {
        let (x0, y0) = (from.0 as f64, from.1 as f64);
        let (x1, y1) = (to.0 as f64, to.1 as f64);
        let steps = (x1 - x0).abs().max((y1 - y0).abs()).max(1.0) as usize;
        for step in 0..=steps {
            let t = step as f64 / steps as f64;
            let (x, y) = (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t);
            self.blend(x.round() as usize, y.round() as usize, color, 255);
        }
    }

    /// Writes the picture as an RGB PNG.
    pub(crate) fn write_png(&self, out: &Path) -> Result<()> {
        let file =
            std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let mut encoder =
            png::Encoder::new(std::io::BufWriter::new(file), WIDTH as u32, HEIGHT as u32);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder
            .write_header()
            .with_context(|| format!("writing {}", out.display()))?;
        writer
            .write_image_data(&self.pixels)
            .with_context(|| format!("writing {}", out.display()))?;
        Ok(())
    }

    /// Draws text with its top-left corner at a pixel position, blending each glyph's
    /// coverage into what is below; returns the width drawn.
    pub(crate) fn text(
        &mut self,
        x: usize,
        y: usize,
        text: &str,
        style: Style,
        color: [u8; 3],
    ) -> usize {
        let mut cursor = x;
        for ch in text.chars() {
            match get_raster(ch, style.weight, style.height) {
                Some(glyph) => self.glyph(&glyph, cursor, y, color),
                // The font has no general punctuation: an ellipsis is three full stops drawn
                // a third of a cell apart, within the one cell.
                None if ch == '…' => {
                    if let Some(dot) = get_raster('.', style.weight, style.height) {
                        let third = style.advance() / 3;
                        for offset in [0, third, 2 * third] {
                            self.glyph(&dot, (cursor + offset).saturating_sub(third), y, color);
                        }
                    }
                }
                None => {
                    if let Some(unknown) = get_raster('?', style.weight, style.height) {
                        self.glyph(&unknown, cursor, y, color);
                    }
                }
            }
            cursor += style.advance();
        }
        cursor - x
    }

    fn glyph(&mut self, glyph: &RasterizedChar, x: usize, y: usize, color: [u8; 3]) {
        for (row, coverage) in glyph.rows().enumerate() {
            for (column, alpha) in coverage.iter().enumerate() {
                self.blend(x + column, y + row, color, *alpha);
            }
        }
    }

    fn blend(&mut self, x: usize, y: usize, color: [u8; 3], alpha: u8) {
        if x >= WIDTH || y >= HEIGHT || alpha == 0 {
            return;
        }
        let offset = (y * WIDTH + x) * 3;
        for (channel, value) in color.iter().enumerate() {
            let below = u32::from(self.pixels[offset + channel]);
            let above = u32::from(*value);
            let a = u32::from(alpha);
            self.pixels[offset + channel] = ((above * a + below * (255 - a)) / 255) as u8;
        }
    }
}

fn group_color(index: usize) -> [u8; 3] {
    const COLORS: [[u8; 3]; 6] = [
        [52, 101, 164],
        [46, 139, 87],
        [204, 102, 0],
        [117, 80, 123],
        [160, 50, 60],
        [90, 90, 90],
    ];
    COLORS[index % COLORS.len()]
}

fn shade(color: [u8; 3], index: usize) -> [u8; 3] {
    // Alternate lighter and darker so neighbours in a group stay distinguishable.
    let factor = [1.0, 0.82, 1.12, 0.92, 1.2, 0.75][index % 6];
    color.map(|c| ((c as f64) * factor).clamp(0.0, 235.0) as u8)
}

/// The longest prefix of `text` that fits `width` pixels in `style` (marked with `…`).
pub(crate) fn fit(text: &str, width: usize, style: Style) -> String {
    let max = width / style.advance();
    if text.chars().count() <= max {
        text.to_owned()
    } else if max >= 3 {
        format!("{}…", text.chars().take(max - 1).collect::<String>())
    } else {
        String::new()
    }
}

/// The legend's entries laid out in rows within the picture's width: `(row, x)` per entry.
fn legend_layout(entries: &[String]) -> Vec<(usize, usize)> {
    const SWATCH: usize = 28;
    const GAP: usize = 24;
    let mut placed = Vec::with_capacity(entries.len());
    let (mut row, mut x) = (0, 12);
    for entry in entries {
        let width = SWATCH + entry.chars().count() * Style::STRONG.advance() + GAP;
        if x > 12 && x + width > WIDTH - 12 {
            row += 1;
            x = 12;
        }
        placed.push((row, x));
        x += width;
    }
    placed
}

/// Renders the tiles, grouped, to a PNG at `out`.
pub(crate) fn render_treemap(title: &str, tiles: &[Tile], out: &Path) -> Result<()> {
    let mut canvas = Canvas::new();
    canvas.fill(0, 0, WIDTH, TITLE_HEIGHT, [30, 30, 30]);
    canvas.text(
        12,
        10,
        &fit(title, WIDTH - 24, Style::TITLE),
        Style::TITLE,
        [255, 255, 255],
    );

    let mut groups: Vec<String> = Vec::new();
    for tile in tiles {
        if !groups.contains(&tile.group) {
            groups.push(tile.group.clone());
        }
    }
    let group_weights: Vec<f64> = groups
        .iter()
        .map(|group| {
            tiles
                .iter()
                .filter(|t| &t.group == group)
                .map(|t| t.weight as f64)
                .sum()
        })
        .collect();
    let legend: Vec<String> = groups
        .iter()
        .zip(&group_weights)
        .map(|(group, weight)| format!("{group}: {} tok", *weight as u64))
        .collect();
    let placed = legend_layout(&legend);
    let legend_rows = placed.last().map_or(1, |(row, _)| row + 1);
    let legend_height = legend_rows * LEGEND_ROW_HEIGHT + 12;
    let area = Rect {
        x: 0.0,
        y: TITLE_HEIGHT as f64,
        w: WIDTH as f64,
        h: HEIGHT.saturating_sub(TITLE_HEIGHT + legend_height) as f64,
    };
    let group_rects = squarify(&group_weights, area);
    for (group_index, (group, rect)) in groups.iter().zip(&group_rects).enumerate() {
        let members: Vec<&Tile> = tiles.iter().filter(|t| &t.group == group).collect();
        let weights: Vec<f64> = members.iter().map(|t| t.weight as f64).collect();
        let inner = Rect {
            x: rect.x + 3.0,
            y: rect.y + 3.0,
            w: (rect.w - 6.0).max(0.0),
            h: (rect.h - 6.0).max(0.0),
        };
        for (member_index, (tile, tile_rect)) in
            members.iter().zip(squarify(&weights, inner)).enumerate()
        {
            let (x0, y0) = (tile_rect.x.round() as usize, tile_rect.y.round() as usize);
            let (x1, y1) = (
                (tile_rect.x + tile_rect.w).round() as usize,
                (tile_rect.y + tile_rect.h).round() as usize,
            );
            if x1 <= x0 || y1 <= y0 {
                continue;
            }
            canvas.fill(
                x0,
                y0,
                x1,
                y1,
                shade(group_color(group_index), member_index),
            );
            canvas.frame(x0, y0, x1, y1, [255, 255, 255], 1);
            let (w, h) = (x1 - x0, y1 - y0);
            let tokens = format!("{} tok", tile.weight);
            let line = Style::LABEL.line_height();
            if h >= 2 * line + 10 && w >= 4 * Style::LABEL.advance() + 10 {
                canvas.text(
                    x0 + 5,
                    y0 + 4,
                    &fit(&tile.label, w - 10, Style::STRONG),
                    Style::STRONG,
                    [255, 255, 255],
                );
                canvas.text(
                    x0 + 5,
                    y0 + 6 + line,
                    &fit(&tokens, w - 10, Style::LABEL),
                    Style::LABEL,
                    [240, 240, 240],
                );
            } else if h >= line + 4 && w >= 4 * Style::LABEL.advance() + 4 {
                canvas.text(
                    x0 + 2,
                    y0 + 2,
                    &fit(&tile.label, w - 4, Style::LABEL),
                    Style::LABEL,
                    [255, 255, 255],
                );
            }
        }
        let (x0, y0) = (rect.x.round() as usize, rect.y.round() as usize);
        let (x1, y1) = (
            (rect.x + rect.w).round() as usize,
            (rect.y + rect.h).round() as usize,
        );
        canvas.frame(x0, y0, x1, y1, [20, 20, 20], 3);
    }

    // Legend: one swatch per group with its total, wrapped onto as many rows as it needs.
    let legend_y = HEIGHT - legend_height;
    canvas.fill(0, legend_y, WIDTH, HEIGHT, [245, 245, 245]);
    for (index, (entry, (row, x))) in legend.iter().zip(&placed).enumerate() {
        let y = legend_y + 8 + row * LEGEND_ROW_HEIGHT;
        canvas.fill(*x, y + 2, x + 20, y + 22, group_color(index));
        canvas.text(x + 28, y + 2, entry, Style::STRONG, [20, 20, 20]);
    }

    canvas.write_png(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The columns of one cell that hold ink, drawing `text` at the left edge.
    fn inked_columns(text: &str) -> Vec<bool> {
        let mut canvas = Canvas::new();
        let width = canvas.text(40, 10, text, Style::LABEL, [0, 0, 0]);
        (40 - width / 2..40 + width + width / 2)
            .map(|x| {
                (10..40).any(|y| {
                    let offset = (y * WIDTH + x) * 3;
                    canvas.pixels[offset] < 200
                })
            })
            .collect()
    }

    /// A cut label ends in an ellipsis the picture can show: three dots, not the font's `?`.
    #[test]
    fn an_ellipsis_is_drawn_as_three_dots() {
        let runs = |columns: &[bool]| {
            columns
                .windows(2)
                .filter(|pair| !pair[0] && pair[1])
                .count()
                + usize::from(columns.first() == Some(&true))
        };
        assert_eq!(runs(&inked_columns(".")), 1);
        assert_eq!(runs(&inked_columns("…")), 3, "{:?}", inked_columns("…"));
        assert_ne!(inked_columns("…"), inked_columns("?"));
        assert!(
            fit(
                "a label too long for its box",
                10 * Style::LABEL.advance(),
                Style::LABEL
            )
            .ends_with('…')
        );
    }

    #[test]
    fn the_layout_tiles_its_rectangle_in_proportion_to_the_weights() {
        for (weights, rect) in [
            (vec![6.0, 6.0, 4.0, 3.0, 2.0, 2.0, 1.0], (600.0, 400.0)),
            (vec![1.0, 5.0, 2.0, 9.0], (200.0, 700.0)),
            (vec![3.0], (50.0, 80.0)),
        ] {
            let area = Rect {
                x: 10.0,
                y: 20.0,
                w: rect.0,
                h: rect.1,
            };
            let total: f64 = weights.iter().sum();
            let out = squarify(&weights, area);
            for (weight, cell) in weights.iter().zip(&out) {
                let want = weight / total * area.w * area.h;
                assert!(
                    (cell.w * cell.h - want).abs() < 1e-6,
                    "{cell:?} for {weight}"
                );
                assert!(cell.x >= area.x - 1e-9 && cell.x + cell.w <= area.x + area.w + 1e-9);
                assert!(cell.y >= area.y - 1e-9 && cell.y + cell.h <= area.y + area.h + 1e-9);
            }
            for (i, a) in out.iter().enumerate() {
                for b in &out[i + 1..] {
                    let overlap_w = (a.x + a.w).min(b.x + b.w) - a.x.max(b.x);
                    let overlap_h = (a.y + a.h).min(b.y + b.h) - a.y.max(b.y);
                    assert!(
                        overlap_w <= 1e-9 || overlap_h <= 1e-9,
                        "{a:?} overlaps {b:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_legend_wraps_instead_of_running_off_the_edge() {
        let entries: Vec<String> = (0..9)
            .map(|index| format!("A rather long group name {index}: 123456 tok"))
            .collect();
        let placed = legend_layout(&entries);
        assert!(placed.last().unwrap().0 >= 2, "{placed:?}");
        for ((_, x), entry) in placed.iter().zip(&entries) {
            let end = x + 28 + entry.chars().count() * Style::STRONG.advance();
            assert!(end <= WIDTH - 12, "{entry} ends at {end}");
        }
    }

    #[test]
    fn labels_are_cut_to_fit_with_an_ellipsis() {
        let width = 10 * Style::LABEL.advance();
        assert_eq!(fit("short", width, Style::LABEL), "short");
        assert_eq!(
            fit("a label far too long", width, Style::LABEL),
            "a label f…"
        );
        assert_eq!(
            fit("anything", 2 * Style::LABEL.advance(), Style::LABEL),
            ""
        );
    }
}
