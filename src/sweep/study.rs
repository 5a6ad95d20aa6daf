//! A study from config to results directory, what `run`, `sweep` and `fidelity` share. Parse, plan,
//! execute: a config (from a file, or built from `run`'s flags) is planned ([`plan`]: problems loaded,
//! the model file identified, units given ids) before anything runs, then executed into a results
//! directory ([`execute_plan`]): resumable, shardable, one synced line per unit. The command line only
//! parses flags into a [`SweepConfig`] and [`ExecFlags`].

use super::problems::{load_problems, ProblemSet};
use crate::error::{Error, Result};
use crate::loading::resolve::{resolve, ModelFiles};
use crate::loading::verify::sha256_file;
use crate::model::Model;
use crate::results::dir::{Manifest, PlannedUnit, ResultsDir};
use crate::results::sample::SampleRecord;
use crate::results::trace::TraceWriter;
use crate::sweep::config::SweepConfig;
use crate::sweep::execute::{execute, ExecOptions, Failure};
use crate::sweep::plan::{content_id, Decoding, Plan, WorkUnit};
use crate::sweep::shard::Shard;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// A config with its plan and the identities of its inputs.
pub struct Planned {
    pub cfg: SweepConfig,
    pub set: ProblemSet,
    pub files: ModelFiles,
    pub model_id: String,
    pub dataset_id: String,
    /// The config hash a results directory records.
    pub hash: String,
    /// The hash of the config without its grid: a directory of the same base may be extended.
    pub base_hash: String,
    pub plan: Plan,
}

/// Checks the config, loads the problems, identifies the model file and expands the units.
pub fn plan(mut cfg: SweepConfig) -> Result<Planned> {
    // A data path is stored absolute so that the results directory's config names the same file.
    if let Some(d) = &cfg.options.data {
        cfg.options.data = Some(std::path::absolute(d).unwrap_or_else(|_| d.clone()));
    }
    let specs = cfg.policy_specs();
    let set = load_problems(&cfg.options)?;
    let files = resolve(cfg.model.model())?;
    let model_id = match &files {
        ModelFiles::Gguf(p) => sha256_file(p)?,
        ModelFiles::HfDir(p) => content_id(&serde_json::json!({ "dir": p.display().to_string() })),
        ModelFiles::Random(r) => r.id(),
    };
    // The data's identity is its content, wherever the file lies.
    let problems = serde_json::to_value(&set.problems)
        .map_err(|e| Error::Input(format!("{}: {e}", set.source)))?;
    let dataset_id = content_id(&problems);
    let (temperature, top_p) = cfg.options.sampling();
    let decoding = Decoding {
        temperature,
        top_p,
        max_new_tokens: set.max_new_tokens,
        seed: cfg.options.seed(),
        prompt: cfg.options.prompt(),
        weights: cfg.model.weights(),
    };
    let plan = Plan::new(
        specs,
        set.problems.clone(),
        cfg.options.samples(),
        decoding,
        &model_id,
        &dataset_id,
    )?;
    let hash = cfg.hash(&model_id, &dataset_id);
    let base_hash = cfg.base_hash(&model_id, &dataset_id);
    Ok(Planned {
        cfg,
        set,
        files,
        model_id,
        dataset_id,
        hash,
        base_hash,
        plan,
    })
}

impl Planned {
    /// The manifest of a results directory holding this plan.
    pub fn manifest(&self) -> Manifest {
        Self::manifest_of(&self.cfg, &self.plan, self.hash.clone(), self)
    }

    fn manifest_of(cfg: &SweepConfig, plan: &Plan, hash: String, ids: &Planned) -> Manifest {
        Manifest {
            name: cfg.name.clone(),
            config_hash: hash,
            base_hash: Some(ids.base_hash.clone()),
            kvbench: env!("CARGO_PKG_VERSION").into(),
            model: cfg.model.model().into(),
            model_id: ids.model_id.clone(),
            dataset: ids.set.source.clone(),
            dataset_id: ids.dataset_id.clone(),
            units: plan
                .units
                .iter()
                .map(|u| {
                    let spec = &plan.specs[u.policy];
                    PlannedUnit {
                        id: u.id.clone(),
                        policy: spec.describe(),
                        policy_name: spec.name().into(),
                        budget: (spec.name() != "full").then(|| spec.budget().value()),
                        problem_id: plan.problems[u.problem].id.clone(),
                        sample: u.sample,
                    }
                })
                .collect(),
        }
    }

