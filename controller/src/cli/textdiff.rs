//! A line diff in unified format, small enough for manifests (a few hundred lines at most).

/// One line of an edit script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edit<'a> {
    Same(&'a str),
    Removed(&'a str),
    Added(&'a str),
}

/// The longest-common-subsequence edit script from `old` to `new`.
fn edits<'a>(old: &[&'a str], new: &[&'a str]) -> Vec<Edit<'a>> {
    let (n, m) = (old.len(), new.len());
    // lcs[i][j]: length of the LCS of old[i..] and new[j..].
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if old[i] == new[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::with_capacity(n.max(m));
    while i < n || j < m {
        if i < n && j < m && old[i] == new[j] {
            out.push(Edit::Same(old[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            // Removals first, as diff(1) prints them.
            out.push(Edit::Removed(old[i]));
            i += 1;
        } else {
            out.push(Edit::Added(new[j]));
            j += 1;
        }
    }
    out
}

/// A unified diff with `context` lines around each change; empty when the texts are equal.
pub fn unified(old_label: &str, new_label: &str, old: &str, new: &str, context: usize) -> String {
    if old == new {
        return String::new();
    }
    let old_lines: Vec<&str> = old.lines().collect();
    let new_lines: Vec<&str> = new.lines().collect();
    let script = edits(&old_lines, &new_lines);
    let changed: Vec<usize> = script
        .iter()
        .enumerate()
        .filter(|(_, e)| !matches!(e, Edit::Same(_)))
        .map(|(i, _)| i)
        .collect();
    if changed.is_empty() {
        return String::new();
    }

    // Group changes whose context windows touch into one hunk.
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    for &index in &changed {
        let start = index.saturating_sub(context);
        let end = (index + context + 1).min(script.len());
        match hunks.last_mut() {
            Some((_, last_end)) if start <= *last_end => *last_end = end,
            _ => hunks.push((start, end)),
        }
    }

    let mut out = format!("--- {old_label}\n+++ {new_label}\n");
    for (start, end) in hunks {
        // Line numbers (1-based) of the hunk's first line in each text.
        let old_before = script[..start]
            .iter()
            .filter(|e| !matches!(e, Edit::Added(_)))
            .count();
        let new_before = script[..start]
            .iter()
            .filter(|e| !matches!(e, Edit::Removed(_)))
            .count();
        let slice = &script[start..end];
        let old_count = slice
            .iter()
            .filter(|e| !matches!(e, Edit::Added(_)))
            .count();
        let new_count = slice
            .iter()
            .filter(|e| !matches!(e, Edit::Removed(_)))
            .count();
        out.push_str(&format!(
            "@@ -{},{old_count} +{},{new_count} @@\n",
            old_before + usize::from(old_count > 0),
            new_before + usize::from(new_count > 0)
        ));
        for edit in slice {
            let (mark, line) = match edit {
                Edit::Same(l) => (' ', l),
                Edit::Removed(l) => ('-', l),
                Edit::Added(l) => ('+', l),
            };
            out.push(mark);
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_have_no_diff() {
        assert_eq!(unified("a", "b", "x\ny\n", "x\ny\n", 3), "");
    }

    #[test]
    fn hunks_carry_context_and_line_numbers() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n";
        let new = "a\nb\nc\nD\ne\nf\ng\nh\ni\nj\nk\n";
        let expected = "\
--- live
+++ merged
@@ -2,5 +2,5 @@
 b
 c
-d
+D
 e
 f
@@ -9,2 +9,3 @@
 i
 j
+k
";
        assert_eq!(unified("live", "merged", old, new, 2), expected);
    }

    #[test]
    fn a_new_object_is_all_additions() {
        let expected = "--- live\n+++ merged\n@@ -0,0 +1,2 @@\n+x\n+y\n";
        assert_eq!(unified("live", "merged", "", "x\ny\n", 3), expected);
    }
}
