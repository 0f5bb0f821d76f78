//! Project secrets: berth's store is the authoritative copy, sealed with an AEAD
//! (ChaCha20-Poly1305, a fresh random nonce per value) under a key kept in `<dataDir>/secrets.key`
//! (0600, created on first start). The project uid and the key name are the associated data, so
//! a sealed value moved to another project or key does not open.
//!
//! A change bumps the project's secrets revision and is published on
//! [`Store::subscribe_secrets`]; the controller propagates [`Secrets::values`] from there.
//! Values never leave this module except through [`Secrets::get`] and [`Secrets::values`].
//!
//! A GitSource's credentials are sealed the same way, keyed by the GitSource's uid where a
//! project's secrets are keyed by the project's.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aws_lc_rs::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use rand::RngCore;

use crate::store::{SecretEntry, SecretsChange, Store, StoreError};

/// The key file's name under the data directory.
pub const KEY_FILE: &str = "secrets.key";
/// The longest value berth keeps: secrets are tokens and keys, not archives.
pub const MAX_VALUE_BYTES: usize = 1 << 20;
const KEY_LEN: usize = 32;
/// First byte of a sealed value, so the format can change without guessing.
const SEALED_V1: u8 = 1;

#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("{}: {source}", path.display())]
    KeyFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: holds {len} bytes, a secrets key is {KEY_LEN}", path.display())]
    KeyLength { path: PathBuf, len: usize },
    #[error("key: {0}")]
    InvalidKey(String),
    #[error("value: {0}")]
    InvalidValue(String),
    #[error(
        "secret {key:?} cannot be opened: the secrets key does not match the one it was sealed with"
    )]
    Unsealable { key: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The sealing key.
struct Cipher {
    key: LessSafeKey,
}

impl Cipher {
    /// Reads the key file, or creates it (32 random bytes, 0600) when there is none.
    fn load_or_create(path: &Path) -> Result<Cipher, SecretsError> {
        let io = |source| SecretsError::KeyFile {
            path: path.to_path_buf(),
            source,
        };
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let mut bytes = vec![0u8; KEY_LEN];
                rand::rng().fill_bytes(&mut bytes);
                write_new_key(path, &bytes).map_err(io)?;
                tracing::info!(path = %path.display(), "created the secrets key");
                bytes
            }
            Err(err) => return Err(io(err)),
        };
        if bytes.len() != KEY_LEN {
            return Err(SecretsError::KeyLength {
                path: path.to_path_buf(),
                len: bytes.len(),
            });
        }
        // A key someone loosened by hand is tightened again rather than served as is.
        crate::store::restrict_mode(path).map_err(|err| match err {
            StoreError::Io { source, .. } => io(source),
            other => SecretsError::Store(other),
        })?;
        let unbound =
            UnboundKey::new(&CHACHA20_POLY1305, &bytes).map_err(|_| SecretsError::KeyLength {
                path: path.to_path_buf(),
                len: bytes.len(),
            })?;
        Ok(Cipher {
            key: LessSafeKey::new(unbound),
        })
    }

    fn seal(&self, aad: &[u8], plain: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let mut in_out = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut in_out,
            )
            .expect("sealing fails only for values over 256 GiB");
        let mut sealed = Vec::with_capacity(1 + NONCE_LEN + in_out.len());
        sealed.push(SEALED_V1);
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(&in_out);
        sealed
    }

    fn open(&self, aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        let (&version, rest) = sealed.split_first()?;
        if version != SEALED_V1 || rest.len() < NONCE_LEN {
            return None;
        }
        let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut in_out = ciphertext.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(aad), &mut in_out)
            .ok()?;
        Some(plain.to_vec())
    }
}

fn write_new_key(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn aad(project_uid: &str, key: &str) -> Vec<u8> {
    format!("berth-secret\0{project_uid}\0{key}").into_bytes()
}

/// The secrets of every project.
pub struct Secrets {
    store: Arc<Store>,
    cipher: Cipher,
}

impl Secrets {
    /// Opens the secrets of `store` with the key under `data_dir`, creating the key on first
    /// start.
    pub fn open(store: Arc<Store>, data_dir: &Path) -> Result<Secrets, SecretsError> {
        let cipher = Cipher::load_or_create(&data_dir.join(KEY_FILE))?;
        Ok(Secrets { store, cipher })
    }

    /// Sets `key` of a project to `value`; returns the project's new secrets revision.
    pub fn set(&self, project_uid: &str, key: &str, value: &[u8]) -> Result<u64, SecretsError> {
        berth_api::validate_env_key(key).map_err(SecretsError::InvalidKey)?;
        check_value(value)?;
        let sealed = self.cipher.seal(&aad(project_uid, key), value);
        Ok(self.store.put_secret(project_uid, key, &sealed)?)
    }

    /// The value of one secret.
    pub fn get(&self, project_uid: &str, key: &str) -> Result<Option<String>, SecretsError> {
        let Some(sealed) = self.store.sealed_secret(project_uid, key)? else {
            return Ok(None);
        };
        self.open_value(project_uid, key, &sealed).map(Some)
    }

    /// Keys and update times, never values.
    pub fn list(&self, project_uid: &str) -> Result<Vec<SecretEntry>, SecretsError> {
        Ok(self.store.secret_entries(project_uid)?)
    }

    /// Deletes one secret; `Ok(false)` when there was none.
    pub fn delete(&self, project_uid: &str, key: &str) -> Result<bool, SecretsError> {
        Ok(self.store.delete_secret(project_uid, key)?)
    }

    /// Every secret of a project, by key: what the controller propagates into the workspace.
    pub fn values(&self, project_uid: &str) -> Result<BTreeMap<String, String>, SecretsError> {
        self.store
            .sealed_secrets(project_uid)?
            .into_iter()
            .map(|(key, sealed)| {
                let value = self.open_value(project_uid, &key, &sealed)?;
                Ok((key, value))
            })
            .collect()
    }

    /// The project's secrets revision: 0 before any secret, then one more per change.
    pub fn revision(&self, project_uid: &str) -> Result<u64, SecretsError> {
        Ok(self.store.secrets_revision(project_uid)?)
    }

    /// Every secrets change from now on.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<SecretsChange> {
        self.store.subscribe_secrets()
    }

    fn open_value(
        &self,
        project_uid: &str,
        key: &str,
        sealed: &[u8],
    ) -> Result<String, SecretsError> {
        let plain = self
            .cipher
            .open(&aad(project_uid, key), sealed)
            .ok_or_else(|| SecretsError::Unsealable {
                key: key.to_string(),
            })?;
        // Checked at set: a value that opens is UTF-8.
        String::from_utf8(plain).map_err(|_| SecretsError::Unsealable {
            key: key.to_string(),
        })
    }
}

