//! The console's sessions: a berth token (or a one-time sign-in token `berth ui` asked the
//! daemon for) is exchanged for a session whose cookie the browser sends back, bounded in
//! number and in lifetime. Each session carries its own CSRF token, which every form repeats.
//! Only sha256 hashes of cookies and sign-in tokens are kept, in memory: a restarted daemon
//! signs everyone out.
//!
//! Sessions are bound to the user's id (`User::id`): at most 16 per user (a user's own oldest
//! make room; a full console refuses a sign-in rather than end another's session) and 30
//! sign-ins a minute per user.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// How long a session lasts from sign-in, whatever it does meanwhile.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// How long a one-time sign-in token waits to be used.
pub const SIGN_IN_TTL: Duration = Duration::from_secs(300);
/// The most sessions kept. Past it a new sign-in is refused: one user's sessions never sign
/// another user out.
pub const MAX_SESSIONS: usize = 4096;
/// The most sessions one user keeps; past it that user's session expiring first is signed out.
pub const MAX_SESSIONS_PER_USER: usize = 16;
/// The most sign-ins one user makes within [`SIGN_IN_WINDOW`].
pub const MAX_SIGN_INS: usize = 30;
pub const SIGN_IN_WINDOW: Duration = Duration::from_secs(60);
/// The most unused sign-in tokens kept.
const MAX_SIGN_IN_TOKENS: usize = 256;
/// The most failed sign-ins (a token that is not valid, a used or unknown link) one source
/// address makes within [`SIGN_IN_WINDOW`]; past it the source's sign-ins are refused (429)
/// until the window moves on. Other addresses sign in as before.
pub const MAX_FAILED_SIGN_INS: usize = 10;
/// The most source addresses whose failures are remembered; past it the quietest are forgotten.
const MAX_FAILING_SOURCES: usize = 4096;

/// Who a session (or a sign-in token) stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// A user of the TCP listener, or `unix:<name>` for a local admin.
    pub identity: String,
    pub admin: bool,
    /// Signed in with a bearer token (checked again on every request, so a removed user is
    /// signed out), rather than with a one-time token minted for a local admin.
    pub by_token: bool,
    /// The user's id (`User::id`) when signed in with a token: the session is that user's, not
    /// the next one's to be given the same name.
    pub user_id: Option<String>,
}

/// Why a session was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("too many sign-ins for this user; wait a minute and try again")]
    TooOften,
    #[error("the console holds as many sessions as it keeps; try again later")]
    Full,
}

/// A live session as a request sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub principal: Principal,
    /// The value every form of this session carries, compared with [`Sessions::check_csrf`].
    pub csrf: String,
}

#[derive(Debug)]
struct Entry<T> {
    value: T,
    expires: Instant,
}

/// Sessions and one-time sign-in tokens.
#[derive(Debug, Default)]
pub struct Sessions {
    sessions: Mutex<HashMap<String, Entry<Session>>>,
    sign_in: Mutex<HashMap<String, Entry<Principal>>>,
    /// Per identity: when its recent sign-ins happened, oldest first.
    recent: Mutex<HashMap<String, VecDeque<Instant>>>,
    /// Per source address: when its recent failed sign-ins happened, oldest first.
    failed: Mutex<HashMap<String, VecDeque<Instant>>>,
}

/// 256 random bits, URL-safe.
pub fn secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn hash(value: &str) -> String {
    hex::encode(Sha256::digest(value.as_bytes()))
}

pub use crate::auth::same_secret as same;

/// Drops the expired entries, and when still at `max`, the one expiring first.
fn make_room<T>(map: &mut HashMap<String, Entry<T>>, max: usize) {
    let now = Instant::now();
    map.retain(|_, e| e.expires > now);
    while map.len() >= max {
        let Some(first) = map
            .iter()
            .min_by_key(|(_, e)| e.expires)
            .map(|(k, _)| k.clone())
        else {
            break;
        };
        map.remove(&first);
    }
}

impl Sessions {
    /// Opens a session for `principal`: its cookie value and the session. Refused when the
    /// principal signed in too often lately, or when the console is full of other users'
    /// sessions; the principal's own oldest session makes room for its new one.
    pub fn open(&self, principal: Principal) -> Result<(String, Session), Refused> {
        self.count_sign_in(&principal.identity)?;
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        sessions.retain(|_, e| e.expires > now);
        let own = |e: &Entry<Session>| e.value.principal.identity == principal.identity;
        while sessions.values().filter(|e| own(e)).count() >= MAX_SESSIONS_PER_USER {
            let Some(oldest) = sessions
                .iter()
                .filter(|(_, e)| own(e))
                .min_by_key(|(_, e)| e.expires)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            sessions.remove(&oldest);
        }
        if sessions.len() >= MAX_SESSIONS {
            return Err(Refused::Full);
        }
        let cookie = secret();
        let session = Session {
            principal,
            csrf: secret(),
        };
        sessions.insert(
            hash(&cookie),
            Entry {
                value: session.clone(),
                expires: Instant::now() + SESSION_TTL,
            },
        );
        Ok((cookie, session))
    }

