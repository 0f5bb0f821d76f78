//! Who a TCP caller is: bearer tokens. A token is 32 random bytes, shown once when its user is
//! added; berth keeps only its sha256, so a copy of the database grants nobody access.

use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::store::{Store, StoreError, User};

/// Every token starts with this, so a leaked one is recognisable by secret scanners.
pub const TOKEN_PREFIX: &str = "berth_";
const TOKEN_BYTES: usize = 32;

/// A fresh token: `berth_` and 32 random bytes, base64url without padding.
pub fn new_token() -> String {
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// What the store keeps of a token.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The user a bearer token belongs to, or `None` for a token nobody holds.
pub fn authenticate(store: &Store, token: &str) -> Result<Option<User>, StoreError> {
    if token.is_empty() {
        return Ok(None);
    }
    store.user_by_token_hash(&token_hash(token))
}

/// Compares two secrets (tokens, CSRF values) in time that does not depend on where they
/// differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// `Authorization: Bearer TOKEN` → `TOKEN`.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_prefixed_and_stored_only_as_hashes() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 43);
        assert_eq!(token_hash(&a).len(), 64);
        assert!(!token_hash(&a).contains(&a[TOKEN_PREFIX.len()..]));

        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("berth.db")).unwrap();
        store.add_user("ana", &token_hash(&a), false).unwrap();
        assert_eq!(authenticate(&store, &a).unwrap().unwrap().name, "ana");
        assert!(authenticate(&store, &b).unwrap().is_none());
        assert!(authenticate(&store, "").unwrap().is_none());
    }

    #[test]
    fn bearer_headers() {
        let table = [
            (Some("Bearer abc"), Some("abc")),
            (Some("bearer  abc "), Some("abc")),
            (Some("Basic abc"), None),
            (Some("Bearer "), None),
            (Some("abc"), None),
            (None, None),
        ];
        for (header, expected) in table {
            assert_eq!(bearer(header), expected, "{header:?}");
        }
    }
}
