//! The scheduler: one loop of passes (resync, activity, reap, housekeeping) and the decisions
//! they make. Reaping is the only path in berth that can lose work irreversibly, so the decision
//! ([`policy`]) is pure and exhaustively tested, and it only ever sees facts gathered by one
//! inspection ([`inspect`]) that refuses to guess.

pub mod activity;
pub mod inspect;
pub mod policy;
pub mod ports;
