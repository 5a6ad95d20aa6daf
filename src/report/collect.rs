//! Reading result directories for a report: every directory's records (and shard files) merged and
//! deduplicated by unit id, each directory's planned units without a record listed as missing, and
//! directories of one model and dataset generated with different settings refused together.

use super::{activations_of, kv_type_of, short_dataset};
use crate::error::Result;
use crate::results::dir::{read_manifest, read_samples, Manifest, PlannedUnit};
use crate::results::sample::SampleRecord;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Everything read from the result directories.
pub struct Collection {
    pub records: Vec<SampleRecord>,
    /// Records dropped because another had the same unit id and numerics (KV cache and
    /// activations' types: the model's own type is not part of a unit's id, so two directories that
    /// differ only there plan the same ids, and their records are not duplicates).
    pub duplicates: usize,
    /// Planned units without a record, with the directory that planned them.
    pub missing: Vec<(PathBuf, PlannedUnit)>,
    pub manifests: Vec<(PathBuf, Manifest)>,
    /// Samples files with a half-written last line (a process is writing, or was killed).
    pub partial_lines: Vec<PathBuf>,
    /// Trace files found under `DIR/traces/`.
    pub traces: Vec<PathBuf>,
    /// Records left out because their unit id is not planned in their directory's `sweep.json`
    /// (another configuration's or a hand-edited file's), per directory.
    pub unplanned: Vec<(PathBuf, usize)>,
    /// Directories whose `config.toml` is missing or does not parse as this kvbench's config (an
    /// older version's, or a damaged file), with the reason: their decoding settings could not be
    /// compared with the other directories' (`check_same_decoding`).
    pub unchecked: Vec<(PathBuf, String)>,
}

/// Reads and merges result directories.
pub fn collect(dirs: &[PathBuf]) -> Result<Collection> {
    let mut c = Collection {
        records: Vec::new(),
        duplicates: 0,
        missing: Vec::new(),
        manifests: Vec::new(),
        partial_lines: Vec::new(),
        traces: Vec::new(),
        unplanned: Vec::new(),
        unchecked: Vec::new(),
    };
    let mut seen = HashSet::new();
    // The units done per family of directories (one study's, [`family`]).
    let mut done_in: HashMap<String, HashSet<String>> = HashMap::new();
    for dir in dirs {
        if !dir.is_dir() {
            return Err(crate::Error::Input(format!(
                "{}: not a results directory",
                dir.display()
            )));
        }
        let samples = read_samples(dir)?;
        c.partial_lines.extend(samples.partial_lines);
        let manifest = if dir.join("sweep.json").exists() {
            Some(read_manifest(dir)?)
        } else {
            None
        };
        let planned: Option<HashSet<&str>> = manifest
            .as_ref()
            .map(|m| m.units.iter().map(|u| u.id.as_str()).collect());
        let mut unplanned = 0;
        for r in samples.records {
            if planned
                .as_ref()
                .is_some_and(|p| !r.unit.is_empty() && !p.contains(r.unit.as_str()))
            {
                unplanned += 1;
                continue;
            }
            let unit = if r.unit.is_empty() {
                format!("{}#{}#{}", r.policy, r.problem_id, r.sample)
            } else {
                r.unit.clone()
            };
            if let Some(m) = &manifest {
                done_in
                    .entry(family(m).to_string())
                    .or_default()
                    .insert(r.unit.clone());
            }
            if seen.insert((unit, kv_type_of(&r), activations_of(&r))) {
                c.records.push(r);
            } else {
                c.duplicates += 1;
            }
        }
        if unplanned > 0 {
            c.unplanned.push((dir.clone(), unplanned));
        }
        if let Some(m) = manifest {
            c.manifests.push((dir.clone(), m));
        }
        if let Ok(entries) = std::fs::read_dir(dir.join("traces")) {
            let mut t: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                .collect();
            t.sort();
            c.traces.extend(t);
        }
    }
    c.unchecked = check_same_decoding(&c.manifests)?;
    // A planned unit is missing when no directory of its study has it (shards of one study may
    // write to several directories); another study's record of the same id (the same unit in
    // another cache or activations' type) does not count.
    let mut planned = HashSet::new();
    for (dir, m) in &c.manifests {
        let done = done_in.get(family(m));
        for u in &m.units {
            let is_done = done.is_some_and(|d| d.contains(&u.id));
            if !is_done && planned.insert((family(m).to_string(), u.id.clone())) {
                c.missing.push((dir.clone(), u.clone()));
            }
        }
    }
    Ok(c)
}