    /// The identity of a results directory that holds `old` (another configuration) extended by
    /// this one, or `None` when they differ in more than their grid (policies and budgets): the
    /// union config and its plan, with any unit of `old` the union does not plan kept.
    fn extension_of(&self, dir: &Path, old: &Manifest) -> Result<Option<(Manifest, String)>> {
        if old.kvbench != env!("CARGO_PKG_VERSION")
            || old.model_id != self.model_id
            || old.dataset_id != self.dataset_id
            || old.base_hash.as_ref().is_some_and(|b| *b != self.base_hash)
        {
            return Ok(None);
        }
        let path = dir.join("config.toml");
        let stored = SweepConfig::load(&path)?;
        // A directory of kvbench 0.4.0 and earlier records no base: its config must be the one it
        // was bound to, and have this config's base.
        if old.base_hash.is_none()
            && (stored.hash(&self.model_id, &self.dataset_id) != old.config_hash
                || stored.base_hash(&self.model_id, &self.dataset_id) != self.base_hash)
        {
            return Ok(None);
        }
        // The options are this run's (they share the base); only the stored grid is taken.
        let merged = stored.extended_by(&self.cfg)?;
        let plan = Plan::new(
            merged.policy_specs(),
            self.plan.problems.clone(),
            self.plan.samples,
            self.plan.decoding.clone(),
            &self.model_id,
            &self.dataset_id,
        )?;
        let hash = merged.hash(&self.model_id, &self.dataset_id);
        let mut manifest = Self::manifest_of(&merged, &plan, hash, self);
        let planned: HashSet<String> = manifest.units.iter().map(|u| u.id.clone()).collect();
        manifest.units.extend(
            old.units
                .iter()
                .filter(|u| !planned.contains(&u.id))
                .cloned(),
        );
        Ok(Some((manifest, config_toml_of(&merged))))
    }

    /// The config as the results directory keeps it: overrides applied, without the output
    /// directory (the directory is where it lies).
    pub fn config_toml(&self) -> String {
        config_toml_of(&self.cfg)
    }
}

fn config_toml_of(cfg: &SweepConfig) -> String {
    let mut c = cfg.clone();
    c.options.out = None;
    format!(
        "# Resolved by kvbench {} (command-line overrides applied). Resume with:\n#   {}\n{}",
        env!("CARGO_PKG_VERSION"),
        "kvbench sweep THIS_DIR/config.toml --out THIS_DIR",
        c.to_toml()
    )
}

impl Planned {
    /// The plan as the user reads it before it runs: inputs, decoding, one row per (policy, budget).
    pub fn describe(&self, out: &Path) -> String {
        use std::fmt::Write;
        let p = &self.plan;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "sweep '{}': model {} ({}), data {}, {} problems × {} samples, output {}",
            self.cfg.name,
            crate::error::cell(self.cfg.model.model()),
            crate::error::cell(&self.files.describe()),
            crate::error::cell(&self.set.source),
            p.problems.len(),
            p.samples,
            crate::error::cell(&out.display().to_string())
        );
        let _ = writeln!(
            s,
            "decoding: temperature {}, top-p {}, max {} new tokens, seed {}, prompt {}, weights {}, KV cache {}; config hash {}",
            p.decoding.temperature,
            p.decoding.top_p,
            p.decoding.max_new_tokens,
            p.decoding.seed,
            crate::flags::spelled(&p.decoding.prompt),
            crate::flags::spelled(&p.decoding.weights),
            self.cfg.model.kv_type(),
            self.hash
        );
        let _ = writeln!(s, "\n| policy | units | first unit id |");
        let _ = writeln!(s, "|---|---:|---|");
        // One pass over the units (a plan may hold 10^5 of them and thousands of policies).
        let mut per_policy: Vec<(usize, Option<&str>)> = vec![(0, None); p.specs.len()];
        for u in &p.units {
            let e = &mut per_policy[u.policy];
            e.0 += 1;
            e.1.get_or_insert(u.id.as_str());
        }
        for (spec, (count, first)) in p.specs.iter().zip(per_policy) {
            let _ = writeln!(
                s,
                "| {} | {count} | {} |",
                crate::error::cell(&spec.describe_with_kv()),
                first.unwrap_or("-")
            );
        }
        let _ = write!(
            s,
            "\n{} work units, at most {} generated tokens",
            p.units.len(),
            p.max_tokens()
        );
        s
    }
}

