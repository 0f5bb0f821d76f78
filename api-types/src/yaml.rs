//! YAML text to JSON values, with aliases bounded.
//!
//! A few kilobytes of anchors and aliases (`a: &a [x, x]`, `b: &b [*a, *a]`, ...) expand to
//! gigabytes once decoded, and manifests come from anyone who can call the API or push to a
//! GitOps repository. Each document is therefore walked first, counting what it expands to and
//! how deep it nests without building anything, and decoded only when both stay within bounds.
//! The walk stops at the first byte past the bound, so refusing costs no more than the bound.
//!
//! The API, `berth apply -f` and GitOps all decode YAML through it.

use std::fmt;

use serde::de::{self, DeserializeSeed, EnumAccess, MapAccess, SeqAccess};
use serde::de::{VariantAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// The deepest a document may nest (mappings and sequences), below serde_yaml's own 128.
pub const MAX_DEPTH: usize = 64;

/// The least expanded size every text is allowed, however short.
pub const MIN_EXPANSION: usize = 1 << 20;

/// How many times its own length a text may expand to.
pub const EXPANSION_FACTOR: usize = 8;

/// What a text of `len` bytes may expand to, all its documents together, counted as the JSON
/// text the documents amount to. A document without aliases stays within a few times its text.
pub fn expansion_limit(len: usize) -> usize {
    len.max(MIN_EXPANSION).saturating_mul(EXPANSION_FACTOR)
}

#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    #[error("document {document}: YAML expands beyond {limit} bytes (aliases)")]
    TooLarge { document: usize, limit: usize },
    #[error("document {document}: YAML nests deeper than {limit} levels")]
    TooDeep { document: usize, limit: usize },
    /// The parser's own error; its location is the text's (the whole stream's).
    #[error("{0}")]
    Syntax(#[source] serde_yaml::Error),
}

impl YamlError {
    /// True when the document was refused for what it expands to (answered as 413).
    pub fn is_too_large(&self) -> bool {
        matches!(self, YamlError::TooLarge { .. })
    }

    /// The same refusal for a document that is the `document`th of a larger stream (a caller
    /// that splits streams itself decodes each part as one document).
    pub fn in_document(self, document: usize) -> YamlError {
        match self {
            YamlError::TooLarge { limit, .. } => YamlError::TooLarge { document, limit },
            YamlError::TooDeep { limit, .. } => YamlError::TooDeep { document, limit },
            syntax => syntax,
        }
    }
}

/// Decodes a text holding one YAML document.
pub fn from_str(text: &str) -> Result<Value, YamlError> {
    let mut budget = Budget::for_text(text);
    budget.check(1, serde_yaml::Deserializer::from_str(text))?;
    serde_yaml::from_str(text).map_err(YamlError::Syntax)
}

/// [`from_str`] for bytes, which must be UTF-8.
pub fn from_slice(bytes: &[u8]) -> Result<Value, YamlError> {
    let mut budget = Budget::for_len(bytes.len());
    budget.check(1, serde_yaml::Deserializer::from_slice(bytes))?;
    serde_yaml::from_slice(bytes).map_err(YamlError::Syntax)
}

/// [`from_slice`] decoding through `seed`, for a caller that bounds or shapes what is built.
pub fn from_slice_seed<'de, S>(bytes: &'de [u8], seed: S) -> Result<S::Value, YamlError>
where
    S: DeserializeSeed<'de>,
{
    let mut budget = Budget::for_len(bytes.len());
    budget.check(1, serde_yaml::Deserializer::from_slice(bytes))?;
    seed.deserialize(serde_yaml::Deserializer::from_slice(bytes))
        .map_err(YamlError::Syntax)
}

/// Decodes every document of a stream (`---`-separated), in order, all of them sharing one
/// expansion bound. An empty document is `Value::Null`. Ends after the first error.
pub fn documents(text: &str) -> Documents<'_> {
    Documents {
        budget: Budget::for_text(text),
        probes: serde_yaml::Deserializer::from_str(text),
        documents: serde_yaml::Deserializer::from_str(text),
        index: 0,
        failed: false,
    }
}

/// The documents of one stream, each walked before it is decoded.
pub struct Documents<'a> {
    budget: Budget,
    probes: serde_yaml::Deserializer<'a>,
    documents: serde_yaml::Deserializer<'a>,
    index: usize,
    failed: bool,
}

impl Iterator for Documents<'_> {
    type Item = Result<Value, YamlError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let (probe, document) = (self.probes.next()?, self.documents.next()?);
        self.index += 1;
        let result = self
            .budget
            .check(self.index, probe)
            .and_then(|()| Value::deserialize(document).map_err(YamlError::Syntax));
        self.failed = result.is_err();
        Some(result)
    }
}

struct Budget {
    limit: usize,
    left: usize,
}

impl Budget {
    fn for_text(text: &str) -> Budget {
        Budget::for_len(text.len())
    }

    fn for_len(len: usize) -> Budget {
        let limit = expansion_limit(len);
        Budget { limit, left: limit }
    }

    /// Walks one document, charging what it expands to against the budget.
    fn check(
        &mut self,
        document: usize,
        de: serde_yaml::Deserializer<'_>,
    ) -> Result<(), YamlError> {
        let mut walk = Walk {
            left: &mut self.left,
            depth: 0,
            refused: None,
        };
        let result = Measure(&mut walk).deserialize(de);
        match walk.refused {
            Some(Refusal::Size) => Err(YamlError::TooLarge {
                document,
                limit: self.limit,
            }),
            Some(Refusal::Depth) => Err(YamlError::TooDeep {
                document,
                limit: MAX_DEPTH,
            }),
            // serde_yaml counts alias jumps itself (a hundred per event); past that it is the
            // same amplification. Its errors carry no kind, only this text.
            None => match result {
                Ok(()) => Ok(()),
                Err(err) if err.to_string().starts_with("repetition limit exceeded") => {
                    Err(YamlError::TooLarge {
                        document,
                        limit: self.limit,
                    })
                }
                Err(err) => Err(YamlError::Syntax(err)),
            },
        }
    }
}

