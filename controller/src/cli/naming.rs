//! Object names derived from display names: `Payments API` → `payments-api`, then `-2`, `-3`.
//! A derived name always satisfies `^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`, which is also what LXD
//! accepts as an instance name.

const MAX_NAME: usize = 63;

/// The slug of a display name, before any clash suffix.
pub fn slugify(display_name: &str) -> String {
    let mut slug = String::new();
    for c in display_name.trim().chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            slug.push(c);
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug = slug.trim_matches('-');
    let slug = if slug.is_empty() {
        "project".to_string()
    } else if slug.starts_with(|c: char| c.is_ascii_digit()) {
        format!("p-{slug}")
    } else {
        slug.to_string()
    };
    fit(&slug, "")
}

/// The `attempt`-th candidate: the slug itself, then `slug-2`, `slug-3`, ...
pub fn candidate(slug: &str, attempt: usize) -> String {
    if attempt <= 1 {
        return fit(slug, "");
    }
    fit(slug, &format!("-{attempt}"))
}

/// Shortens `base` so that `base + suffix` fits, never leaving a trailing hyphen.
fn fit(base: &str, suffix: &str) -> String {
    let room = MAX_NAME - suffix.len();
    let base = if base.len() > room {
        &base[..room]
    } else {
        base
    };
    format!("{}{suffix}", base.trim_end_matches('-'))
}

/// The first candidate not in use.
pub fn derive_name(display_name: &str, taken: impl Fn(&str) -> bool) -> String {
    let slug = slugify(display_name);
    (1..)
        .map(|attempt| candidate(&slug, attempt))
        .find(|name| !taken(name))
        .expect("the candidates never run out")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        let cases = [
            ("Payments API", "payments-api"),
            ("  payments   api  ", "payments-api"),
            ("Payments-API!", "payments-api"),
            ("Fix: the (flaky) test", "fix-the-flaky-test"),
            ("42 things", "p-42-things"),
            ("!!!", "project"),
            ("Café Ünïcode", "caf-n-code"),
        ];
        for (input, expected) in cases {
            assert_eq!(slugify(input), expected, "input {input:?}");
        }
    }

    #[test]
    fn long_names_are_cut_to_63_without_a_trailing_hyphen() {
        let long = format!("{}-b", "a".repeat(62));
        let slug = slugify(&long);
        assert_eq!(slug.len(), 62);
        assert!(!slug.ends_with('-'));
        let suffixed = candidate(&slugify(&"x".repeat(80)), 12);
        assert_eq!(suffixed.len(), 63);
        assert!(suffixed.ends_with("-12"));
    }

    #[test]
    fn clashes_take_the_next_suffix() {
        let taken = ["payments-api", "payments-api-2"];
        assert_eq!(
            derive_name("Payments API", |n| taken.contains(&n)),
            "payments-api-3"
        );
        assert_eq!(derive_name("Payments API", |_| false), "payments-api");
    }
}
