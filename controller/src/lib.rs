//! berth: the daemon and its kubectl-like client.

pub mod activity_log;
pub mod admission;
pub mod agent;
pub mod api;
pub mod auth;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod dispose;
pub mod file_roots;
pub mod gitops;
pub mod inspect;
pub mod layout;
pub mod lxd;
pub mod manifests;
pub mod mcp;
pub mod metrics;
pub mod network;
pub mod preview;
pub mod reconcile;
pub mod runtime;
pub mod runtime_handle;
pub mod scheduler;
pub mod secrets;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tools;
pub mod trash;
pub mod workspace;

#[cfg(test)]
mod invariants_tests;
