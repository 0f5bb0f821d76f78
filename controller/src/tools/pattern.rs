//! Patterns as agents write them, made into what the container's tools understand: globs
//! (`**`, `{a,b}`, classes) into POSIX extended regular expressions that `grep -E` applies to
//! the paths `find` lists, and ripgrep-style regular expressions into POSIX extended ones for a
//! grep without PCRE (busybox). Both are exact: a pattern that cannot be carried over faithfully
//! is refused with the reason, never matched as something else.

use regex_syntax::ast::{
    self, AssertionKind, Ast, ClassAsciiKind, ClassPerlKind, ClassSet, ClassSetItem, Flag,
    FlagsItemKind, GroupKind, LiteralKind, RepetitionKind, RepetitionRange, SpecialLiteralKind,
};

/// The characters that make a path component a pattern rather than a name.
const GLOB_META: &[char] = &['*', '?', '[', '{', '\\'];

/// Why a glob was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GlobError {
    /// It names something outside the workspace.
    Outside(String),
    /// It is not a glob berth can read.
    Invalid(String),
}

/// A Glob call's pattern split into the directory it searches (absolute, lexically inside the
/// workspace; the container still resolves its links) and the regular expression the paths
/// below it must match, relative to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobSearch {
    pub base: String,
    pub regex: String,
}

/// Splits `pattern` (absolute, or relative to `dir`) at its last literal directory.
pub fn glob_search(workspace: &str, dir: &str, pattern: &str) -> Result<GlobSearch, GlobError> {
    if pattern.is_empty() {
        return Err(GlobError::Invalid("the pattern is empty".into()));
    }
    let full = if pattern.starts_with('/') {
        pattern.to_string()
    } else {
        format!("{}/{pattern}", dir.trim_end_matches('/'))
    };
    // The base ends at the last `/` before the first wildcard; a pattern without one keeps
    // its last component as the part to match.
    let first_meta = full.find(GLOB_META).unwrap_or(full.len());
    let split = full[..first_meta].rfind('/').unwrap_or(0);
    let (base, rest) = (&full[..split], &full[split + 1..]);
    let base = normalize(if base.is_empty() { "/" } else { base })
        .filter(|b| within(b, workspace))
        .ok_or_else(|| {
            GlobError::Outside(format!(
                "the pattern {pattern:?} points outside the workspace {workspace}"
            ))
        })?;
    if climbs(rest) {
        return Err(GlobError::Outside(format!(
            "the pattern {pattern:?} climbs out with '..' after a wildcard"
        )));
    }
    let rest = rest.trim_start_matches('/');
    if rest.is_empty() {
        return Err(GlobError::Invalid(format!(
            "the pattern {pattern:?} names a directory; add what to match in it, e.g. {pattern}/*"
        )));
    }
    Ok(GlobSearch {
        base,
        regex: format!("^\\./{}$", glob_to_ere(rest)?),
    })
}

/// The regular expression for Grep's `glob` filter on the paths below the search directory:
/// a glob without `/` matches a file's name at any depth, one with `/` the path from the
/// search directory (as ripgrep's `--glob` does).
pub fn grep_glob(glob: &str) -> Result<String, GlobError> {
    let glob = glob.trim_start_matches("./");
    if glob.contains('/') {
        Ok(format!(
            "^\\./{}$",
            glob_to_ere(glob.trim_start_matches('/'))?
        ))
    } else {
        Ok(format!("^\\./(.*/)?{}$", glob_to_ere(glob)?))
    }
}

/// `path` with `.` and `..` folded, or `None` when `..` climbs above `/`.
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

fn within(path: &str, root: &str) -> bool {
    let root = root.trim_end_matches('/');
    path == root || path.starts_with(&format!("{root}/"))
}

/// Whether a component of the glob, in any of its brace alternatives, is `..`.
fn climbs(rest: &str) -> bool {
    let bytes = rest.as_bytes();
    let boundary = |b: Option<&u8>| matches!(b, None | Some(b'/' | b'{' | b'}' | b','));
    rest.match_indices("..").any(|(at, _)| {
        let before = at.checked_sub(1).and_then(|i| bytes.get(i));
        boundary(before) && boundary(bytes.get(at + 2))
    })
}