    /// Counts a sign-in of `identity`, refusing it past [`MAX_SIGN_INS`] within
    /// [`SIGN_IN_WINDOW`]. Identities are users (at most as many as the store holds), and
    /// those with no sign-in in the window are forgotten.
    fn count_sign_in(&self, identity: &str) -> Result<(), Refused> {
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let in_window = |at: &Instant| now.duration_since(*at) < SIGN_IN_WINDOW;
        recent.retain(|_, times| times.back().is_some_and(in_window));
        let times = recent.entry(identity.to_string()).or_default();
        while times.front().is_some_and(|at| !in_window(at)) {
            times.pop_front();
        }
        if times.len() >= MAX_SIGN_INS {
            return Err(Refused::TooOften);
        }
        times.push_back(now);
        Ok(())
    }

    /// Whether `source` (a client address) failed [`MAX_FAILED_SIGN_INS`] times within
    /// [`SIGN_IN_WINDOW`]: its next sign-in is refused without looking at the token.
    pub fn failing(&self, source: &str) -> bool {
        let now = Instant::now();
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        failed.get_mut(source).is_some_and(|times| {
            while times
                .front()
                .is_some_and(|at| now.duration_since(*at) >= SIGN_IN_WINDOW)
            {
                times.pop_front();
            }
            times.len() >= MAX_FAILED_SIGN_INS
        })
    }

    /// Counts a failed sign-in from `source`.
    pub fn count_failure(&self, source: &str) {
        let now = Instant::now();
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        let in_window = |at: &Instant| now.duration_since(*at) < SIGN_IN_WINDOW;
        if failed.len() >= MAX_FAILING_SOURCES {
            failed.retain(|_, times| times.back().is_some_and(in_window));
        }
        if failed.len() >= MAX_FAILING_SOURCES && !failed.contains_key(source) {
            let quietest = failed
                .iter()
                .min_by_key(|(_, times)| times.back().copied())
                .map(|(k, _)| k.clone());
            if let Some(key) = quietest {
                failed.remove(&key);
            }
        }
        let times = failed.entry(source.to_string()).or_default();
        while times.len() >= MAX_FAILED_SIGN_INS {
            times.pop_front();
        }
        times.push_back(now);
    }

    /// The session whose cookie is `cookie`, while it lasts.
    pub fn get(&self, cookie: &str) -> Option<Session> {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let entry = sessions.get(&hash(cookie))?;
        (entry.expires > Instant::now()).then(|| entry.value.clone())
    }

    /// Signs the session of `cookie` out.
    pub fn close(&self, cookie: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&hash(cookie));
    }

    /// How many sessions are live.
    pub fn count(&self) -> usize {
        let now = Instant::now();
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|e| e.expires > now)
            .count()
    }

    /// A one-time sign-in token for `principal`, good once within [`SIGN_IN_TTL`].
    pub fn mint_sign_in(&self, principal: Principal) -> String {
        let token = secret();
        let mut tokens = self.sign_in.lock().unwrap_or_else(|e| e.into_inner());
        make_room(&mut tokens, MAX_SIGN_IN_TOKENS);
        tokens.insert(
            hash(&token),
            Entry {
                value: principal,
                expires: Instant::now() + SIGN_IN_TTL,
            },
        );
        token
    }

    /// Uses up a sign-in token: the principal it was minted for, once.
    pub fn redeem_sign_in(&self, token: &str) -> Option<Principal> {
        let entry = self
            .sign_in
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&hash(token))?;
        (entry.expires > Instant::now()).then_some(entry.value)
    }
}