/// Values go into environments and a `.env` file: text, no NUL, bounded.
fn check_value(value: &[u8]) -> Result<(), SecretsError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(SecretsError::InvalidValue(format!(
            "{} bytes is over the limit of {MAX_VALUE_BYTES}",
            value.len()
        )));
    }
    let text = std::str::from_utf8(value)
        .map_err(|_| SecretsError::InvalidValue("must be UTF-8 text".to_string()))?;
    if text.contains('\0') {
        return Err(SecretsError::InvalidValue(
            "must not contain a NUL byte".to_string(),
        ));
    }
    Ok(())
}

/// Secret values shorter than this are not redacted: they would mask ordinary words.
pub const REDACT_MIN_LEN: usize = 3;

/// `text` with every one of `secrets` (of at least [`REDACT_MIN_LEN`] bytes) replaced by
/// `[REDACTED]`.
pub fn redact<'a>(text: &str, secrets: impl IntoIterator<Item = &'a String>) -> String {
    let mut text = text.to_string();
    for secret in secrets {
        if secret.len() >= REDACT_MIN_LEN && text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), "[REDACTED]");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Commit;
    use crate::store::Desired;

    fn project(store: &Store, name: &str) -> String {
        store
            .create(
                Desired::project(name, serde_json::json!({})),
                Commit::Persist,
            )
            .unwrap()
            .uid()
            .to_string()
    }

    #[test]
    fn values_round_trip_sealed_and_go_with_their_project() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("berth.db")).unwrap());
        let secrets = Secrets::open(Arc::clone(&store), dir.path()).unwrap();
        let uid = project(&store, "pay");
        let mut changes = secrets.subscribe();
        assert_eq!(secrets.revision(&uid).unwrap(), 0);
        assert_eq!(secrets.set(&uid, "API_TOKEN", b"s3cr3t-value").unwrap(), 1);
        assert_eq!(changes.try_recv().unwrap().revision, 1);
        assert_eq!(
            secrets.get(&uid, "API_TOKEN").unwrap().as_deref(),
            Some("s3cr3t-value")
        );
        // Sealed rows hold no plain text and do not open under another key name.
        let sealed = store.sealed_secret(&uid, "API_TOKEN").unwrap().unwrap();
        assert!(!sealed.windows(6).any(|w| w == b"s3cr3t"));
        assert!(secrets.cipher.open(&aad(&uid, "OTHER"), &sealed).is_none());
        // Two seals of one value differ: a nonce per value.
        assert_ne!(
            secrets.cipher.seal(b"a", b"v"),
            secrets.cipher.seal(b"a", b"v")
        );

        let key_mode = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(key_mode.permissions().mode() & 0o777, 0o600);

        assert!(matches!(
            secrets.set(&uid, "1BAD", b"x"),
            Err(SecretsError::InvalidKey(_))
        ));
        assert!(matches!(
            secrets.set(&uid, "OK", b"\xff"),
            Err(SecretsError::InvalidValue(_))
        ));
        assert!(secrets.set("no-such-uid", "K", b"v").is_err());

        assert!(secrets.delete(&uid, "API_TOKEN").unwrap());
        assert!(!secrets.delete(&uid, "API_TOKEN").unwrap());
        assert_eq!(secrets.revision(&uid).unwrap(), 2);
        secrets.set(&uid, "A", b"1").unwrap();
        crate::testing::fixtures::delete_project(&store, "pay", Default::default());
        assert!(secrets.values(&uid).unwrap().is_empty());
        assert_eq!(secrets.revision(&uid).unwrap(), 0);
    }

    #[test]
    fn the_key_survives_a_restart_and_a_wrong_key_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("berth.db");
        let uid = {
            let store = Arc::new(Store::open(&db).unwrap());
            let secrets = Secrets::open(Arc::clone(&store), dir.path()).unwrap();
            let uid = project(&store, "pay");
            secrets.set(&uid, "K", b"value").unwrap();
            uid
        };
        let store = Arc::new(Store::open(&db).unwrap());
        let secrets = Secrets::open(Arc::clone(&store), dir.path()).unwrap();
        assert_eq!(secrets.values(&uid).unwrap()["K"], "value");

        std::fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        let secrets = Secrets::open(store, dir.path()).unwrap();
        assert!(matches!(
            secrets.get(&uid, "K"),
            Err(SecretsError::Unsealable { .. })
        ));
    }
}
