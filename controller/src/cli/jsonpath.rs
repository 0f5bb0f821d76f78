//! `-o jsonpath=TEMPLATE`, the subset of kubectl's JSONPath templates people use: text with
//! `{.field.path}` expressions, array steps `[N]` (negative from the end) and `[*]`, a leading
//! `..`-less path, and quoted literals such as `{"\n"}`. Several results of one expression print
//! separated by spaces, as kubectl prints them.

use serde_json::Value;

use super::render::scalar;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Path(Vec<Step>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Field(String),
    Index(i64),
    All,
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Piece>);

impl Template {
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = after
                .find('}')
                .ok_or_else(|| format!("jsonpath {text:?}: a '{{' is not closed"))?;
            pieces.push(expression(after[..close].trim(), text)?);
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Ok(Template(pieces))
    }

    /// The template applied to `value`: a path that leads nowhere prints nothing.
    pub fn render(&self, value: &Value) -> String {
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Path(steps) => {
                    let found: Vec<String> = select(value, steps)
                        .into_iter()
                        .map(|v| match v {
                            Value::String(s) => s.clone(),
                            other => scalar(other),
                        })
                        .collect();
                    out.push_str(&found.join(" "));
                }
            }
        }
        out
    }
}

fn expression(inner: &str, whole: &str) -> Result<Piece, String> {
    let bad = |why: &str| format!("jsonpath {whole:?}: {{{inner}}}: {why}");
    if let Some(literal) = inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        let text = literal
            .replace("\\n", "\n")
            .replace("\\t", "\t")
            .replace("\\\"", "\"");
        return Ok(Piece::Text(text));
    }
    let path = inner.strip_prefix('$').unwrap_or(inner);
    if path.is_empty() || path == "." {
        return Ok(Piece::Path(Vec::new()));
    }
    if !path.starts_with('.') && !path.starts_with('[') {
        return Err(bad("a path starts with '.', as in {.metadata.name}"));
    }
    let mut steps = Vec::new();
    let mut chars = path;
    while !chars.is_empty() {
        if let Some(after) = chars.strip_prefix('.') {
            if after.starts_with('.') {
                return Err(bad("recursive descent '..' is not supported"));
            }
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let name = &after[..end];
            if name.is_empty() {
                return Err(bad("an empty field name"));
            }
            steps.push(Step::Field(name.to_string()));
            chars = &after[end..];
        } else if let Some(after) = chars.strip_prefix('[') {
            let end = after.find(']').ok_or_else(|| bad("a '[' is not closed"))?;
            let index = after[..end].trim();
            steps.push(match index {
                "*" => Step::All,
                _ => match index.parse::<i64>() {
                    Ok(n) => Step::Index(n),
                    Err(_) => match index.trim_matches('\'') {
                        name if index.starts_with('\'') && !name.is_empty() => {
                            Step::Field(name.to_string())
                        }
                        _ => return Err(bad("only [N], [*] and ['name'] are supported")),
                    },
                },
            });
            chars = &after[end + 1..];
        } else {
            return Err(bad("expected '.' or '['"));
        }
    }
    Ok(Piece::Path(steps))
}

fn select<'a>(value: &'a Value, steps: &[Step]) -> Vec<&'a Value> {
    let Some((step, rest)) = steps.split_first() else {
        return vec![value];
    };
    match (step, value) {
        (Step::Field(name), Value::Object(map)) => {
            map.get(name).map_or_else(Vec::new, |v| select(v, rest))
        }
        (Step::Index(i), Value::Array(items)) => {
            let at = if *i < 0 { items.len() as i64 + i } else { *i };
            usize::try_from(at)
                .ok()
                .and_then(|at| items.get(at))
                .map_or_else(Vec::new, |v| select(v, rest))
        }
        (Step::All, Value::Array(items)) => items.iter().flat_map(|v| select(v, rest)).collect(),
        (Step::All, Value::Object(map)) => map.values().flat_map(|v| select(v, rest)).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(template: &str, value: &Value) -> String {
        Template::parse(template).unwrap().render(value)
    }

    #[test]
    fn paths_arrays_and_literals() {
        let list = json!({"items": [
            {"metadata": {"name": "a", "labels": {"team": "x"}}, "status": {"phase": "Ready", "ports": [{"port": 3000}]}},
            {"metadata": {"name": "b"}, "status": {"phase": "Stopped"}},
        ]});
        assert_eq!(render("{.items[*].metadata.name}", &list), "a b");
        assert_eq!(render("{.items[0].status.phase}", &list), "Ready");
        assert_eq!(render("{.items[-1].metadata.name}", &list), "b");
        assert_eq!(render("{.items[0].status.ports[0].port}", &list), "3000");
        assert_eq!(render("{.items[0].metadata.labels['team']}", &list), "x");
        assert_eq!(
            render("n={.items[1].metadata.name}{\"\\n\"}", &list),
            "n=b\n"
        );
        assert_eq!(render("{.items[5].metadata.name}", &list), "");
        assert_eq!(render("{.nothing}", &list), "");
    }

    #[test]
    fn a_bad_template_is_named() {
        for bad in ["{.a", "{metadata}", "{..name}", "{.a[x]}"] {
            let err = Template::parse(bad).unwrap_err();
            assert!(err.starts_with("jsonpath "), "{err}");
        }
    }
}
