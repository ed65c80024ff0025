//! Where things are in a JSON5 file, read without changing a byte of it: each key's position
//! and its value's byte range. Errors use it to name a line and a column; an edit uses it to
//! replace one value and leave every comment and the layout as they were.
//!
//! It reads only what `json5` has accepted (or, for a file that ends too soon, far enough to
//! say which bracket was left open); it is not a second parser of values.

use std::ops::Range;

/// One key of an object: its dotted path (array elements by index), where the key starts, and
/// the bytes of its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) path: String,
    pub(crate) key_at: usize,
    pub(crate) value: Range<usize>,
}

/// Why the text could not be read to its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Broken {
    /// The text ends inside an object (`{`), array (`[`), string or comment (`/`) opened at a
    /// byte, the value of the key at `path` (empty: the whole file, or not a value).
    Unclosed {
        opener: char,
        at: usize,
        path: String,
    },
    /// Something else at a byte (the parser's own message says what).
    Unexpected { at: usize },
}

/// Every key of the text, in the order written.
pub(crate) fn scan(text: &str) -> Result<Vec<Placed>, Broken> {
    let mut scanner = Scanner {
        text: text.as_bytes(),
        placed: Vec::new(),
    };
    let start = scanner.trivia(0)?;
    if start < scanner.text.len() {
        scanner.value(start, "")?;
    }
    Ok(scanner.placed)
}

/// The key at `path`, if the text has it (the last one written: it is the one that counts).
pub(crate) fn find<'a>(placed: &'a [Placed], path: &str) -> Option<&'a Placed> {
    placed.iter().rev().find(|entry| entry.path == path)
}

/// The 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |at| at + 1);
    (line, before[line_start..].chars().count() + 1)
}

struct Scanner<'a> {
    text: &'a [u8],
    placed: Vec<Placed>,
}

impl Scanner<'_> {
    /// Skips whitespace and comments; returns the next byte's offset.
    fn trivia(&self, mut at: usize) -> Result<usize, Broken> {
        loop {
            match self.text.get(at..at + 2) {
                Some(b"//") => {
                    while at < self.text.len() && self.text[at] != b'\n' {
                        at += 1;
                    }
                }
                Some(b"/*") => {
                    let opened = at;
                    at += 2;
                    loop {
                        match self.text.get(at..at + 2) {
                            Some(b"*/") => break at += 2,
                            Some(_) => at += 1,
                            None => {
                                return Err(Broken::Unclosed {
                                    opener: '/',
                                    at: opened,
                                    path: String::new(),
                                });
                            }
                        }
                    }
                }
                _ => match self.text.get(at) {
                    // JSON5 whitespace beyond ASCII (U+00A0, U+2028, U+FEFF, …) is rare;
                    // its bytes are skipped as they come.
                    Some(byte) if byte.is_ascii_whitespace() || *byte >= 0x80 => at += 1,
                    _ => return Ok(at),
                },
            }
        }
    }

    /// Reads the value at `at`; returns where it ends.
    fn value(&mut self, at: usize, path: &str) -> Result<usize, Broken> {
        match self.text.get(at) {
            Some(b'{') => self.object(at, path),
            Some(b'[') => self.array(at, path),
            Some(quote @ (b'"' | b'\'')) => self.string(at, *quote, path),
            Some(_) => Ok(self.bare(at)),
            None => Err(Broken::Unexpected { at }),
        }
    }

    /// A number, `true`, `null`, an identifier: up to the next delimiter.
    fn bare(&self, mut at: usize) -> usize {
        while let Some(byte) = self.text.get(at) {
            if matches!(byte, b',' | b'}' | b']' | b':' | b'/') || byte.is_ascii_whitespace() {
                break;
            }
            at += 1;
        }
        at
    }

    fn string(&self, opened: usize, quote: u8, path: &str) -> Result<usize, Broken> {
        let mut at = opened + 1;
        while let Some(byte) = self.text.get(at) {
            match *byte {
                b'\\' => at += 2,
                byte if byte == quote => return Ok(at + 1),
                _ => at += 1,
            }
        }
        Err(Broken::Unclosed {
            opener: quote as char,
            at: opened,
            path: path.to_owned(),
        })
    }

    fn object(&mut self, opened: usize, path: &str) -> Result<usize, Broken> {
        let unclosed = Broken::Unclosed {
            opener: '{',
            at: opened,
            path: path.to_owned(),
        };
        let mut at = self.trivia(opened + 1)?;
        loop {
            match self.text.get(at) {
                None => return Err(unclosed.clone()),
                Some(b'}') => return Ok(at + 1),
                Some(_) => {}
            }
            let key_at = at;
            let key = match self.text[at] {
                quote @ (b'"' | b'\'') => {
                    at = self.string(at, quote, path)?;
                    unquote(&self.text[key_at + 1..at - 1])
                }
                _ => {
                    at = self.bare(at);
                    String::from_utf8_lossy(&self.text[key_at..at]).into_owned()
                }
            };
            at = self.trivia(at)?;
            match self.text.get(at) {
                Some(b':') => {}
                None => return Err(unclosed.clone()),
                Some(_) => return Err(Broken::Unexpected { at }),
            }
            let start = self.trivia(at + 1)?;
            let child = if path.is_empty() {
                key
            } else {
                format!("{path}.{key}")
            };
            if start >= self.text.len() {
                return Err(unclosed.clone());
            }
            let end = self.value(start, &child)?;
            self.placed.push(Placed {
                path: child,
                key_at,
                value: start..end,
            });
            at = self.separator(end, b'}', &unclosed)?;
        }
    }

    fn array(&mut self, opened: usize, path: &str) -> Result<usize, Broken> {
        let unclosed = Broken::Unclosed {
            opener: '[',
            at: opened,
            path: path.to_owned(),
        };
        let mut at = self.trivia(opened + 1)?;
        let mut index = 0;
        loop {
            match self.text.get(at) {
                None => return Err(unclosed.clone()),
                Some(b']') => return Ok(at + 1),
                Some(_) => {}
            }
            let end = self.value(at, &format!("{path}.{index}"))?;
            index += 1;
            at = self.separator(end, b']', &unclosed)?;
        }
    }

    /// After a member: a comma (then the next member or the closer), or the closer itself.
    fn separator(&self, end: usize, closer: u8, unclosed: &Broken) -> Result<usize, Broken> {
        let at = self.trivia(end)?;
        match self.text.get(at) {
            Some(b',') => self.trivia(at + 1),
            Some(byte) if *byte == closer => Ok(at),
            None => Err(unclosed.clone()),
            Some(_) => Err(Broken::Unexpected { at }),
        }
    }
}