enum Refusal {
    Size,
    Depth,
}

struct Walk<'a> {
    left: &'a mut usize,
    depth: usize,
    refused: Option<Refusal>,
}

impl Walk<'_> {
    fn charge<E: de::Error>(&mut self, bytes: usize) -> Result<(), E> {
        match self.left.checked_sub(bytes) {
            Some(left) => {
                *self.left = left;
                Ok(())
            }
            None => {
                self.refused = Some(Refusal::Size);
                Err(E::custom("expansion limit"))
            }
        }
    }

    fn enter<E: de::Error>(&mut self) -> Result<(), E> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            self.refused = Some(Refusal::Depth);
            return Err(E::custom("depth limit"));
        }
        // `[]` or `{}`
        self.charge(2)
    }
}

/// One node: what it adds to the JSON text (a scalar's bytes, quotes and a separator), and
/// every node below it.
struct Measure<'w, 'a>(&'w mut Walk<'a>);

impl<'de> DeserializeSeed<'de> for Measure<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Measure<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.0.charge(6)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.0.charge(21)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.0.charge(21)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.0.charge(25)
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.0.charge(s.len().saturating_add(3))
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.charge(5)
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.0.charge(5)
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.enter()?;
        while seq.next_element_seed(Measure(&mut *self.0))?.is_some() {}
        self.0.depth -= 1;
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.0.enter()?;
        while map.next_key_seed(Measure(&mut *self.0))?.is_some() {
            map.next_value_seed(Measure(&mut *self.0))?;
        }
        self.0.depth -= 1;
        Ok(())
    }

    /// A tagged node (`!tag value`): the tag and the value.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        let ((), variant) = data.variant_seed(Measure(&mut *self.0))?;
        variant.newtype_variant_seed(Measure(&mut *self.0))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// `levels` levels of `fanout` aliases each: 9^levels leaves from a few hundred bytes.
    fn laughs(levels: usize, fanout: usize) -> String {
        let mut text = String::from("kind: Project\nl0: &l0 \"lol\"\n");
        for level in 1..=levels {
            let aliases = vec![format!("*l{}", level - 1); fanout].join(", ");
            text.push_str(&format!("l{level}: &l{level} [{aliases}]\n"));
        }
        text
    }

    #[test]
    fn a_billion_laughs_is_refused_before_it_is_built() {
        let text = laughs(10, 10);
        assert!(text.len() < 1024, "{}", text.len());
        let started = Instant::now();
        let err = from_str(&text).unwrap_err();
        assert!(
            matches!(err, YamlError::TooLarge { document: 1, .. }),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "document 1: YAML expands beyond {} bytes (aliases)",
                8 << 20
            )
        );
        // Fully built this would be 10^10 strings; walking stops at the bound.
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_large_anchor_repeated_is_refused_and_its_document_named() {
        // 150 KB: one 100 KB string and fifteen thousand aliases of it, 1.5 GB expanded.
        let mut text = format!("a: &a \"{}\"\nb: [", "x".repeat(100_000));
        text.push_str(&vec!["*a"; 15_000].join(","));
        text.push_str("]\n");
        let stream = format!("kind: Project\n---\n{text}");
        let err = documents(&stream)
            .collect::<Result<Vec<_>, _>>()
            .unwrap_err();
        assert!(
            matches!(err, YamlError::TooLarge { document: 2, .. }),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("document 2: YAML expands beyond ")
        );
    }

    #[test]
    fn nesting_is_bounded_and_named() {
        let deep = format!(
            "{}1{}",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        assert_eq!(
            from_str(&deep).unwrap_err().to_string(),
            format!("document 1: YAML nests deeper than {MAX_DEPTH} levels")
        );
        let ok = format!("{}1{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(from_str(&ok).is_ok());
        // Deeper than serde_yaml's own limit through aliases is the same refusal.
        let mut text = String::from("a0: &a0 [1]\n");
        for i in 1..200 {
            text.push_str(&format!("a{i}: &a{i} [*a{}]\n", i - 1));
        }
        assert!(matches!(
            from_str(&text).unwrap_err(),
            YamlError::TooDeep { .. }
        ));
    }

    #[test]
    fn ordinary_documents_and_modest_aliases_decode_as_before() {
        let text = "kind: Project\nmetadata: {name: a}\nspec:\n  seedFiles:\n    - &f {path: x, content: hi}\n    - *f\n---\n---\n- 1\n- true\n- ~\n";
        let docs = documents(text).collect::<Result<Vec<_>, _>>().unwrap();
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[0]["spec"]["seedFiles"][1]["content"], "hi");
        assert_eq!(docs[1], Value::Null);
        assert_eq!(docs[2][0], 1);
        // A text with no aliases is never near its bound, however large.
        let big = format!("k: \"{}\"\n", "y".repeat(4 << 20));
        assert!(from_str(&big).is_ok());
        // A syntax error keeps the parser's location.
        let err = from_str("kind: [").unwrap_err();
        assert!(matches!(err, YamlError::Syntax(_)));
        assert!(err.to_string().contains("line"), "{err}");
    }
}
