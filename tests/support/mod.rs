//! Helpers shared by the end-to-end tests: a real `berth serve` process, real LXD.
#![allow(dead_code)]

pub mod daemon;
pub mod lxd;
pub mod model_fixture;