/// A quoted key's text (escapes of the quote and the backslash undone; keys are plain names).
fn unquote(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(ch) = chars.next() {
        match ch {
            '\\' => out.extend(chars.next()),
            ch => out.push(ch),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"// the gateway's settings
{
  plugins: {
    // was: contextEngine: "x"
    slots: { contextEngine: "lossless", 'memory': 'none' },
    entries: {
      "lossless": { config: { freshTailCount: 8, store: { kind: "sqlite" } } },
    },
  },
  list: [1, { deep: true }, /* c */ "s,}"],
}
"#;

    fn placed(path: &str) -> (usize, usize, &'static str) {
        let all = scan(FILE).unwrap();
        let entry = find(&all, path).unwrap_or_else(|| panic!("{path} in {all:?}"));
        let (line, column) = line_column(FILE, entry.key_at);
        (line, column, &FILE[entry.value.clone()])
    }

    #[test]
    fn keys_are_found_where_they_are_written_not_in_comments() {
        assert_eq!(
            placed("plugins.slots.contextEngine"),
            (5, 14, "\"lossless\"")
        );
        assert_eq!(placed("plugins.slots.memory"), (5, 41, "'none'"));
        assert_eq!(
            placed("plugins.entries.lossless.config.freshTailCount"),
            (7, 31, "8")
        );
        assert_eq!(
            placed("plugins.entries.lossless.config.store.kind"),
            (7, 59, "\"sqlite\"")
        );
        assert_eq!(placed("list.1.deep"), (10, 15, "true"));
        assert_eq!(
            placed("list"),
            (10, 3, r#"[1, { deep: true }, /* c */ "s,}"]"#)
        );
    }

    #[test]
    fn a_file_that_ends_too_soon_names_the_bracket_left_open() {
        let text = "{\n  plugins: {\n    slots: { contextEngine: \"lossless\" },\n  agents: {},\n";
        assert_eq!(
            scan(text),
            Err(Broken::Unclosed {
                opener: '{',
                at: text.find("{\n    slots").unwrap(),
                path: "plugins".to_owned(),
            })
        );
        assert_eq!(
            scan("{ a: \"open"),
            Err(Broken::Unclosed {
                opener: '"',
                at: 5,
                path: "a".to_owned(),
            })
        );
        assert_eq!(
            scan("{ a: 1 /* note"),
            Err(Broken::Unclosed {
                opener: '/',
                at: 7,
                path: String::new(),
            })
        );
    }
}