/// A glob as a POSIX extended regular expression over a relative path: `*` and `?` stay
/// inside one component, `**` spans components, `{a,b}` is an alternation, `[...]` a class.
pub fn glob_to_ere(glob: &str) -> Result<String, GlobError> {
    let chars: Vec<char> = glob.chars().collect();
    let mut out = String::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '*' if chars.get(i + 1) == Some(&'*') => {
                let starts = i == 0 || matches!(chars[i - 1], '/' | '{' | ',');
                let next = chars.get(i + 2);
                if starts && next == Some(&'/') {
                    out.push_str("(.*/)?");
                    i += 3;
                    continue;
                }
                if starts && (next.is_none() || (depth > 0 && matches!(next, Some(',' | '}')))) {
                    out.push_str(".*");
                } else {
                    out.push_str("[^/]*");
                }
                i += 2;
                continue;
            }
            '*' => out.push_str("[^/]*"),
            '?' => out.push_str("[^/]"),
            '[' => match glob_class(&chars[i + 1..]) {
                Some((class, used)) => {
                    out.push_str(&class);
                    i += used + 1;
                    continue;
                }
                None => out.push_str("\\["),
            },
            '{' => {
                depth += 1;
                out.push('(');
            }
            ',' if depth > 0 => out.push('|'),
            '}' if depth > 0 => {
                depth -= 1;
                out.push(')');
            }
            '\\' => {
                let Some(&next) = chars.get(i + 1) else {
                    return Err(GlobError::Invalid("the pattern ends in a lone '\\'".into()));
                };
                push_literal(&mut out, next);
                i += 2;
                continue;
            }
            c => push_literal(&mut out, c),
        }
        i += 1;
    }
    if depth > 0 {
        return Err(GlobError::Invalid(format!(
            "the pattern {glob:?} has an unclosed '{{'"
        )));
    }
    Ok(out)
}

/// A glob class after its `[`: the bracket expression and how many characters it used, or
/// `None` when it never closes (the `[` is then literal). A class never matches `/`.
fn glob_class(chars: &[char]) -> Option<(String, usize)> {
    let mut i = 0;
    let negated = matches!(chars.first(), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut members = Vec::new();
    // A `]` right after the opening (and its negation) is a member.
    if chars.get(i) == Some(&']') {
        members.push(']');
        i += 1;
    }
    loop {
        match chars.get(i)? {
            ']' => break,
            '\\' => {
                members.push(*chars.get(i + 1)?);
                i += 2;
            }
            '/' => return None,
            &c => {
                members.push(c);
                i += 1;
            }
        }
    }
    let mut set = String::new();
    if members.contains(&']') {
        set.push(']');
    }
    for c in members.iter().filter(|c| !matches!(c, ']' | '^')) {
        set.push(*c);
    }
    if members.contains(&'^') {
        set.push('^');
    }
    let class = if negated {
        format!("[^/{set}]")
    } else if set == "^" {
        "\\^".to_string()
    } else {
        format!("[{set}]")
    };
    Some((class, i + 1))
}

fn push_literal(out: &mut String, c: char) {
    if "\\^$.[|()*+?{".contains(c) {
        out.push('\\');
    }
    out.push(c);
}

/// A regular expression translated for `grep -E`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ere {
    pub pattern: String,
    /// `(?i)` at the start: grep's `-i`.
    pub case_insensitive: bool,
}

/// Why a regular expression has no POSIX extended form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EreError {
    /// Not a valid regular expression at all.
    Invalid(String),
    /// Valid, but it uses something a POSIX grep cannot do.
    Unsupported(String),
}

/// Translates ripgrep/Rust syntax (`\d`, `\w`, `\s`, `(?:...)`, lazy repetitions, ...) into
/// POSIX extended syntax with the GNU extensions glibc's grep understands (`\b`, `\<`).
/// Lazy and greedy repetitions match the same lines, so laziness is dropped.
pub fn regex_to_ere(pattern: &str) -> Result<Ere, EreError> {
    let ast = ast::parse::Parser::new()
        .parse(pattern)
        .map_err(|err| EreError::Invalid(format!("invalid regular expression: {err}")))?;
    let mut out = String::new();
    let case_insensitive = match &ast {
        Ast::Flags(set) if only_case_insensitive(&set.flags) => true,
        Ast::Concat(concat) if matches!(concat.asts.first(), Some(Ast::Flags(set)) if only_case_insensitive(&set.flags)) =>
        {
            for part in &concat.asts[1..] {
                ere(part, &mut out)?;
            }
            true
        }
        ast => {
            ere(ast, &mut out)?;
            false
        }
    };
    Ok(Ere {
        pattern: out,
        case_insensitive,
    })
}

