//! "Did you mean": the known name nearest to a mistyped one.

/// The known name nearest to `name` by edit distance (letter case aside), when it is near
/// enough to be a slip: at most a third of the name's letters differ, and at most 3.
pub fn nearest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let allowed = (name.chars().count() / 3).clamp(1, 3);
    let name = name.to_lowercase();
    known
        .into_iter()
        .map(|candidate| (edit_distance(&name, &candidate.to_lowercase()), candidate))
        .filter(|(distance, _)| *distance <= allowed)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Edits (insert, delete, replace, swap two neighbours) from `a` to `b`, over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // d[i][j]: edits from a[..i] to b[..j].
    let mut d = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slip_finds_the_key_and_a_stranger_finds_nothing() {
        let known = ["freshTailCount", "freshTailRatio", "leafChunkTokens", "dir"];
        for (typed, meant) in [
            ("freshTailCont", Some("freshTailCount")),
            ("freshtailcount", Some("freshTailCount")),
            ("freshTailRatoi", Some("freshTailRatio")),
            ("dri", Some("dir")),
            ("leafChunkTokensX", Some("leafChunkTokens")),
            ("retention", None),
            ("x", None),
        ] {
            assert_eq!(nearest(typed, known), meant, "{typed}");
        }
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("dri", "dir"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
