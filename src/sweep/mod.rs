//! Sweeps: a TOML config ([`config`], whose keys are the [`options`] `kvbench run` takes as flags)
//! expands into a plan of work units with stable ids ([`plan`]) before anything runs; [`execute`] runs
//! units on a model, [`shard`] splits a plan across processes and [`slurm`] writes a job array for it.
//! [`study`] ties them together from a config to a results directory (what `run`, `sweep` and
//! `fidelity` call), with the problems [`problems`] loads.

pub mod config;
pub mod execute;
pub mod options;
pub mod plan;
pub mod problems;
pub mod shard;
pub mod slurm;
pub mod study;