/// Loads the model a study names, from the files its plan resolved and identified (a name is
/// resolved once), on the device it asks for.
pub fn load_model(p: &Planned, tokenizer: Option<&Path>) -> Result<Model> {
    let m = &p.cfg.model;
    Model::load_files(
        p.files.clone(),
        &m.load_options(tokenizer.map(Path::to_path_buf))?,
    )
}

/// Which units of a plan a process runs: all, or (so that a cluster can run the full-cache baseline
/// before the policies whose ratio budgets need it) only `full`'s, or only the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Phase {
    #[default]
    All,
    Full,
    Policies,
}

impl Phase {
    fn contains(self, plan: &Plan, u: &WorkUnit) -> bool {
        let full = plan.specs[u.policy].name() == "full";
        match self {
            Phase::All => true,
            Phase::Full => full,
            Phase::Policies => !full,
        }
    }
}

/// How to execute a plan.
pub struct ExecFlags<'a> {
    pub out: PathBuf,
    pub shard: Option<Shard>,
    pub phase: Phase,
    pub lenient: bool,
    /// A tokenizer.json to use instead of the model's.
    pub tokenizer: Option<&'a Path>,
    /// `run --trace FILE`: every unit of this (policy, budget) index, into one file.
    pub trace_file: Option<(PathBuf, usize)>,
    pub show_output: bool,
}

/// What an execution did.
pub struct Executed {
    pub failures: Vec<Failure>,
    pub ran: usize,
    /// Units of this process's share finished before it started.
    pub already: usize,
    /// Every record in the directory once this process finished.
    pub records: Vec<SampleRecord>,
    pub wall_secs: f64,
}

/// The error of a results directory that cannot be made, naming the option that gave it.
fn out_error(out: &Path, why: &dyn std::fmt::Display) -> Error {
    Error::Input(format!(
        "results directory {} (--out, or `out` in a sweep config): {why}",
        out.display()
    ))
}

/// Refuses a results directory that cannot be made, before a model is loaded or anything written
/// ([`crate::results::dir::check_creatable`]).
pub fn check_out(out: &Path) -> Result<()> {
    crate::results::dir::check_creatable(out).map_err(|why| out_error(out, &why))
}

/// Opens (creating it if needed) and locks the results directory `out`; a directory that cannot be
/// made is reported as the option's error.
pub fn open_out(out: &Path, shard: Option<Shard>) -> Result<ResultsDir> {
    check_out(out)?;
    ResultsDir::open(out, shard).map_err(|e| match e {
        Error::Io { path, source } if path == out => out_error(out, &source),
        other => other,
    })
}

