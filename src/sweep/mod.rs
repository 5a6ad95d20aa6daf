//! Sweeps: a TOML config ([`config`]) expands into a plan of work units with stable ids ([`plan`])
//! before anything runs.

pub mod config;
pub mod plan;
