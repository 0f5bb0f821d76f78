//! Who may pass the preview listener without a bearer token: a one-time ticket, issued through
//! the API to a member for one preview host, is exchanged on that host (`?berth-ticket=...`)
//! for a session cookie scoped to that host alone. The console's preview links carry such a
//! ticket; its own cookie never reaches a preview host.
//!
//! Tickets are single-use and short-lived; sessions last [`SESSION_TTL`]. Both are kept in
//! memory only (a restarted daemon forgets them: people get a new link), and only their
//! sha256 is kept, so a dump of memory structures names no usable value. Membership is checked
//! again on every request a session makes, so removing a member shuts their sessions out.

use std::collections::{HashMap, VecDeque};
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
/// The most tickets, and the most sessions, kept. Past it a new one is refused: one user's
/// tickets never push out another user's.
const MAX_ENTRIES: usize = 100_000;
/// The most tickets, and the most sessions, one identity holds; past it that identity's own
/// entry expiring first makes room.
pub const MAX_PER_IDENTITY: usize = 64;

/// Why no ticket or session was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("as many preview tickets and sessions as the daemon keeps are open; try again later")]
pub struct Full;

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
    tickets: Mutex<Table>,
    sessions: Mutex<Table>,
}

/// Tickets or sessions by hash, and each identity's keys in the order they expire (every entry
/// of a table lives as long): finding an identity's oldest costs no walk over everyone's.
#[derive(Debug, Default)]
struct Table {
    entries: HashMap<String, Entry>,
    /// May still name keys redeemed or expired since; pruned as the identity is next seen.
    by_identity: HashMap<String, VecDeque<String>>,
}

fn secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn hash(value: &str) -> String {
    hex::encode(Sha256::digest(value.as_bytes()))
}

fn insert(table: &Mutex<Table>, grant: Grant, ttl: Duration) -> Result<String, Full> {
    let value = secret();
    let now = Instant::now();
    let mut guard = table.lock().unwrap_or_else(|e| e.into_inner());
    let Table {
        entries,
        by_identity,
    } = &mut *guard;
    if entries.len() >= MAX_ENTRIES {
        // Expired entries are dropped when they would otherwise fill the table.
        entries.retain(|_, e| e.expires > now);
        by_identity.retain(|_, keys| {
            keys.retain(|k| entries.contains_key(k));
            !keys.is_empty()
        });
    }
    let keys = by_identity.entry(grant.identity.clone()).or_default();
    keys.retain(|k| match entries.get(k) {
        Some(e) if e.expires > now => true,
        Some(_) => {
            entries.remove(k);
            false
        }
        None => false,
    });
    while keys.len() >= MAX_PER_IDENTITY {
        if let Some(oldest) = keys.pop_front() {
            entries.remove(&oldest);
        }
    }
    if entries.len() >= MAX_ENTRIES {
        return Err(Full);
    }
    let key = hash(&value);
    keys.push_back(key.clone());
    entries.insert(
        key,
        Entry {
            grant,
            expires: now + ttl,
        },
    );
    Ok(value)
}

impl Tickets {
    /// A fresh ticket for `grant`, good once within [`TICKET_TTL`].
    pub fn issue(&self, grant: Grant) -> Result<String, Full> {
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
            .entries
            .remove(&hash(ticket))?;
        if entry.expires <= Instant::now() || entry.grant.host != host {
            return None;
        }
        let grant = entry.grant;
        let cookie = insert(&self.sessions, grant.clone(), SESSION_TTL).ok()?;
        Some((cookie, grant))
    }

    /// The grant of the session whose cookie is `cookie`, if it is live and for `host`.
    pub fn session(&self, cookie: &str, host: &str) -> Option<Grant> {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let entry = sessions.entries.get(&hash(cookie))?;
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
        let ticket = tickets.issue(grant(host)).unwrap();
        let (cookie, got) = tickets.redeem(&ticket, host).expect("first use");
        assert_eq!(got, grant(host));
        assert!(tickets.redeem(&ticket, host).is_none(), "single use");
        assert_eq!(tickets.session(&cookie, host), Some(grant(host)));
        assert!(tickets.session(&cookie, "web--8001.localhost").is_none());
        assert!(
            tickets.session(&ticket, host).is_none(),
            "a ticket is no cookie"
        );

        let other = tickets.issue(grant(host)).unwrap();
        assert!(tickets.redeem(&other, "api--8000.localhost").is_none());
        assert!(
            tickets.redeem(&other, host).is_none(),
            "burnt on the wrong host"
        );
    }

    fn grant_of(identity: &str, host: &str) -> Grant {
        Grant {
            identity: identity.into(),
            ..grant(host)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_identity_never_pushes_out_anothers_tickets_or_sessions() {
        let tickets = Tickets::default();
        let host = "web--8000.localhost";
        let bobs_ticket = tickets.issue(grant_of("bob", host)).unwrap();
        let bobs_session = tickets
            .redeem(&tickets.issue(grant_of("bob", host)).unwrap(), host)
            .unwrap()
            .0;
        let first = tickets.issue(grant(host)).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..MAX_PER_IDENTITY {
            tickets.issue(grant(host)).unwrap();
        }
        assert!(
            tickets.redeem(&first, host).is_none(),
            "alice's oldest made room"
        );
        let mut cookies = Vec::new();
        for _ in 0..2 * MAX_PER_IDENTITY {
            let ticket = tickets.issue(grant(host)).unwrap();
            cookies.push(tickets.redeem(&ticket, host).unwrap().0);
        }
        assert!(tickets.session(&cookies[0], host).is_none());
        assert!(tickets.session(cookies.last().unwrap(), host).is_some());
        assert!(tickets.session(&bobs_session, host).is_some());
        assert!(tickets.redeem(&bobs_ticket, host).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_store_refuses_new_tickets() {
        let tickets = Tickets::default();
        let host = "web--8000.localhost";
        for i in 0..MAX_ENTRIES {
            tickets
                .issue(grant_of(&format!("u{}", i / MAX_PER_IDENTITY), host))
                .unwrap();
        }
        assert_eq!(tickets.issue(grant_of("late", host)), Err(Full));
        tokio::time::advance(TICKET_TTL).await;
        assert!(tickets.issue(grant_of("late", host)).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn tickets_and_sessions_expire() {
        let tickets = Tickets::default();
        let host = "web--8000.localhost";
        let late = tickets.issue(grant(host)).unwrap();
        tokio::time::advance(TICKET_TTL + Duration::from_secs(1)).await;
        assert!(tickets.redeem(&late, host).is_none());

        let ticket = tickets.issue(grant(host)).unwrap();
        let (cookie, _) = tickets.redeem(&ticket, host).unwrap();
        tokio::time::advance(SESSION_TTL - Duration::from_secs(1)).await;
        assert!(tickets.session(&cookie, host).is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(tickets.session(&cookie, host).is_none());
    }
}
