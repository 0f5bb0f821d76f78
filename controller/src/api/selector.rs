//! Label selectors in the Kubernetes grammar kubectl speaks: requirements joined by commas,
//! every one of which must hold. Equality-based `k=v`, `k==v`, `k!=v`; set-based
//! `k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k` (does not exist); and `k>1`, `k<1` on
//! integer values.

use std::collections::{BTreeMap, BTreeSet};

use berth_api::object::{validate_label_key, validate_label_value};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    /// `k=v`, `k==v` and `k in (...)`: the label is present with one of the values.
    In(String, BTreeSet<String>),
    /// `k!=v` and `k notin (...)`: the label is absent, or has none of the values.
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
    /// `k>n`, `k<n`: the label is present and its value an integer above (below) n.
    Gt(String, i64),
    Lt(String, i64),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let integer = |k: &String| labels.get(k).and_then(|v| v.parse::<i64>().ok());
        match self {
            Requirement::In(k, values) => labels.get(k).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(k, values) => labels.get(k).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
            Requirement::Gt(k, n) => integer(k).is_some_and(|v| v > *n),
            Requirement::Lt(k, n) => integer(k).is_some_and(|v| v < *n),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses a selector; an empty one selects everything. Errors name the selector and say
    /// what was expected where.
    pub fn parse(text: &str) -> Result<LabelSelector, String> {
        let fail = |reason: String| format!("labelSelector: {text:?}: {reason}");
        let tokens = lex(text);
        let mut parser = Parser {
            tokens: &tokens,
            at: 0,
        };
        let mut requirements = Vec::new();
        if parser.peek() == &Token::End {
            return Ok(LabelSelector { requirements });
        }
        loop {
            requirements.push(parser.requirement().map_err(fail)?);
            match parser.next() {
                Token::End => break,
                Token::Comma => continue,
                other => {
                    return Err(fail(format!(
                        "expected ',' or the end after a requirement, found {}",
                        other.describe()
                    )));
                }
            }
        }
        Ok(LabelSelector { requirements })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

/// The selector in its canonical text: what [`LabelSelector::parse`] reads back as the same
/// selector.
impl std::fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |values: &BTreeSet<String>| {
            values
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(",")
        };
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match requirement {
                Requirement::In(k, values) if values.len() == 1 => {
                    write!(f, "{k}={}", set(values))?
                }
                Requirement::In(k, values) => write!(f, "{k} in ({})", set(values))?,
                Requirement::NotIn(k, values) if values.len() == 1 => {
                    write!(f, "{k}!={}", set(values))?
                }
                Requirement::NotIn(k, values) => write!(f, "{k} notin ({})", set(values))?,
                Requirement::Exists(k) => f.write_str(k)?,
                Requirement::NotExists(k) => write!(f, "!{k}")?,
                Requirement::Gt(k, n) => write!(f, "{k}>{n}")?,
                Requirement::Lt(k, n) => write!(f, "{k}<{n}")?,
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    In,
    NotIn,
    Not,
    Equals,
    DoubleEquals,
    NotEquals,
    Greater,
    Less,
    Open,
    Close,
    Comma,
    End,
}

impl Token {
    /// The token as a key or a value: `in` and `notin` are operators only where an operator
    /// stands, and otherwise the label keys and values they spell.
    fn word(&self) -> Option<String> {
        match self {
            Token::Word(word) => Some(word.clone()),
            Token::In => Some("in".to_string()),
            Token::NotIn => Some("notin".to_string()),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Token::Word(word) => format!("{word:?}"),
            Token::In => "'in'".to_string(),
            Token::NotIn => "'notin'".to_string(),
            Token::Not => "'!'".to_string(),
            Token::Equals => "'='".to_string(),
            Token::DoubleEquals => "'=='".to_string(),
            Token::NotEquals => "'!='".to_string(),
            Token::Greater => "'>'".to_string(),
            Token::Less => "'<'".to_string(),
            Token::Open => "'('".to_string(),
            Token::Close => "')'".to_string(),
            Token::Comma => "','".to_string(),
            Token::End => "the end".to_string(),
        }
    }
}

/// Characters that end a word, as in Kubernetes' selector lexer.
fn is_special(c: char) -> bool {
    matches!(c, '!' | '=' | '(' | ')' | ',' | '>' | '<')
}

fn lex(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let token = match c {
            c if c.is_whitespace() => continue,
            '!' if chars.peek() == Some(&'=') => {
                chars.next();
                Token::NotEquals
            }
            '!' => Token::Not,
            '=' if chars.peek() == Some(&'=') => {
                chars.next();
                Token::DoubleEquals
            }
            '=' => Token::Equals,
            '>' => Token::Greater,
            '<' => Token::Less,
            '(' => Token::Open,
            ')' => Token::Close,
            ',' => Token::Comma,
            first => {
                let mut word = first.to_string();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || is_special(c) {
                        break;
                    }
                    word.push(c);
                    chars.next();
                }
                match word.as_str() {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Word(word),
                }
            }
        };
        tokens.push(token);
    }
    tokens.push(Token::End);
    tokens
}

