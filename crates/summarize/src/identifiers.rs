//! Identifiers: the things a summary must keep exactly or point at (paths, URLs, ticket ids,
//! hashes, numbers with units, names, code symbols).

use std::sync::LazyLock;

use regex::Regex;

static IDENTIFIER: LazyLock<Option<Regex>> = LazyLock::new(|| {
    let patterns = [
        // URLs.
        r"https?://[^\s)>\]\x22']+",
        // Paths with at least one slash.
        r"(?:\.{0,2}/)?(?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_.-]+",
        // Ticket-style ids: OPS-18330, ABC-123.
        r"\b[A-Z][A-Z0-9]{1,9}-\d+\b",
        // Hex hashes (7+ digits, at least one letter and one digit checked below).
        r"\b[0-9a-f]{7,64}\b",
        // Numbers with units.
        r"\b\d+(?:\.\d+)?\s?(?:ms|s|min|h|KB|MB|GB|KiB|MiB|GiB|%|tokens|bytes|lines|pages)\b",
        // Two capitalized words: names of people and things.
        r"\b[A-Z][a-z]+ [A-Z][a-z]+\b",
        // Code symbols: paths::like, snake_case, CamelCase, dotted.calls().
        r"\b[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)+\b",
        r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b",
        r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+\b",
        // Filenames with an extension.
        r"\b[A-Za-z0-9_-]+\.(?:rs|toml|md|json|ts|js|py|go|yaml|yml|sql|txt|log|sh|lock)\b",
    ];
    Regex::new(&patterns.join("|")).ok()
});

/// Identifiers in `text`, in order of first appearance, without duplicates.
pub fn identifiers(text: &str) -> Vec<String> {
    let Some(regex) = IDENTIFIER.as_ref() else {
        return Vec::new();
    };
    let mut found: Vec<String> = Vec::new();
    for candidate in regex.find_iter(text) {
        let value = candidate.as_str().trim_end_matches(['.', ',', ';', ':']);
        if value.len() < 3 || !plausible(value) {
            continue;
        }
        if !found.iter().any(|existing| existing == value) {
            found.push(value.to_owned());
        }
    }
    found
}

/// Filters pattern hits that are not identifiers (a hex-looking English word, a bare number).
fn plausible(value: &str) -> bool {
    let all_hex = value.chars().all(|c| c.is_ascii_hexdigit());
    if all_hex {
        let has_digit = value.chars().any(|c| c.is_ascii_digit());
        let has_letter = value.chars().any(|c| c.is_ascii_alphabetic());
        return has_digit && has_letter;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_kind() {
        let text = "See https://example.test/a?b=1 and crates/store/src/lib.rs for OPS-18330; \
                    commit 3f9a2b7c, took 120 ms, Priya Raman wrote store::open and parse_line in \
                    ContextEngine via Cargo.toml. Added a deadbeef cafe.";
        assert_eq!(
            identifiers(text),
            [
                "https://example.test/a?b=1",
                "crates/store/src/lib.rs",
                "OPS-18330",
                "3f9a2b7c",
                "120 ms",
                "Priya Raman",
                "store::open",
                "parse_line",
                "ContextEngine",
                "Cargo.toml",
            ]
        );
    }
}