/// `(?i)` and nothing else: a leading one makes the whole search case-insensitive.
fn only_case_insensitive(flags: &ast::Flags) -> bool {
    flags.items.len() == 1 && flags.items[0].kind == FlagsItemKind::Flag(Flag::CaseInsensitive)
}

fn unsupported(what: &str) -> EreError {
    EreError::Unsupported(format!(
        "the pattern uses {what}, which this workspace's grep (POSIX extended regular expressions, no PCRE) cannot honour"
    ))
}

fn ere(ast: &Ast, out: &mut String) -> Result<(), EreError> {
    match ast {
        Ast::Empty(_) => {}
        Ast::Flags(_) => return Err(unsupported("inline flags other than a leading (?i)")),
        Ast::Literal(literal) => ere_literal(literal, out)?,
        Ast::Dot(_) => out.push('.'),
        Ast::Assertion(assertion) => out.push_str(match assertion.kind {
            AssertionKind::StartLine | AssertionKind::StartText => "^",
            AssertionKind::EndLine | AssertionKind::EndText => "$",
            AssertionKind::WordBoundary => "\\b",
            AssertionKind::NotWordBoundary => "\\B",
            AssertionKind::WordBoundaryStart | AssertionKind::WordBoundaryStartAngle => "\\<",
            AssertionKind::WordBoundaryEnd | AssertionKind::WordBoundaryEndAngle => "\\>",
            _ => return Err(unsupported("half word boundaries")),
        }),
        Ast::ClassUnicode(_) => return Err(unsupported("Unicode classes (\\p{...})")),
        Ast::ClassPerl(class) => out.push_str(perl_class(class, true)?),
        Ast::ClassBracketed(class) => {
            let mut set = BracketSet::default();
            set.add(&class.kind)?;
            out.push_str(&set.render(class.negated));
        }
        Ast::Repetition(rep) => {
            ere(&rep.ast, out)?;
            match &rep.op.kind {
                RepetitionKind::ZeroOrOne => out.push('?'),
                RepetitionKind::ZeroOrMore => out.push('*'),
                RepetitionKind::OneOrMore => out.push('+'),
                RepetitionKind::Range(range) => {
                    let (text, largest) = match *range {
                        RepetitionRange::Exactly(n) => (format!("{{{n}}}"), n),
                        RepetitionRange::AtLeast(n) => (format!("{{{n},}}"), n),
                        RepetitionRange::Bounded(n, m) => (format!("{{{n},{m}}}"), m),
                    };
                    if largest > 255 {
                        return Err(unsupported("a repetition count above 255"));
                    }
                    out.push_str(&text);
                }
            }
        }
        Ast::Group(group) => {
            if let GroupKind::NonCapturing(flags) = &group.kind
                && !flags.items.is_empty()
            {
                return Err(unsupported("inline flags other than a leading (?i)"));
            }
            out.push('(');
            ere(&group.ast, out)?;
            out.push(')');
        }
        Ast::Alternation(alternation) => {
            for (i, branch) in alternation.asts.iter().enumerate() {
                if i > 0 {
                    out.push('|');
                }
                ere(branch, out)?;
            }
        }
        Ast::Concat(concat) => {
            for part in &concat.asts {
                ere(part, out)?;
            }
        }
    }
    Ok(())
}

fn ere_literal(literal: &ast::Literal, out: &mut String) -> Result<(), EreError> {
    let c = literal.c;
    if c == '\n' || c == '\0' || literal.kind == LiteralKind::Special(SpecialLiteralKind::LineFeed)
    {
        return Err(unsupported(
            "a newline or NUL (Grep matches one line at a time)",
        ));
    }
    if !c.is_ascii() {
        return Err(unsupported("non-ASCII characters"));
    }
    push_literal(out, c);
    Ok(())
}

fn perl_class(class: &ast::ClassPerl, standalone: bool) -> Result<&'static str, EreError> {
    Ok(match (&class.kind, class.negated, standalone) {
        (ClassPerlKind::Digit, false, true) => "[0-9]",
        (ClassPerlKind::Digit, true, true) => "[^0-9]",
        (ClassPerlKind::Space, false, true) => "[[:space:]]",
        (ClassPerlKind::Space, true, true) => "[^[:space:]]",
        (ClassPerlKind::Word, false, true) => "[[:alnum:]_]",
        (ClassPerlKind::Word, true, true) => "[^[:alnum:]_]",
        (ClassPerlKind::Digit, false, false) => "0-9",
        (ClassPerlKind::Space, false, false) => "[:space:]",
        (ClassPerlKind::Word, false, false) => "[:alnum:]_",
        (_, true, false) => return Err(unsupported("a negated class inside [...]")),
    })
}

