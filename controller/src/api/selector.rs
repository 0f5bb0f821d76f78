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
        match self.next() {
            Token::Word(key) => {
                validate_label_key(&key)?;
                Ok(key)
            }
            other => Err(format!("expected a label key, found {}", other.describe())),
        }
    }

    /// The value after `=`, `==` or `!=`; nothing there is the empty value.
    fn value(&mut self) -> Result<String, String> {
        match self.peek() {
            Token::Word(value) => {
                let value = value.clone();
                self.next();
                validate_label_value(&value)?;
                Ok(value)
            }
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
            match self.next() {
                Token::Word(value) => {
                    validate_label_value(&value)?;
                    values.insert(value);
                }
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
}
