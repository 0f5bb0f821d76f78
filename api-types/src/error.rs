//! Validation errors: every problem found in a manifest, each with the path of its field.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One problem with one field. `field` is a dotted path such as `spec.resources.memory` or
/// `spec.seedFiles[1].path`; it is empty when the problem concerns the document as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    #[serde(default)]
    pub field: String,
    #[serde(default)]
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

/// Every problem found in one object, reported together so a user fixes a manifest in one pass.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, thiserror::Error)]
pub struct ValidationErrors {
    pub causes: Vec<FieldError>,
}

impl ValidationErrors {
    pub fn new() -> Self {
        ValidationErrors::default()
    }

    /// A single problem.
    pub fn one(field: impl Into<String>, message: impl Into<String>) -> Self {
        ValidationErrors {
            causes: vec![FieldError::new(field, message)],
        }
    }

    pub fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.causes.push(FieldError::new(field, message));
    }

    pub fn is_empty(&self) -> bool {
        self.causes.is_empty()
    }

    pub fn len(&self) -> usize {
        self.causes.len()
    }

    pub fn extend(&mut self, other: ValidationErrors) {
        self.causes.extend(other.causes);
    }

    /// Whether some cause names exactly this field.
    pub fn has_field(&self, field: &str) -> bool {
        self.causes.iter().any(|c| c.field == field)
    }

    /// `Ok(())` when nothing was found, else these errors.
    pub fn into_result(self) -> Result<(), ValidationErrors> {
        if self.causes.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.causes.is_empty() {
            return f.write_str("invalid object");
        }
        for (i, cause) in self.causes.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{cause}")?;
        }
        Ok(())
    }
}