impl Session {
    /// Whether a form's `csrf` field is this session's token.
    pub fn check_csrf(&self, sent: Option<&str>) -> bool {
        sent.is_some_and(|sent| same(sent, &self.csrf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> Principal {
        Principal {
            identity: name.into(),
            admin: false,
            by_token: true,
            user_id: Some(format!("{name}-id")),
        }
    }

    fn alice() -> Principal {
        user("alice")
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_lasts_its_lifetime_and_ends_at_sign_out() {
        let sessions = Sessions::default();
        let (cookie, session) = sessions.open(alice()).unwrap();
        assert_eq!(sessions.get(&cookie), Some(session.clone()));
        assert!(
            sessions.get(&session.csrf).is_none(),
            "a CSRF token is no cookie"
        );
        tokio::time::advance(SESSION_TTL - Duration::from_secs(1)).await;
        assert!(sessions.get(&cookie).is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(sessions.get(&cookie).is_none(), "expired");

        let (cookie, _) = sessions.open(alice()).unwrap();
        sessions.close(&cookie);
        assert!(sessions.get(&cookie).is_none(), "signed out");
    }

    #[tokio::test(start_paused = true)]
    async fn a_user_has_a_bounded_number_of_sessions_the_oldest_going_first() {
        let sessions = Sessions::default();
        let (bobs, _) = sessions.open(user("bob")).unwrap();
        let (first, _) = sessions.open(alice()).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let later: Vec<String> = (1..MAX_SESSIONS_PER_USER)
            .map(|_| sessions.open(alice()).unwrap().0)
            .collect();
        assert!(sessions.get(&first).is_some());
        assert_eq!(sessions.count(), MAX_SESSIONS_PER_USER + 1);
        let (newest, _) = sessions.open(alice()).unwrap();
        assert_eq!(sessions.count(), MAX_SESSIONS_PER_USER + 1);
        assert!(sessions.get(&first).is_none(), "alice's oldest made room");
        assert!(sessions.get(&newest).is_some());
        assert!(sessions.get(&later[0]).is_some());
        assert!(
            sessions.get(&bobs).is_some(),
            "bob's session is not alice's to end"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_console_refuses_new_sessions_rather_than_end_others() {
        let sessions = Sessions::default();
        let cookies: Vec<String> = (0..MAX_SESSIONS)
            .map(|i| sessions.open(user(&format!("u{i}"))).unwrap().0)
            .collect();
        assert_eq!(sessions.open(alice()).unwrap_err(), Refused::Full);
        assert!(cookies.iter().all(|c| sessions.get(c).is_some()));
        // Expired sessions make room.
        tokio::time::advance(SESSION_TTL).await;
        assert!(sessions.open(alice()).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn failed_sign_ins_are_limited_per_source_and_window() {
        let sessions = Sessions::default();
        for _ in 0..MAX_FAILED_SIGN_INS {
            assert!(!sessions.failing("tcp:127.0.0.9"));
            sessions.count_failure("tcp:127.0.0.9");
        }
        assert!(sessions.failing("tcp:127.0.0.9"));
        assert!(
            !sessions.failing("tcp:127.0.0.2"),
            "another address signs in"
        );
        tokio::time::advance(SIGN_IN_WINDOW).await;
        assert!(!sessions.failing("tcp:127.0.0.9"), "the window moved on");
    }

    #[tokio::test(start_paused = true)]
    async fn sign_ins_are_limited_per_user_and_window() {
        let sessions = Sessions::default();
        for _ in 0..MAX_SIGN_INS {
            sessions.open(alice()).unwrap();
        }
        assert_eq!(sessions.open(alice()).unwrap_err(), Refused::TooOften);
        assert!(sessions.open(user("bob")).is_ok(), "bob is not alice");
        tokio::time::advance(SIGN_IN_WINDOW).await;
        assert!(sessions.open(alice()).is_ok());
    }

    #[test]
    fn the_csrf_token_must_match_exactly() {
        let sessions = Sessions::default();
        let (_, session) = sessions.open(alice()).unwrap();
        let table = [
            (None, false),
            (Some(""), false),
            (Some("x"), false),
            (Some(&session.csrf[1..]), false),
            (Some(session.csrf.as_str()), true),
        ];
        for (sent, ok) in table {
            assert_eq!(session.check_csrf(sent), ok, "{sent:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_sign_in_token_is_good_once_and_briefly() {
        let sessions = Sessions::default();
        let admin = Principal {
            identity: "unix:root".into(),
            admin: true,
            by_token: false,
            user_id: None,
        };
        let token = sessions.mint_sign_in(admin.clone());
        assert_eq!(sessions.redeem_sign_in(&token), Some(admin.clone()));
        assert_eq!(sessions.redeem_sign_in(&token), None, "used up");
        let late = sessions.mint_sign_in(admin);
        tokio::time::advance(SIGN_IN_TTL + Duration::from_secs(1)).await;
        assert_eq!(sessions.redeem_sign_in(&late), None, "expired");
        assert_eq!(sessions.redeem_sign_in("made-up"), None);
    }
}