/// The members of a bracket expression, placed where POSIX reads them literally: `]` first,
/// `^` anywhere but first, `-` last.
#[derive(Default)]
struct BracketSet {
    members: String,
    close: bool,
    caret: bool,
    dash: bool,
}

impl BracketSet {
    fn add(&mut self, set: &ClassSet) -> Result<(), EreError> {
        match set {
            ClassSet::BinaryOp(_) => Err(unsupported("class operations (&&, --, ~~)")),
            ClassSet::Item(item) => self.item(item),
        }
    }

    fn item(&mut self, item: &ClassSetItem) -> Result<(), EreError> {
        match item {
            ClassSetItem::Empty(_) => {}
            ClassSetItem::Literal(literal) => self.char(literal.c)?,
            ClassSetItem::Range(range) => {
                let (start, end) = (range.start.c, range.end.c);
                let plain = |c: char| c.is_ascii() && !c.is_ascii_control() && !"]^-[".contains(c);
                if !plain(start) || !plain(end) {
                    return Err(unsupported("a range whose ends are special or non-ASCII"));
                }
                self.members.push(start);
                self.members.push('-');
                self.members.push(end);
            }
            ClassSetItem::Ascii(class) => {
                if class.negated {
                    return Err(unsupported("a negated [:class:]"));
                }
                self.members.push_str(match class.kind {
                    ClassAsciiKind::Alnum => "[:alnum:]",
                    ClassAsciiKind::Alpha => "[:alpha:]",
                    ClassAsciiKind::Ascii => "\x01-\x7f",
                    ClassAsciiKind::Blank => "[:blank:]",
                    ClassAsciiKind::Cntrl => "[:cntrl:]",
                    ClassAsciiKind::Digit => "[:digit:]",
                    ClassAsciiKind::Graph => "[:graph:]",
                    ClassAsciiKind::Lower => "[:lower:]",
                    ClassAsciiKind::Print => "[:print:]",
                    ClassAsciiKind::Punct => "[:punct:]",
                    ClassAsciiKind::Space => "[:space:]",
                    ClassAsciiKind::Upper => "[:upper:]",
                    ClassAsciiKind::Word => "[:alnum:]_",
                    ClassAsciiKind::Xdigit => "[:xdigit:]",
                });
            }
            ClassSetItem::Unicode(_) => return Err(unsupported("Unicode classes (\\p{...})")),
            ClassSetItem::Perl(class) => self.members.push_str(perl_class(class, false)?),
            ClassSetItem::Bracketed(inner) => {
                if inner.negated {
                    return Err(unsupported("a negated class inside [...]"));
                }
                self.add(&inner.kind)?;
            }
            ClassSetItem::Union(union) => {
                for item in &union.items {
                    self.item(item)?;
                }
            }
        }
        Ok(())
    }

    fn char(&mut self, c: char) -> Result<(), EreError> {
        match c {
            ']' => self.close = true,
            '^' => self.caret = true,
            '-' => self.dash = true,
            '\n' | '\0' => {
                return Err(unsupported(
                    "a newline or NUL (Grep matches one line at a time)",
                ));
            }
            c if !c.is_ascii() => return Err(unsupported("non-ASCII characters")),
            // `[` is only special before `:`, `.` or `=`; keeping it last-but-one is enough
            // as long as nothing of that kind follows it, which a literal never is.
            c => self.members.push(c),
        }
        Ok(())
    }

