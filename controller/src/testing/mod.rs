//! Test support: fakes and fixtures for the crate's unit tests, its integration tests and the
//! benchmarks (feature `testing`). Nothing in production code uses it.

#[cfg(feature = "testing")]
pub mod fake_agent;
pub mod fixtures;
#[cfg(feature = "testing")]
pub mod inspection;