/// Runs the units of `p` that this shard owns and that no process has finished yet.
pub fn execute_plan(p: &Planned, flags: &ExecFlags<'_>) -> Result<Executed> {
    let started = std::time::Instant::now();
    // Every input is validated before anything is written: the model and its tokenizer load, every
    // prompt fits the context, and ratio budgets find the full run they are resolved from.
    check_out(&flags.out)?;
    let existing = if flags.out.is_dir() {
        crate::results::dir::read_samples(&flags.out)?.records
    } else {
        Vec::new()
    };
    let full_tokens = full_tokens(p, &existing);
    let finished_before: HashSet<&str> = existing.iter().map(|r| r.unit.as_str()).collect();
    if let Some((path, policy)) = &flags.trace_file {
        check_traced_before(p, &flags.out, path, *policy, &finished_before)?;
    }
    let load_start = std::time::Instant::now();
    let model = load_model(p, flags.tokenizer)?;
    let load_secs = load_start.elapsed().as_secs_f64();
    // Every cache type of the grid fits the model's heads and the device (the model's own was
    // checked at load).
    for kv in p.plan.specs.iter().filter_map(|s| s.kv_type()) {
        kv.check(
            model.transformer.config.head_dim,
            model.transformer.device(),
        )
        .map_err(|e| crate::Error::Input(format!("kv_types: {e}")))?;
    }
    let (longest_prompt, mean_prompt) = crate::sweep::execute::check_context(&model, &p.plan)?;
    let per_set = p.plan.units.len() / p.plan.specs.len().max(1);
    model.check_batch_memory(
        p.cfg.options.batch_size().min(per_set.max(1)),
        longest_prompt + p.plan.decoding.max_new_tokens,
        "batch_size",
    )?;
    let pending = p
        .plan
        .units
        .iter()
        .filter(|u| flags.shard.is_none_or(|s| s.contains(&u.id)))
        .filter(|u| flags.phase.contains(&p.plan, u))
        .filter(|u| !finished_before.contains(u.id.as_str()));
    // Ratio budgets wait for the full run: its finished units now, and the ones this process runs
    // first. Without them nothing runs, and the error says how to get them.
    let pending: Vec<_> = pending.collect();
    if pending
        .iter()
        .any(|u| p.plan.specs[u.policy].needs_full_mean())
    {
        let mut will_have = full_tokens.clone();
        let mut waiting_types = Vec::new();
        for u in &pending {
            let spec = &p.plan.specs[u.policy];
            if spec.name() == "full" {
                will_have.insert(u.id.clone(), 0);
            }
            if spec.needs_full_mean() && !waiting_types.contains(&spec.kv_type()) {
                waiting_types.push(spec.kv_type());
            }
        }
        // Each cache type's ratio budgets resolve from the full run of that type.
        for kv in waiting_types {
            p.plan
                .full_mean_tokens(&will_have, kv)
                .map_err(|e| Error::Input(format!("{}: {e}", flags.out.display())))?;
        }
    }
    let dir = open_out(&flags.out, flags.shard)?;
    dir.bind_or_extend(&p.manifest(), &p.config_toml(), |old| {
        let extended = p.extension_of(&flags.out, old)?;
        if let Some((m, _)) = &extended {
            crate::say!(
                "{}: extends the sweep there (config hash {} there, {} now): {} units planned in all, config.toml updated",
                flags.out.display(),
                old.config_hash,
                p.hash,
                m.units.len()
            );
        }
        Ok(extended)
    })?;
    let finished = dir.finished()?;
    let mine: Vec<_> = p
        .plan
        .units
        .iter()
        .filter(|u| flags.shard.is_none_or(|s| s.contains(&u.id)))
        .filter(|u| flags.phase.contains(&p.plan, u))
        .collect();
    let todo: Vec<_> = mine
        .iter()
        .copied()
        .filter(|u| !finished.contains(&u.id))
        .collect();
    let already = mine.len() - todo.len();
    if already > 0 {
        crate::say!(
            "{}: {already} of {} units already finished, {} to run",
            flags.out.display(),
            mine.len(),
            todo.len()
        );
    }
    let mut failures = Vec::new();
    if !todo.is_empty() {
        failures = run_units(
            p,
            &dir,
            &todo,
            flags,
            full_tokens,
            &model,
            (load_secs, mean_prompt),
        )?;
    }
    if let Some((path, policy)) = &flags.trace_file {
        let units = p.plan.units_of(*policy).map(|u| u.id.as_str());
        let (traced, bytes) = gather_traces(&dir.path, units, path)?;
        match bytes {
            0 => println!(
                "trace: no compression event in {traced} units; {} is empty",
                path.display()
            ),
            _ => println!(
                "trace: the compression events of {traced} units ({:.1} MiB) written to {}",
                bytes as f64 / (1 << 20) as f64,
                path.display()
            ),
        }
    }
    let records = crate::results::dir::read_samples(&flags.out)?.records;
    Ok(Executed {
        failures,
        ran: todo.len(),
        already,
        records,
        wall_secs: started.elapsed().as_secs_f64(),
    })
}