    fn render(&self, negated: bool) -> String {
        let mut body = String::new();
        if self.close {
            body.push(']');
        }
        body.push_str(&self.members);
        if self.caret {
            body.push('^');
        }
        if self.dash {
            body.push('-');
        }
        if !negated && body == "^" {
            return "\\^".to_string();
        }
        format!("[{}{body}]", if negated { "^" } else { "" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_become_exact_path_expressions() {
        let cases = [
            ("*.rs", "[^/]*\\.rs"),
            ("src/*.{txt,rs}", "src/[^/]*\\.(txt|rs)"),
            ("**/*.rs", "(.*/)?[^/]*\\.rs"),
            ("src/**", "src/.*"),
            ("a/**/b", "a/(.*/)?b"),
            ("a**b", "a[^/]*b"),
            ("file?.[ch]", "file[^/]\\.[ch]"),
            ("[!a-c]x", "[^/a-c]x"),
            ("{a,{b,c}}", "(a|(b|c))"),
            ("{**/x,y}", "((.*/)?x|y)"),
            ("a+b(c)", "a\\+b\\(c\\)"),
            ("\\*lit", "\\*lit"),
            ("[x", "\\[x"),
        ];
        for (glob, want) in cases {
            assert_eq!(glob_to_ere(glob).as_deref(), Ok(want), "{glob}");
        }
        assert!(matches!(glob_to_ere("{a,b"), Err(GlobError::Invalid(_))));
    }

    #[test]
    fn glob_searches_start_at_the_last_literal_directory() {
        let search = |dir: &str, pattern: &str| glob_search("/workspace", dir, pattern);
        assert_eq!(
            search("/workspace", "src/*.{txt,rs}"),
            Ok(GlobSearch {
                base: "/workspace/src".into(),
                regex: "^\\./[^/]*\\.(txt|rs)$".into()
            })
        );
        assert_eq!(search("/workspace", "**/*").unwrap().base, "/workspace");
        assert_eq!(
            search("/workspace/sub", "../other/*.md").unwrap().base,
            "/workspace/other"
        );
        assert_eq!(
            search("/workspace", "/workspace/a/b.txt"),
            Ok(GlobSearch {
                base: "/workspace/a".into(),
                regex: "^\\./b\\.txt$".into()
            })
        );
        for outside in [
            "../*",
            "/etc/*",
            "/workspacex/*",
            "a/../../*",
            "src/*/../../..",
            "{..,x}/*",
        ] {
            assert!(
                matches!(search("/workspace", outside), Err(GlobError::Outside(_))),
                "{outside}"
            );
        }
        assert!(matches!(
            search("/workspace/sub", "../*"),
            Ok(GlobSearch { ref base, .. }) if base == "/workspace"
        ));
        assert!(matches!(
            glob_search("/workspace/sub", "/workspace/sub", "../*"),
            Err(GlobError::Outside(_))
        ));
    }

    #[test]
    fn grep_globs_match_names_anywhere_or_paths_from_the_root() {
        assert_eq!(grep_glob("*.rs").unwrap(), "^\\./(.*/)?[^/]*\\.rs$");
        assert_eq!(
            grep_glob("src/**/*.rs").unwrap(),
            "^\\./src/(.*/)?[^/]*\\.rs$"
        );
    }

    #[test]
    fn ripgrep_syntax_becomes_posix_extended() {
        let cases = [
            (r"\d+", "[0-9]+"),
            (r"fn\s+\w+", "fn[[:space:]]+[[:alnum:]_]+"),
            (r"a.*?b", "a.*b"),
            (r"(?:foo|bar)\b", "(foo|bar)\\b"),
            (r"[\d.-]", "[0-9.-]"),
            (r"[^\s]", "[^[:space:]]"),
            (r"\D\W\S", "[^0-9][^[:alnum:]_][^[:space:]]"),
            (r"x{2,3}", "x{2,3}"),
            (r"(?P<name>a)", "(a)"),
            (r"\$\{[a-z]+\}", "\\$\\{[a-z]+}"),
            (r"[]a^]", "[]a^]"),
            (r"^\t$", "^\t$"),
        ];
        for (regex, want) in cases {
            assert_eq!(
                regex_to_ere(regex).map(|e| e.pattern).as_deref(),
                Ok(want),
                "{regex}"
            );
        }
        let icase = regex_to_ere("(?i)todo").unwrap();
        assert_eq!(
            (icase.pattern.as_str(), icase.case_insensitive),
            ("todo", true)
        );
        for refused in [r"\p{Greek}", r"a(?i)b", "a\\nb", "é", "[a&&b]", "x{300}"] {
            assert!(
                matches!(regex_to_ere(refused), Err(EreError::Unsupported(_))),
                "{refused}"
            );
        }
        for invalid in ["a(", r"(?=x)", r"\1"] {
            assert!(
                matches!(regex_to_ere(invalid), Err(EreError::Invalid(_))),
                "{invalid}"
            );
        }
    }
}