struct Parser<'a> {
    tokens: &'a [Token],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> &Token {
        self.tokens.get(self.at).unwrap_or(&Token::End)
    }

    fn next(&mut self) -> Token {
        let token = self.peek().clone();
        self.at = (self.at + 1).min(self.tokens.len());
        token
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        if self.peek() == &Token::Not {
            self.next();
            return Ok(Requirement::NotExists(self.key()?));
        }
        let key = self.key()?;
        match self.peek() {
            Token::End | Token::Comma => return Ok(Requirement::Exists(key)),
            _ => {}
        }
        match self.next() {
            Token::Equals | Token::DoubleEquals => {
                Ok(Requirement::In(key, BTreeSet::from([self.value()?])))
            }
            Token::NotEquals => Ok(Requirement::NotIn(key, BTreeSet::from([self.value()?]))),
            Token::In => Ok(Requirement::In(key.clone(), self.values(&key)?)),
            Token::NotIn => Ok(Requirement::NotIn(key.clone(), self.values(&key)?)),
            Token::Greater => Ok(Requirement::Gt(key.clone(), self.integer(&key)?)),
            Token::Less => Ok(Requirement::Lt(key.clone(), self.integer(&key)?)),
            other => Err(format!(
                "expected an operator (=, ==, !=, in, notin, >, <) after {key:?}, found {}",
                other.describe()
            )),
        }
    }

    fn key(&mut self) -> Result<String, String> {
        let token = self.next();
        match token.word() {
            Some(key) => {
                validate_label_key(&key)?;
                Ok(key)
            }
            None => Err(format!("expected a label key, found {}", token.describe())),
        }
    }

    /// The value after `=`, `==` or `!=`; nothing there is the empty value.
    fn value(&mut self) -> Result<String, String> {
        if let Some(value) = self.peek().word() {
            self.next();
            validate_label_value(&value)?;
            return Ok(value);
        }
        match self.peek() {
            Token::End | Token::Comma => Ok(String::new()),
            other => Err(format!(
                "expected a label value, found {}",
                other.describe()
            )),
        }
    }

    /// `(a, b, ...)` after `in` or `notin`.
    fn values(&mut self, key: &str) -> Result<BTreeSet<String>, String> {
        match self.next() {
            Token::Open => {}
            other => {
                return Err(format!(
                    "expected '(' after the operator of {key:?}, found {}",
                    other.describe()
                ));
            }
        }
        let mut values = BTreeSet::new();
        loop {
            let token = self.next();
            if let Some(value) = token.word() {
                validate_label_value(&value)?;
                values.insert(value);
            } else {
                match token {
                    Token::Close if values.is_empty() => {
                        return Err(format!("the set of values of {key:?} is empty"));
                    }
                    other => {
                        return Err(format!(
                            "expected a value of {key:?}, found {}",
                            other.describe()
                        ));
                    }
                }
            }
            match self.next() {
                Token::Comma => continue,
                Token::Close => return Ok(values),
                other => {
                    return Err(format!(
                        "expected ',' or ')' after a value of {key:?}, found {}",
                        other.describe()
                    ));
                }
            }
        }
    }

    fn integer(&mut self, key: &str) -> Result<i64, String> {
        match self.next() {
            Token::Word(word) => word
                .parse()
                .map_err(|_| format!("{key:?} is compared with {word:?}, which is not an integer")),
            other => Err(format!(
                "expected an integer after the operator of {key:?}, found {}",
                other.describe()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_forms() {
        let labels: BTreeMap<String, String> = [
            ("team", "pay"),
            ("tier", "1"),
            ("app.kubernetes.io/name", "web"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let table = [
            ("", true),
            ("  ", true),
            ("team=pay", true),
            ("team==pay", true),
            ("team = pay", true),
            ("team=web", false),
            ("team!=web", true),
            ("team!=pay", false),
            ("gone!=x", true),
            ("gone=", false),
            ("team=", false),
            ("tier", true),
            ("!tier", false),
            ("!gone", true),
            ("! gone", true),
            ("team=pay, tier", true),
            ("team=pay,gone", false),
            ("team in (pay,infra)", true),
            ("team in (payments, infra)", false),
            ("team in (pay)", true),
            ("team notin (pay,infra)", false),
            ("team notin (web)", true),
            ("gone notin (web)", true),
            ("gone in (web)", false),
            ("team in (pay,infra),tier in (1,2),!gone", true),
            ("team in (pay,infra),tier notin (1)", false),
            ("app.kubernetes.io/name in (web)", true),
            ("tier>0", true),
            ("tier>1", false),
            ("tier<2", true),
            ("team>0", false),
            ("gone<5", false),
        ];
        for (text, expected) in table {
            let selector = LabelSelector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(selector.matches(&labels), expected, "{text}");
        }
    }

    /// Found by the property test below: `in` and `notin` are valid label keys and values, and
    /// only the operator position makes them operators (as in Kubernetes' parser).
    #[test]
    fn in_and_notin_are_keys_and_values_outside_the_operator() {
        let labels: BTreeMap<String, String> = [("in", "pay"), ("team", "notin")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let table = [
            ("in=pay", true),
            ("in", true),
            ("!in", false),
            ("notin", false),
            ("team=notin", true),
            ("team in (in,notin)", true),
            ("in notin (in)", true),
            ("team!=in", true),
        ];
        for (text, expected) in table {
            let selector = LabelSelector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(selector.matches(&labels), expected, "{text}");
            assert_eq!(LabelSelector::parse(&selector.to_string()), Ok(selector));
        }
    }

    #[test]
    fn bad_selectors_say_what_was_expected() {
        let table = [
            ("=x", "expected a label key, found '='"),
            (
                "a b=c",
                "expected an operator (=, ==, !=, in, notin, >, <) after \"a\", found \"b\"",
            ),
            (
                "k=v v",
                "expected ',' or the end after a requirement, found \"v\"",
            ),
            ("!", "expected a label key, found the end"),
            (
                "team in (payments",
                "expected ',' or ')' after a value of \"team\", found the end",
            ),
            (
                "team in payments",
                "expected '(' after the operator of \"team\", found \"payments\"",
            ),
            ("team in ()", "the set of values of \"team\" is empty"),
            ("team in (a,)", "expected a value of \"team\", found ')'"),
            ("a=b,", "expected a label key, found the end"),
            ("a,,b", "expected a label key, found ','"),
            (
                "tier>x",
                "\"tier\" is compared with \"x\", which is not an integer",
            ),
            ("bad key!=x", "expected an operator"),
            ("k=has space", "expected ',' or the end"),
            ("-k=v", "is not a valid key"),
            ("k=-v", "is not a valid label value"),
        ];
        for (text, wanted) in table {
            let err = LabelSelector::parse(text).expect_err(text);
            assert!(
                err.starts_with(&format!("labelSelector: {text:?}: ")) && err.contains(wanted),
                "{text}: {err}"
            );
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// Keys and values from a small vocabulary, so generated selectors and labels meet;
        /// `in` and `notin` are valid label keys and values too.
        const KEYS: [&str; 5] = ["team", "tier", "app.kubernetes.io/name", "in", "notin"];
        const VALUES: [&str; 7] = ["pay", "web", "1", "2", "in", "notin", "a.b_c-d"];

        /// A requirement as the test writes it, evaluated by [`Req::reference`].
        #[derive(Debug, Clone)]
        enum Req {
            Eq(usize, usize),
            Ne(usize, usize),
            EmptyEq(usize),
            In(usize, Vec<usize>),
            NotIn(usize, Vec<usize>),
            Exists(usize),
            NotExists(usize),
            Gt(usize, i64),
            Lt(usize, i64),
        }

        impl Req {
            fn text(&self, spaced: bool) -> String {
                let sp = if spaced { " " } else { "" };
                let set = |vs: &Vec<usize>| {
                    vs.iter()
                        .map(|v| VALUES[*v])
                        .collect::<Vec<_>>()
                        .join(&format!(",{sp}"))
                };
                match self {
                    Req::Eq(k, v) => format!("{}{sp}={sp}{}", KEYS[*k], VALUES[*v]),
                    Req::Ne(k, v) => format!("{}{sp}!={sp}{}", KEYS[*k], VALUES[*v]),
                    Req::EmptyEq(k) => format!("{}==", KEYS[*k]),
                    Req::In(k, vs) => format!("{} in ({})", KEYS[*k], set(vs)),
                    Req::NotIn(k, vs) => format!("{} notin ({})", KEYS[*k], set(vs)),
                    Req::Exists(k) => KEYS[*k].to_string(),
                    Req::NotExists(k) => format!("!{sp}{}", KEYS[*k]),
                    Req::Gt(k, n) => format!("{}>{n}", KEYS[*k]),
                    Req::Lt(k, n) => format!("{}<{n}", KEYS[*k]),
                }
            }

            fn reference(&self, labels: &BTreeMap<String, String>) -> bool {
                let get = |k: &usize| labels.get(KEYS[*k]).map(String::as_str);
                let int = |k: &usize| get(k).and_then(|v| v.parse::<i64>().ok());
                match self {
                    Req::Eq(k, v) => get(k) == Some(VALUES[*v]),
                    Req::Ne(k, v) => get(k) != Some(VALUES[*v]),
                    Req::EmptyEq(k) => get(k) == Some(""),
                    Req::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| VALUES[*v] == l)),
                    Req::NotIn(k, vs) => get(k).is_none_or(|l| vs.iter().all(|v| VALUES[*v] != l)),
                    Req::Exists(k) => get(k).is_some(),
                    Req::NotExists(k) => get(k).is_none(),
                    Req::Gt(k, n) => int(k).is_some_and(|v| v > *n),
                    Req::Lt(k, n) => int(k).is_some_and(|v| v < *n),
                }
            }
        }

        fn req() -> impl Strategy<Value = Req> {
            let k = 0..KEYS.len();
            let v = 0..VALUES.len();
            let vs = proptest::collection::vec(0..VALUES.len(), 1..4);
            prop_oneof![
                (k.clone(), v.clone()).prop_map(|(k, v)| Req::Eq(k, v)),
                (k.clone(), v).prop_map(|(k, v)| Req::Ne(k, v)),
                k.clone().prop_map(Req::EmptyEq),
                (k.clone(), vs.clone()).prop_map(|(k, vs)| Req::In(k, vs)),
                (k.clone(), vs).prop_map(|(k, vs)| Req::NotIn(k, vs)),
                k.clone().prop_map(Req::Exists),
                k.clone().prop_map(Req::NotExists),
                (k.clone(), -3i64..3).prop_map(|(k, n)| Req::Gt(k, n)),
                (k, -3i64..3).prop_map(|(k, n)| Req::Lt(k, n)),
            ]
        }

        fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
            proptest::collection::btree_map(
                (0..KEYS.len()).prop_map(|k| KEYS[k].to_string()),
                prop_oneof![
                    (0..VALUES.len()).prop_map(|v| VALUES[v].to_string()),
                    Just(String::new()),
                ],
                0..4,
            )
        }

        proptest! {
            #![proptest_config(crate::testing::proptest_config())]

            /// Any text: a selector or an error naming the selector, never a panic.
            #[test]
            fn any_text_parses_or_is_refused_by_name(text in "[a-z0-9 !=<>(),./_-]{0,24}") {
                if let Err(message) = LabelSelector::parse(&text) {
                    prop_assert!(message.starts_with("labelSelector: "), "{}", message);
                }
            }

            /// What the grammar writes parses; its canonical text parses back to the same
            /// selector; and it matches exactly the labels a direct evaluation says it does.
            #[test]
            fn written_selectors_round_trip_and_match_like_the_reference(
                reqs in proptest::collection::vec(req(), 0..4),
                spaced in any::<bool>(),
                labels in labels(),
            ) {
                let text = reqs.iter().map(|r| r.text(spaced)).collect::<Vec<_>>().join(",");
                let selector = LabelSelector::parse(&text)
                    .map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
                let canonical = selector.to_string();
                let reparsed = LabelSelector::parse(&canonical);
                prop_assert_eq!(reparsed, Ok(selector.clone()), "{}", canonical);
                let expected = reqs.iter().all(|r| r.reference(&labels));
                prop_assert_eq!(selector.matches(&labels), expected, "{} on {:?}", text, labels);
            }
        }
    }
}