fn run_units(
    p: &Planned,
    dir: &ResultsDir,
    todo: &[&WorkUnit],
    flags: &ExecFlags<'_>,
    full_tokens: std::collections::HashMap<String, usize>,
    model: &Model,
    (load_secs, mean_prompt_tokens): (f64, f64),
) -> Result<Vec<Failure>> {
    let o = &p.cfg.options;
    let template_hash = o.prompt().template_hash(model.template);
    let device = crate::device::describe(p.cfg.model.device(), model.transformer.device());
    let stage_config = dir.keep_stage_config(&p.hash, &p.config_toml())?;
    dir.record_provenance(&serde_json::json!({
        "started_unix": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "kvbench": env!("CARGO_PKG_VERSION"),
        "git_commit": env!("KVBENCH_GIT_COMMIT"),
        "command": std::env::args().collect::<Vec<_>>(),
        "config_hash": p.hash,
        "stage_config": stage_config,
        "model": p.cfg.model.model(),
        "model_file": p.files.describe(),
        "model_sha256": p.model_id,
        "dataset": p.set.source,
        "dataset_id": p.dataset_id,
        "chat_template": format!("{:?}", model.template),
        "prompt": o.prompt(),
        "template_hash": template_hash,
        "grader": crate::eval::grade::GRADER_VERSION,
        "machine": crate::metrics::machine(),
        "device": &device,
        "activations": model.transformer.activation_dtype().as_str(),
        "threads": rayon::current_num_threads(),
        "shard": flags.shard.map(|s| s.to_string()),
        "units": todo.len(),
    }))?;
    let (mut appender, note) = dir.samples_appender()?;
    if let Some(note) = note {
        crate::say!("note: {note}");
    }
    crate::say!(
        "kvbench: {} units on {} ({:.0} MiB of weights, loaded in {:.1} s; {} template, prompt {}, hash {}; activations {}{}), writing {}",
        todo.len(),
        model.name,
        model.transformer.weight_bytes() as f64 / (1 << 20) as f64,
        load_secs,
        crate::flags::spelled(&model.template),
        crate::flags::spelled(&o.prompt()),
        template_hash,
        model.transformer.activation_dtype().as_str(),
        match (p.cfg.model.activations(), model.transformer.activation_dtype()) {
            (crate::model::Activations::Weights, candle_core::DType::F32) =>
                " (activations = weights: the weights are not all 16-bit floats)",
            _ => "",
        },
        appender.path().display()
    );
    // Traced: the first unit of every compressing (policy, budget), into DIR/traces/, and with
    // `run --trace FILE` every unit of that policy.
    let mut traced: HashSet<String> = HashSet::new();
    for (i, spec) in p.plan.specs.iter().enumerate() {
        if spec.name() != "full" {
            if let Some(u) = p.plan.units_of(i).next() {
                traced.insert(u.id.clone());
            }
        }
    }
    // The first units' traces are the report's heat maps (DIR/traces/); the other units a
    // `--trace FILE` policy's are kept under DIR/traces/more/, which the report does not draw.
    let heat_maps = traced.clone();
    if let Some((_, policy)) = &flags.trace_file {
        traced.extend(p.plan.units_of(*policy).map(|u| u.id.clone()));
    }
    for id in traced.iter().filter(|id| todo.iter().any(|u| &u.id == *id)) {
        let t = unit_trace(&dir.path, id, heat_maps.contains(id));
        let parent = t.parent().unwrap_or(&dir.path);
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let max_new = p.plan.decoding.max_new_tokens as u64;
    let bar = ProgressBar::new(todo.len() as u64 * max_new);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} tokens (upper bound), eta {eta} {msg}",
        )
        .expect("static template"),
    );
    let opts = ExecOptions {
        batch_size: o.batch_size(),
        lenient: flags.lenient,
        trace: traced.clone(),
        dataset: p.set.source.clone(),
        fidelity: o.fidelity.unwrap_or(false),
        full_tokens,
        ignore_eos: o.ignore_eos.unwrap_or(false),
        mean_prompt_tokens,
        engine: crate::results::sample::Engine::current(
            &device.to_string(),
            format!("{:?}", p.cfg.model.weights()),
            o.batch_size(),
            p.cfg.model.kv_type(),
            model.transformer.activation_dtype(),
        ),
    };
    let mut done = 0usize;
    let failures = execute(model, &p.plan, todo, &opts, &mut || bar.inc(1), &mut |r| {
        let label = format!("{}#{}", r.record.problem_id, r.unit.sample);
        // Traces first: a unit is recorded as finished only once its trace is on disk, so a failed
        // trace write leaves the unit to the next run instead of losing its heat map.
        if let Some(events) = r.trace.as_ref().filter(|_| traced.contains(&r.unit.id)) {
            let heat_map = heat_maps.contains(&r.unit.id);
            let mut w = TraceWriter::create(&unit_trace(&dir.path, &r.unit.id, heat_map))?;
            w.write(&label, events)?;
            w.finish()?;
        }
        appender.append(&r.record)?;
        done += 1;
        bar.inc(max_new.saturating_sub(r.record.tokens as u64));
        bar.set_message(format!("{done}/{} units", todo.len()));
        if flags.show_output {
            bar.suspend(|| {
                println!(
                    "--- {} ({}) ---\n{}\n",
                    crate::error::cell(&label),
                    crate::error::cell(&r.record.policy),
                    crate::error::terminal_safe(&r.record.output)
                )
            });
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    for f in &failures {
        crate::say!(
            "error: unit {} failed: {}",
            f.unit,
            crate::error::terminal_safe(&f.error)
        );
    }
    Ok(failures)
}

/// Where a results directory keeps one unit's trace: in `traces/` when the report draws it as a heat
/// map, else in `traces/more/`.
fn unit_trace(dir: &Path, unit: &str, heat_map: bool) -> PathBuf {
    let traces = dir.join("traces");
    let folder = if heat_map {
        traces
    } else {
        traces.join("more")
    };
    folder.join(format!("{unit}.jsonl"))
}

/// A unit's trace in the results directory, wherever it is kept.
fn kept_trace(dir: &Path, unit: &str) -> Option<PathBuf> {
    [true, false]
        .into_iter()
        .map(|heat_map| unit_trace(dir, unit, heat_map))
        .find(|p| p.is_file())
}

/// `run --trace FILE` holds every unit of its policy, the ones an earlier run of the same command
/// finished included: their traces come from the results directory, where every traced unit keeps
/// one. A unit finished there without a trace (by a run without `--trace`) cannot be in the file:
/// refused before anything runs or is written, saying how to get it.
fn check_traced_before(
    p: &Planned,
    out: &Path,
    file: &Path,
    policy: usize,
    finished: &HashSet<&str>,
) -> Result<()> {
    let untraced: Vec<&str> = p
        .plan
        .units_of(policy)
        .map(|u| u.id.as_str())
        .filter(|id| finished.contains(id) && kept_trace(out, id).is_none())
        .collect();
    match untraced.first() {
        None => Ok(()),
        Some(first) => Err(Error::Input(format!(
            "--trace {}: {} unit(s) of {} finished earlier in {} without a trace (unit {first}); \
             trace them in another results directory (--out DIR), or remove that one",
            file.display(),
            untraced.len(),
            crate::error::cell(p.plan.specs[policy].name()),
            out.display(),
        ))),
    }
}

/// Writes `file` (atomically) from the results directory's traces of `units`, in plan order; a
/// unit without one (it failed) is left out. Returns the units written and the file's bytes.
fn gather_traces<'a>(
    dir: &Path,
    units: impl Iterator<Item = &'a str>,
    file: &Path,
) -> Result<(usize, u64)> {
    let mut out = crate::results::AtomicFile::create(file)?;
    let (mut traced, mut bytes) = (0, 0);
    for unit in units {
        let Some(path) = kept_trace(dir, unit) else {
            continue;
        };
        let mut trace = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
        bytes += std::io::copy(&mut trace, &mut out).map_err(|e| Error::io(file, e))?;
        traced += 1;
    }
    out.commit()?;
    Ok((traced, bytes))
}

/// Tokens generated by the plan's finished `full` units (unit id → tokens), from the records.
fn full_tokens(p: &Planned, records: &[SampleRecord]) -> std::collections::HashMap<String, usize> {
    // The units of every full spec (one per cache type of a `kv_types` grid).
    let ids: HashSet<&str> = p
        .plan
        .units
        .iter()
        .filter(|u| p.plan.specs[u.policy].name() == "full")
        .map(|u| u.id.as_str())
        .collect();
    records
        .iter()
        .filter(|r| ids.contains(r.unit.as_str()))
        .map(|r| (r.unit.clone(), r.tokens))
        .collect()
}