/// The directories of one study share this: the hash of their config without the grid (directories
/// of kvbench 0.4 and earlier, which record none, their config hash).
fn family(m: &Manifest) -> &str {
    m.base_hash.as_deref().unwrap_or(&m.config_hash)
}

/// The settings that decide how a directory's outputs were generated, besides the model, the data
/// and the policy: the weights, template, prompt, sampling (and its seed when it samples), the length
/// limit and whether end-of-sequence ends an output, the budget rule and the device's kind (none of
/// them is in a unit's id, so directories that differ only there plan the same ids). Rows pool records by (model, dataset, policy) and pair them with full's,
/// so directories that differ here cannot be reported together. Problem selection, sample counts and
/// batch sizes may differ: pairing uses the problems both rows have.
/// An error when the directory's config does not parse (an older kvbench's, or a damaged file): it
/// is then not checked, and the report says so.
fn decoding_of(dir: &Path) -> Result<serde_json::Value> {
    let cfg = crate::sweep::config::SweepConfig::load(&dir.join("config.toml"))?;
    let o = &cfg.options;
    let (temperature, top_p) = o.sampling();
    Ok(serde_json::json!({
        "weights": cfg.model.weights(),
        "chat_template": cfg.model.chat_template,
        "prompt": o.prompt(),
        "temperature": temperature,
        "top_p": top_p,
        "seed": (temperature > 0.0).then(|| o.seed()),
        "max_new_tokens": o.max_new_tokens,
        "ignore_eos": o.ignore_eos.unwrap_or(false),
        "budget_rule": cfg.budget_rule(),
        "device": cfg.model.device().kind(),
    }))
}

/// Refuses directories of one model and dataset generated with different settings ([`decoding_of`]),
/// naming both directories and the settings that differ. Returns the directories it could not
/// check, with the reason.
fn check_same_decoding(manifests: &[(PathBuf, Manifest)]) -> Result<Vec<(PathBuf, String)>> {
    let mut first: HashMap<(String, String), (PathBuf, serde_json::Value)> = HashMap::new();
    let mut unchecked = Vec::new();
    for (dir, m) in manifests {
        let d = match decoding_of(dir) {
            Ok(d) => d,
            Err(e) => {
                unchecked.push((dir.clone(), e.to_string()));
                continue;
            }
        };
        let key = (m.model_id.clone(), short_dataset(&m.dataset).into_owned());
        match first.get(&key) {
            None => {
                first.insert(key, (dir.clone(), d));
            }
            Some((other, od)) if *od != d => {
                let differ: Vec<String> = d
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, v)| od.get(k.as_str()) != Some(v))
                    .map(|(k, v)| {
                        format!(
                            "{k} {} there, {v} here",
                            od.get(k.as_str()).unwrap_or(&serde_json::Value::Null)
                        )
                    })
                    .collect();
                return Err(crate::Error::Input(format!(
                    "{} and {} ran {} on {} with different settings ({}): their rows would pool and pair outputs \
                     that are not comparable. Report them separately",
                    other.display(),
                    dir.display(),
                    m.model,
                    short_dataset(&m.dataset),
                    differ.join("; ")
                )));
            }
            Some(_) => {}
        }
    }
    Ok(unchecked)
}

/// The command that runs only the missing units of `dir` (a rerun resumes).
pub fn resume_command(dir: &Path) -> String {
    format!(
        "kvbench sweep {} --out {}",
        dir.join("config.toml").display(),
        dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::record;

    #[test]
    fn records_of_units_not_planned_are_left_out_and_counted() {
        let d = std::env::temp_dir().join(format!("kvbench-unplanned-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let planned = record("full", "a", true, 10, true);
        let stray = record("full", "b", true, 10, true);
        crate::results::sample::write_records(&d.join("samples.jsonl"), &[planned.clone(), stray])
            .unwrap();
        let manifest = Manifest {
            units: vec![PlannedUnit {
                id: planned.unit.clone(),
                policy: "full".into(),
                policy_name: "full".into(),
                budget: None,
                problem_id: "a".into(),
                sample: 0,
            }],
            ..crate::results::dir::tests::manifest("h")
        };
        std::fs::write(
            d.join("sweep.json"),
            serde_json::to_string(&manifest).unwrap(),
        )
        .unwrap();
        let c = collect(std::slice::from_ref(&d)).unwrap();
        assert_eq!(c.records.len(), 1);
        assert_eq!(c.unplanned, vec![(d.clone(), 1)]);
        assert!(c.missing.is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
