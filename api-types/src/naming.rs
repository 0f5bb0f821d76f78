//! Object names, display names and environment keys.
//!
//! A project's `metadata.name` is also its LXD instance name, so the name rule is the
//! intersection of a DNS label and LXD's instance-name rule.
//!
//! Also the slug a display name gives (`slugify`), the name derived from it (`derive_name`) and
//! the key display names are compared by (`display_name_key`).

/// Longest object name: a DNS label, and LXD's limit for instance names.
pub const MAX_NAME_LEN: usize = 63;

/// Checks `^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`.
pub fn validate_name(name: &str) -> Result<(), String> {
    const RULE: &str = "must be lower-case letters, digits and '-', start with a letter, end with a letter or digit, at most 63 characters";
    if name.is_empty() {
        return Err("required".to_string());
    }
    let bytes = name.as_bytes();
    let well_formed = bytes.len() <= MAX_NAME_LEN
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[bytes.len() - 1] != b'-';
    if well_formed {
        Ok(())
    } else {
        Err(format!("{name:?} is not a valid name ({RULE})"))
    }
}

/// Folds the accented Latin letters people commonly use in titles to ASCII.
fn fold_to_ascii(c: char) -> Option<&'static str> {
    Some(match c {
        'à' | 'á' | 'â' | 'ã' | 'ä' | 'å' | 'ā' => "a",
        'æ' => "ae",
        'ç' | 'ć' | 'č' => "c",
        'ď' | 'ð' => "d",
        'è' | 'é' | 'ê' | 'ë' | 'ē' | 'ę' | 'ě' => "e",
        'ì' | 'í' | 'î' | 'ï' | 'ī' => "i",
        'ł' => "l",
        'ñ' | 'ń' | 'ň' => "n",
        'ò' | 'ó' | 'ô' | 'õ' | 'ö' | 'ø' | 'ō' | 'ő' => "o",
        'œ' => "oe",
        'ř' => "r",
        'ś' | 'š' => "s",
        'ß' => "ss",
        'ť' => "t",
        'þ' => "th",
        'ù' | 'ú' | 'û' | 'ü' | 'ū' | 'ů' | 'ű' => "u",
        'ý' | 'ÿ' => "y",
        'ź' | 'ż' | 'ž' => "z",
        _ => return None,
    })
}

/// Turns a display name into a valid object name: `"Payments API"` → `payments-api`.
/// Letters are lower-cased (common accents folded), runs of anything else become one `-`; a
/// name that would start with a digit gets a `p-` prefix. `None` when nothing usable remains.
pub fn slugify(display_name: &str) -> Option<String> {
    let mut slug = String::new();
    let mut pending_dash = false;
    for c in display_name.chars().flat_map(char::to_lowercase) {
        let piece: Option<SlugPiece> = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            Some(SlugPiece::Char(c))
        } else {
            fold_to_ascii(c).map(SlugPiece::Str)
        };
        match piece {
            Some(piece) => {
                if pending_dash && !slug.is_empty() {
                    slug.push('-');
                }
                pending_dash = false;
                match piece {
                    SlugPiece::Char(c) => slug.push(c),
                    SlugPiece::Str(s) => slug.push_str(s),
                }
            }
            None => pending_dash = true,
        }
    }
    if slug.is_empty() {
        return None;
    }
    if slug.as_bytes()[0].is_ascii_digit() {
        slug.insert_str(0, "p-");
    }
    let slug = truncate_name(&slug, MAX_NAME_LEN);
    validate_name(&slug).ok().map(|()| slug)
}

enum SlugPiece {
    Char(char),
    Str(&'static str),
}

/// Cuts a (valid-prefix) name to at most `max` bytes without leaving a trailing `-`.
fn truncate_name(name: &str, max: usize) -> String {
    let cut = &name[..name.len().min(max)];
    cut.trim_end_matches('-').to_string()
}

/// Derives a free name from a display name: the slug, or on a clash the slug with `-2`, `-3`,
/// ... (the slug is shortened so the result stays within 63 characters). `taken` says whether a
/// name is in use. `None` when the display name has nothing usable in it.
pub fn derive_name(display_name: &str, taken: impl Fn(&str) -> bool) -> Option<String> {
    let base = slugify(display_name)?;
    if !taken(&base) {
        return Some(base);
    }
    // Bounded so a `taken` that always answers yes cannot spin forever.
    for n in 2..=100_000u32 {
        let suffix = format!("-{n}");
        let candidate = format!(
            "{}{suffix}",
            truncate_name(&base, MAX_NAME_LEN - suffix.len())
        );
        if !taken(&candidate) {
            return Some(candidate);
        }
    }
    None
}

/// The form in which display names must be unique: trimmed and lower-cased.
pub fn display_name_key(display_name: &str) -> String {
    display_name.trim().to_lowercase()
}

/// Checks an environment variable name (also the rule for secret keys): `[A-Za-z_][A-Za-z0-9_]*`.
pub fn validate_env_key(key: &str) -> Result<(), String> {
    let mut chars = key.chars();
    let Some(first) = chars.next() else {
        return Err("must not be empty".to_string());
    };
    let valid = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{key:?} is not a valid environment variable name (letters, digits and '_', not starting with a digit)"
        ))
    }
}
