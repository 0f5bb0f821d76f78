//! berth: the daemon and its kubectl-like client.

pub mod cli;
pub mod client;
pub mod daemon;
