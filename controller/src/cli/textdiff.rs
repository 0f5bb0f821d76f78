//! A line diff in unified format, as `diff -u` prints it, made by the `similar` crate (Myers'
//! algorithm, linear memory) rather than by hand.

use similar::TextDiff;

/// A unified diff with `context` lines around each change; empty when the texts are equal.
pub fn unified(old_label: &str, new_label: &str, old: &str, new: &str, context: usize) -> String {
    if old == new {
        return String::new();
    }
    TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(context)
        .missing_newline_hint(false)
        .header(old_label, new_label)
        .to_string()
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
