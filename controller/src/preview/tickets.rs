//! Who may pass the preview listener without a bearer token: a one-time ticket, issued through
//! the API to a member for one preview host, is exchanged on that host (`?berth-ticket=...`)
//! for a session cookie scoped to that host alone. The console's preview links carry such a
//! ticket; its own cookie never reaches a preview host.
//!
//! Tickets are single-use and short-lived; sessions last [`SESSION_TTL`]. Both are kept in
//! memory only (a restarted daemon forgets them: people get a new link), and only their
//! sha256 is kept, so a dump of memory structures names no usable value. Membership is checked
//! again on every request a session makes, so removing a member shuts their sessions out.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// How long a ticket may wait to be exchanged.
pub const TICKET_TTL: Duration = Duration::from_secs(60);
/// How long a preview session (its cookie) lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The most tickets and sessions kept; past it the oldest expiring go first.
const MAX_ENTRIES: usize = 100_000;

/// Who a ticket or session stands for, and where it is good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The user (or `unix:<name>` of a local admin) it was issued to.
    pub identity: String,
    pub admin: bool,
    /// The project's uid: a project deleted and made again under its name is another project.
    pub project_uid: String,
    /// The preview host (`<name>--<port>.<previewDomain>`, without the listener's port).
    pub host: String,
}

#[derive(Debug)]
struct Entry {
    grant: Grant,
    expires: Instant,
}

/// The ticket and session store.
#[derive(Debug, Default)]
pub struct Tickets {
    tickets: Mutex<HashMap<String, Entry>>,
    sessions: Mutex<HashMap<String, Entry>>,
}

fn secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn hash(value: &str) -> String {
    hex::encode(Sha256::digest(value.as_bytes()))
}

fn insert(map: &Mutex<HashMap<String, Entry>>, grant: Grant, ttl: Duration) -> String {
    let value = secret();
    let now = Instant::now();
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    map.retain(|_, e| e.expires > now);
    if map.len() >= MAX_ENTRIES
        && let Some(oldest) = map
            .iter()
            .min_by_key(|(_, e)| e.expires)
            .map(|(k, _)| k.clone())
    {
        map.remove(&oldest);
    }
    map.insert(
        hash(&value),
        Entry {
            grant,
            expires: now + ttl,
        },
    );
    value
}

impl Tickets {
    /// A fresh ticket for `grant`, good once within [`TICKET_TTL`].
    pub fn issue(&self, grant: Grant) -> String {
        insert(&self.tickets, grant, TICKET_TTL)
    }

    /// Exchanges a ticket presented on `host` for a new session's cookie value. A ticket is
    /// gone after its first presentation, whatever the host: a ticket shown on the wrong
    /// host has leaked and is no good anywhere.
    pub fn redeem(&self, ticket: &str, host: &str) -> Option<(String, Grant)> {
        let entry = self
            .tickets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&hash(ticket))?;
        if entry.expires <= Instant::now() || entry.grant.host != host {
            return None;
        }
        let grant = entry.grant;
        let cookie = insert(&self.sessions, grant.clone(), SESSION_TTL);
        Some((cookie, grant))
    }

    /// The grant of the session whose cookie is `cookie`, if it is live and for `host`.
    pub fn session(&self, cookie: &str, host: &str) -> Option<Grant> {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let entry = sessions.get(&hash(cookie))?;
        (entry.expires > Instant::now() && entry.grant.host == host).then(|| entry.grant.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(host: &str) -> Grant {
        Grant {
            identity: "alice".into(),
            admin: false,
            project_uid: "u1".into(),
            host: host.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_ticket_is_good_once_on_its_own_host_and_its_session_there_only() {
        let tickets = Tickets::default();
        let host = "web--8000.localhost";
        let ticket = tickets.issue(grant(host));
        let (cookie, got) = tickets.redeem(&ticket, host).expect("first use");
        assert_eq!(got, grant(host));
        assert!(tickets.redeem(&ticket, host).is_none(), "single use");
        assert_eq!(tickets.session(&cookie, host), Some(grant(host)));
        assert!(tickets.session(&cookie, "web--8001.localhost").is_none());
        assert!(
            tickets.session(&ticket, host).is_none(),
            "a ticket is no cookie"
        );

        let other = tickets.issue(grant(host));
        assert!(tickets.redeem(&other, "api--8000.localhost").is_none());
        assert!(
            tickets.redeem(&other, host).is_none(),
            "burnt on the wrong host"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tickets_and_sessions_expire() {
        let tickets = Tickets::default();
        let host = "web--8000.localhost";
        let late = tickets.issue(grant(host));
        tokio::time::advance(TICKET_TTL + Duration::from_secs(1)).await;
        assert!(tickets.redeem(&late, host).is_none());

        let ticket = tickets.issue(grant(host));
        let (cookie, _) = tickets.redeem(&ticket, host).unwrap();
        tokio::time::advance(SESSION_TTL - Duration::from_secs(1)).await;
        assert!(tickets.session(&cookie, host).is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(tickets.session(&cookie, host).is_none());
    }
}
