//! Label selectors in the forms kubectl accepts: `k=v`, `k==v`, `k!=v`, `k`, `!k`, joined by
//! commas; every requirement must hold.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<LabelSelector, String> {
        let mut requirements = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let requirement = if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key_of(key, part)?, value_of(value, part)?)
            } else if let Some((key, value)) = part.split_once("==") {
                Requirement::Equals(key_of(key, part)?, value_of(value, part)?)
            } else if let Some((key, value)) = part.split_once('=') {
                Requirement::Equals(key_of(key, part)?, value_of(value, part)?)
            } else if let Some(key) = part.strip_prefix('!') {
                Requirement::NotExists(key_of(key, part)?)
            } else {
                Requirement::Exists(key_of(part, part)?)
            };
            requirements.push(requirement);
        }
        Ok(LabelSelector { requirements })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

fn key_of(key: &str, part: &str) -> Result<String, String> {
    let key = key.trim();
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if valid {
        Ok(key.to_string())
    } else {
        Err(format!("labelSelector: {part:?} has an invalid label key"))
    }
}

fn value_of(value: &str, part: &str) -> Result<String, String> {
    let value = value.trim();
    let valid = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(value.to_string())
    } else {
        Err(format!(
            "labelSelector: {part:?} has an invalid label value"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_forms() {
        let labels: BTreeMap<String, String> = [
            ("team".to_string(), "pay".to_string()),
            ("tier".to_string(), "1".to_string()),
        ]
        .into_iter()
        .collect();
        let table = [
            ("", true),
            ("team=pay", true),
            ("team==pay", true),
            ("team=web", false),
            ("team!=web", true),
            ("team!=pay", false),
            ("tier", true),
            ("!tier", false),
            ("!gone", true),
            ("team=pay, tier", true),
            ("team=pay,gone", false),
            ("gone!=x", true),
        ];
        for (text, expected) in table {
            let selector = LabelSelector::parse(text).unwrap();
            assert_eq!(selector.matches(&labels), expected, "{text}");
        }
        for bad in ["=x", "a b=c", "k=v v", "!"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }
}
