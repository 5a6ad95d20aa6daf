//! The device flag and random-weight models (issue 39), on the CPU: `--device cuda` where CUDA is
//! missing fails in one line with exit 2 and writes nothing; a random model's records and reports say
//! they carry no accuracy; `--ignore-eos` decodes exactly the limit; a random model exported as a
//! Hugging Face checkpoint runs to the same logits and tokens as the model itself; the shared policy
//! flags refuse a list where one policy is run.

mod common;

use common::{kvbench, ok, NoFetch};
use std::path::{Path, PathBuf};

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvbench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_on_a_build_without_it_fails_in_one_line_and_writes_nothing() {
    let out_dir = temp("cuda-refused");
    let out = kvbench(&[
        "run",
        "--model",
        "random:tiny",
        "--device",
        "cuda",
        "--limit",
        "1",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    // One line, and nothing before it (not the run's header, not the plan).
    let only_the_error = |out: &std::process::Output, start: &str| {
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(
            lines[0].starts_with(&format!("error: {start}")) && lines[0].contains("without CUDA"),
            "{err}"
        );
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    };
    only_the_error(&out, "--device cuda:0:");
    assert!(!out_dir.exists(), "nothing may be written");

    // The same from a sweep config's `device` key, and for the benchmarks.
    let dir = temp("cuda-config");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        "name = \"c\"\nmodel = \"random:tiny\"\ndevice = \"cuda:1\"\nlimit = 1\n[[policy]]\nname = \"full\"\n",
    )
    .unwrap();
    let results = dir.join("results");
    // `kvbench sweep` on that config into `results`, with `extra`.
    let sweep = |extra: &[&str]| {
        let mut args = vec!["sweep", cfg.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.extend(["--out", results.to_str().unwrap()]);
        kvbench(&args)
    };
    // The config's key is named where it came from there, the flag where it overrides the key.
    only_the_error(
        &sweep(&[]),
        &format!("{}: device = \"cuda:1\":", cfg.display()),
    );
    assert!(!results.exists());
    only_the_error(&sweep(&["--device", "cuda:2"]), "--device cuda:2:");
    assert!(!results.exists());
    // A dry run needs no device: a plan may be made on a machine without the GPU.
    assert_eq!(sweep(&["--dry-run"]).status.code(), Some(0));
    // A Slurm script needs no GPU here either, but it runs this binary on the cluster's: refused,
    // with no script and no directory, where this build cannot drive one.
    let out = sweep(&["--emit", "slurm"]);
    only_the_error(&out, &format!("{}: device = \"cuda:1\":", cfg.display()));
    assert!(!results.exists());
    let out = sweep(&["--emit", "slurm", "--device", "cpu"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("--gres"));
    assert!(results.join("config.toml").is_file());
    for cmd in ["perf", "scaling", "forward"] {
        let out = kvbench(&[cmd, "--model", "random:tiny", "--device", "cuda"]);
        only_the_error(&out, "--device cuda:0:");
    }
    // Refused before the model is resolved: a first run would fetch it (1.1 GB for the default
    // model) only to stop at the device.
    let no_fetch = NoFetch::under(&dir);
    let uncached = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("random:tiny", NoFetch::MODEL);
    std::fs::write(&cfg, uncached).unwrap();
    let fresh = dir.join("fresh");
    let model = ["--model", NoFetch::MODEL, "--device", "cuda"];
    for args in [
        [&["run"][..], &model[..]].concat(),
        vec![
            "sweep",
            cfg.to_str().unwrap(),
            "--out",
            fresh.to_str().unwrap(),
        ],
        [&["perf"][..], &model[..]].concat(),
        [&["forward"][..], &model[..]].concat(),
    ] {
        let err = no_fetch.refused(&args);
        assert!(err.contains("without CUDA"), "{args:?}: {err}");
    }
    assert!(!fresh.exists());
    let out = kvbench(&["run", "--device", "gpu0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cuda:N"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kvbench run` on `random:tiny@3`: two problems, at most `tokens` new tokens each, into `out`,
/// then `extra`.
fn run_random(out: &str, tokens: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "run",
        "--model",
        "random:tiny@3",
        "--limit",
        "2",
        "--max-new-tokens",
        tokens,
        "--out",
        out,
    ];
    args.extend_from_slice(extra);
    kvbench(&args)
}

#[test]
fn a_random_model_runs_to_the_length_limit_and_claims_no_accuracy() {
    let out_dir = temp("random-run");
    let stdout = ok(&run_random(
        out_dir.to_str().unwrap(),
        "24",
        &["--ignore-eos", "--policy", "streaming", "--budget", "16"],
    ));
    assert!(
        stdout.contains("accuracy: none: the weights are random"),
        "{stdout}"
    );
    let records = kvbench::results::sample::read_records(&out_dir.join("samples.jsonl")).unwrap();
    assert_eq!(records.len(), 4, "two problems, the policy and full");
    for r in &records {
        assert!(r.random_weights);
        assert_eq!(r.tokens, 24, "--ignore-eos decodes to the limit");
        let e = r.engine.as_ref().expect("records name their engine");
        assert_eq!(e.kvbench, env!("CARGO_PKG_VERSION"));
        assert!(e.device.starts_with("cpu"));
        assert_eq!(e.batch_size, 8);
    }
    // The config this stage ran with is kept verbatim, and the provenance line names it.
    let prov = std::fs::read_to_string(out_dir.join("provenance.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(prov.lines().last().unwrap()).unwrap();
    let kept = out_dir.join(line["stage_config"].as_str().unwrap());
    let text = std::fs::read_to_string(&kept).unwrap();
    assert!(
        text.contains("random:tiny@3") && text.contains("ignore_eos = true"),
        "{text}"
    );
    let report = ok(&kvbench(&["report", out_dir.to_str().unwrap()]));
    assert!(report.contains("n/a (random weights)"), "{report}");
    assert!(report.contains("carry no accuracy"), "{report}");
    // No accuracy figure anywhere: not in the policy row's comparison with full (its output lengths
    // are still compared), not in the JSON or CSV, not drawn.
    let row = report
        .lines()
        .find(|l| l.starts_with("| streaming "))
        .expect("the policy's row");
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(
        &cells[4..8],
        ["n/a (random weights)", "-", "-", "-"],
        "{row}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("report/report.json")).unwrap())
            .unwrap();
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        for key in [
            "pass_at_1",
            "stderr",
            "cons",
            "accuracy_vs_full",
            "delta_pass",
            "delta_pass_lo",
            "delta_pass_hi",
            "only_full",
            "only_policy",
        ] {
            assert!(r[key].is_null(), "{key}: {r}");
        }
        assert_eq!(r["random_weights"], true);
    }
    assert!(rows.iter().any(|r| r["tokens_change_vs_full"].is_number()));
    let csv = std::fs::read_to_string(out_dir.join("report/report.csv")).unwrap();
    let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let at = head.iter().position(|h| *h == "pass_at_1").unwrap();
    for line in csv.lines().skip(1) {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(line.as_bytes());
        let rec = reader.records().next().unwrap().unwrap();
        assert_eq!(&rec[at], "", "{line}");
    }
    for stem in [
        "accuracy_vs_budget",
        "delta_vs_budget",
        "accuracy_vs_memory",
    ] {
        assert!(
            !out_dir.join(format!("report/{stem}.svg")).exists(),
            "{stem} drawn from random weights"
        );
    }
    assert!(out_dir.join("report/throughput_vs_budget.svg").exists());
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// `--activations weights` on `run`: its records say bf16 (the random model's weights' type), a
/// directory of f32 activations refuses to be resumed with them (the config hash sees them), and a
/// report over directories that differ only in activations or in the cache's type (whose units
/// have the same ids) keeps every row: none is taken for another's duplicate, none is missing.
#[test]
fn sixteen_bit_activations_are_their_own_study_and_their_own_rows() {
    let base = temp("activations");
    let dir = |name: &str| base.join(name).to_str().unwrap().to_string();
    let run =
        |out: &str, extra: &[&str]| run_random(out, "8", &[&["--policy", "full"], extra].concat());
    let (f32_dir, bf16_dir, kv_dir) = (dir("f32"), dir("bf16"), dir("kv-f32"));
    ok(&run(&f32_dir, &[]));
    ok(&run(&kv_dir, &["--kv-type", "f32"]));
    let out = run(&bf16_dir, &["--activations", "weights"]);
    ok(&out);
    let header = String::from_utf8_lossy(&out.stderr);
    assert!(header.contains("activations weights"), "{header}");
    for (d, want) in [(&f32_dir, "f32"), (&bf16_dir, "bf16")] {
        let records =
            kvbench::results::sample::read_records(&Path::new(d).join("samples.jsonl")).unwrap();
        assert_eq!(records.len(), 2);
        for r in &records {
            assert_eq!(r.engine.as_ref().unwrap().activations, want, "{d}");
        }
    }
    let refused = run(&f32_dir, &["--activations", "weights"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let report_dir = dir("report");
    let report = ok(&kvbench(&[
        "report",
        &f32_dir,
        &bf16_dir,
        &kv_dir,
        "--out",
        &report_dir,
        "--no-plots",
    ]));
    assert!(!report.contains("duplicate"), "{report}");
    assert!(
        report.contains("every planned unit has a result"),
        "{report}"
    );
    assert!(report.contains("| activations |"), "{report}");
    let full_rows: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("| full |"))
        .collect();
    assert_eq!(full_rows.len(), 3, "{report}");
    assert!(full_rows.iter().any(|l| l.contains("| bf16 |")), "{report}");
    // `+act=` tells the two apart, and the pair is then refused: random weights carry no accuracy
    // to compare (exit 2, nothing written).
    let pair = kvbench(&[
        "report",
        &f32_dir,
        &bf16_dir,
        "--out",
        &report_dir,
        "--no-plots",
        "--pair",
        "full+act=f32,full+act=bf16",
    ]);
    assert_eq!(pair.status.code(), Some(2), "{pair:?}");
    let err = String::from_utf8_lossy(&pair.stderr);
    assert!(
        err.contains("full+act=f32,full+act=bf16") && err.contains("no accuracy to compare"),
        "{err}"
    );
    assert!(!Path::new(&report_dir).join("pairs.md").exists());
    // Two rows match `full`: refused with the selectors that tell them apart, before any table.
    let out = kvbench(&["report", &f32_dir, &bf16_dir, "--pair", "full,full"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("+act=TYPE"));
    let _ = std::fs::remove_dir_all(&base);
}

/// Whether end-of-sequence ends an output is not in a unit's id: directories that differ only there
/// are refused together (their records are not comparable, and used to be taken for duplicates).
#[test]
fn directories_that_differ_in_ignore_eos_are_not_reported_together() {
    let base = temp("ignore-eos");
    let (with, without) = (base.join("with"), base.join("without"));
    ok(&run_random(
        with.to_str().unwrap(),
        "8",
        &["--ignore-eos", "--policy", "full"],
    ));
    ok(&run_random(
        without.to_str().unwrap(),
        "8",
        &["--policy", "full"],
    ));
    let out = kvbench(&[
        "report",
        with.to_str().unwrap(),
        without.to_str().unwrap(),
        "--out",
        base.join("report").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ignore_eos true there, false here"), "{err}");
    assert!(!base.join("report").exists(), "nothing written");
    let _ = std::fs::remove_dir_all(&base);
}

/// `forward` on `model`: 24 seeded prompt tokens, 12 generated, then `extra`.
fn forward_args<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "forward",
        "--model",
        model,
        "--tokens",
        "24",
        "--token-seed",
        "5",
        "--generate",
        "12",
    ];
    args.extend(extra);
    args
}

fn forward(model: &str, extra: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(&kvbench(&forward_args(model, extra)))).unwrap()
}

/// `KVBENCH_PATH` caps the code path for the whole process: the record names the path that ran, and
/// the tokens do not change (every path computes the same bits on a float model).
#[test]
fn the_path_cap_is_named_in_the_record_and_changes_no_token() {
    let run = |path: Option<&str>| -> serde_json::Value {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"));
        let extra = ["--policy", "h2o", "--budget", "8", "--kv-type", "kivi2:16"];
        cmd.args(forward_args("random:tiny", &extra));
        cmd.env_remove("KVBENCH_PATH");
        if let Some(p) = path {
            cmd.env("KVBENCH_PATH", p);
        }
        serde_json::from_str(&ok(&cmd.output().expect("run kvbench"))).unwrap()
    };
    let widest = run(None);
    #[cfg(target_arch = "x86_64")]
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    let avx2 = false;
    let under_avx2 = if avx2 { "AVX2" } else { "portable" };
    for (cap, path) in [("portable", "portable"), ("avx2", under_avx2)] {
        let name = format!("kvbench kernels: {path})");
        let capped = run(Some(cap));
        let machine = capped["machine"].as_str().unwrap();
        assert!(machine.contains(&name), "{cap}: {machine}");
        assert!(!machine.contains("kernels: AVX-512"), "{cap}: {machine}");
        assert_eq!(capped["argmax"], widest["argmax"], "{cap}");
        assert_eq!(capped["generated"], widest["generated"], "{cap}");
    }
}

#[test]
fn an_exported_random_model_runs_as_the_model_itself() {
    let dir = temp("export");
    ok(&kvbench(&[
        "models",
        "--export",
        "random:tiny@9",
        dir.to_str().unwrap(),
    ]));
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    // The weights as readable as the other files (candle's writer made them the owner's alone).
    let mode = |f: &str| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(dir.join(f)).unwrap().permissions().mode()
    };
    assert_eq!(mode("model.safetensors"), mode("config.json"));
    // The same weights through the safetensors loader: the same logits' argmax and greedy tokens.
    let direct = forward("random:tiny@9", &[]);
    let exported = forward(dir.to_str().unwrap(), &[]);
    assert_eq!(direct["prompt"], exported["prompt"]);
    assert_eq!(direct["argmax"], exported["argmax"]);
    assert_eq!(direct["generated"], exported["generated"]);
    assert_eq!(direct["random_weights"], true);
    assert_eq!(exported["random_weights"], false);
    // Another seed is another model.
    let other = forward("random:tiny@10", &[]);
    assert_ne!(direct["argmax"], other["argmax"]);
    // Exporting into a directory that is not empty is refused, and writes nothing.
    let out = kvbench(&["models", "--export", "random:tiny@9", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// An export that cannot finish (here a file-size limit below the weights' size) leaves nothing at
/// its target, not a partial checkpoint that a later load or export would trip over, and no staging
/// directory beside it; an empty target directory stays as it was, and the next export fills it
/// (before, a SIGTERM four seconds into exporting `random:qwen2.5-coder-0.5b` left 265 MB of a
/// `model.safetensors` in the target).
#[test]
fn an_export_that_fails_leaves_no_partial_checkpoint() {
    let parent = temp("export-fails");
    let target = parent.join("ckpt");
    std::fs::create_dir_all(&target).unwrap();
    let limited = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -f 8; exec '{}' models --export random:tiny@9 '{}'",
            env!("CARGO_BIN_EXE_kvbench"),
            target.display()
        ))
        .output()
        .unwrap();
    assert!(!limited.status.success(), "{limited:?}");
    let err = String::from_utf8_lossy(&limited.stderr);
    assert!(err.contains("--export random:tiny@9"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&parent)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("ckpt")], "{left:?}");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
    // A killed export's staging directory (its process gone) goes with the next export to the same
    // target; another target's stays.
    let stale = parent.join(".ckpt.tmp-4294967294");
    let other = parent.join(".other.tmp-4294967294");
    std::fs::create_dir_all(stale.join("x")).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    ok(&kvbench(&[
        "models",
        "--export",
        "random:tiny@9",
        target.to_str().unwrap(),
    ]));
    assert!(target.join("model.safetensors").is_file());
    assert!(!stale.exists() && other.exists());
    let _ = std::fs::remove_dir_all(&parent);
}

/// A tokenizer that can produce an id the model has no embedding row for is refused when the model
/// loads (exit 2, naming the id), not as an index error in the first prompt that spells the token;
/// fewer ids than rows (Qwen2.5's padding) stays allowed.
#[test]
fn a_tokenizer_with_ids_beyond_the_embedding_is_refused_at_load() {
    let dir = temp("tokenizer-beyond");
    let ckpt = dir.join("ckpt");
    ok(&kvbench(&[
        "models",
        "--export",
        "random:tiny",
        ckpt.to_str().unwrap(),
    ]));
    let path = ckpt.join("tokenizer.json");
    let mut t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let rows = t["model"]["vocab"].as_object().unwrap().len();
    let args = [
        "forward",
        "--model",
        ckpt.to_str().unwrap(),
        "--tokens",
        "2",
    ];
    // The last row unused by the tokenizer: loads.
    let mut fewer = t.clone();
    fewer["model"]["vocab"]
        .as_object_mut()
        .unwrap()
        .retain(|_, id| id.as_u64() != Some(rows as u64 - 1));
    std::fs::write(&path, fewer.to_string()).unwrap();
    ok(&kvbench(&args));
    t["added_tokens"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "id": rows, "content": "Please", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": false
        }));
    std::fs::write(&path, t.to_string()).unwrap();
    let out = kvbench(&args);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("token id {rows} (\"Please\")"))
            && err.contains(&format!("{rows} rows")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn policies_run_on_random_models_and_lists_are_refused_where_one_policy_runs() {
    let g = forward("random:tiny", &["--policy", "h2o", "--budget", "8"]);
    assert_eq!(g["generated"].as_array().unwrap().len(), 12);
    assert!(g["policy"].as_str().unwrap().starts_with("h2o budget=8"));
    for cmd in ["run", "forward"] {
        let out = kvbench(&[
            cmd,
            "--model",
            "random:tiny",
            "--policy",
            "rkv,h2o",
            "--budget",
            "64",
        ]);
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("one policy"));
    }
    let out = kvbench(&["run", "--model", "random:nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("r1-distill-qwen-7b"));
}

/// `forward --batch N` decodes N prompts of different lengths together; a batch the prompt cannot
/// give, or one without `--generate`, exits 2 naming the flag before anything is written.
#[test]
fn forward_decodes_a_batch_and_refuses_one_it_cannot_build() {
    let g = forward("random:tiny", &["--batch", "3"]);
    let batch = g["generated_batch"].as_array().unwrap();
    assert_eq!(batch.len(), 3);
    assert_eq!(g["generated"], batch[0]);
    assert!(batch.iter().all(|s| s.as_array().unwrap().len() == 12));
    let dir = std::env::temp_dir().join(format!("kvbench-forward-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let logits = dir.join("logits.safetensors");
    let logits = logits.to_str().unwrap();
    // 24 prompt tokens give at most 8 sequences (each drops 3 more).
    for extra in [
        vec!["--batch", "9", "--logits", logits],
        vec!["--batch", "0", "--logits", logits],
    ] {
        let out = kvbench(&forward_args("random:tiny", &extra));
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--batch"));
        assert!(
            !std::path::Path::new(logits).exists(),
            "{extra:?} wrote logits"
        );
    }
    let out = kvbench(&["forward", "--model", "random:tiny", "--batch", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs --generate"));
    // Logits of more tokens than candle's CUDA kernels count in one tensor (a 151,936-token
    // vocabulary): refused by flag, before any work, on every device.
    let out = kvbench(&[
        "forward",
        "--model",
        "random:qwen2.5-coder-0.5b",
        "--tokens",
        "28269",
        "--logits",
        logits,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--tokens") && err.contains("at most 28268 tokens"),
        "{err}"
    );
    assert!(!std::path::Path::new(logits).exists());
    // A drawn prompt past the context is refused before it is drawn (it panicked allocating it).
    let out = kvbench(&[
        "forward",
        "--model",
        "random:tiny",
        "--tokens",
        &usize::MAX.to_string(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tokens"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kvbench perf` on random:tiny (8-token prefill, no warm-up, one repeat, no bandwidth test) with
/// `args` added, its export written to `json`: what it printed, and each decode row's measurement.
fn perf_decode_rows(json: &Path, args: &[&str]) -> (String, Vec<serde_json::Value>) {
    let mut all = vec![
        "perf",
        "--model",
        "random:tiny",
        "--prompt-tokens",
        "8",
        "--warmup",
        "0",
        "--repeats",
        "1",
        "--no-bandwidth",
        "--export-json",
        json.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let out = ok(&kvbench(&all));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let rows = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["measurement"]["phase"] == "decode")
        .map(|r| r["measurement"].clone())
        .collect();
    (out, rows)
}

/// `perf --profile`: a table of a decoding step's phases after the main one, and in the exported rows
/// each phase's time per step over the extra run's steps (the decoding steps only: new tokens − 1);
/// without the flag, no profile.
#[test]
fn perf_profile_prints_and_exports_a_decoding_step_s_phases() {
    let dir = temp("perf-profile");
    std::fs::create_dir_all(&dir).unwrap();
    let perf = |json: &Path, extra: &[&str]| {
        let mut args = vec!["--batch", "1,2,1", "--decode-prompt-tokens", "8"];
        args.extend_from_slice(&["--decode-tokens", "5"]);
        args.extend_from_slice(extra);
        let (out, rows) = perf_decode_rows(json, &args);
        let profiles: Vec<serde_json::Value> = rows.iter().map(|r| r["profile"].clone()).collect();
        (out, profiles)
    };
    let (out, profiles) = perf(&dir.join("p.json"), &["--profile"]);
    assert!(out.contains("| decode | embed | norms | qkv"), "{out}");
    // One row per batch size (1 given twice).
    assert_eq!(profiles.len(), 2);
    for p in &profiles {
        assert_eq!(p["steps"], 4, "{p}");
        let phases = p["phases_secs_per_step"].as_object().unwrap();
        assert_eq!(phases.len(), 10, "{p}");
        assert!(phases["attention"].as_f64().unwrap() > 0.0, "{p}");
        let sum: f64 = phases.values().map(|v| v.as_f64().unwrap()).sum();
        let profiled = p["profiled_secs_per_step"].as_f64().unwrap();
        assert!(sum <= profiled * 1.0001 && sum > 0.0, "{p}");
        assert!(p["unprofiled_secs_per_step"].as_f64().unwrap() > 0.0, "{p}");
    }
    let (out, profiles) = perf(&dir.join("q.json"), &[]);
    assert!(!out.contains("| decode | embed"), "{out}");
    assert!(profiles.iter().all(|p| p.is_null()), "{profiles:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A 16-bit checkpoint on the CPU (`--weights auto`), bf16 or f16, multiplies in kvbench's 16-bit
/// product: its logits are the widened matrices' (`--weights f32`) to float rounding, prefill and
/// decoding steps alike (candle's 16-bit products, before, rounded the activations to 16 bits: 4.4e-3
/// here in bf16). The f16 checkpoint is the random model exported and narrowed to f16.
#[test]
fn sixteen_bit_weights_on_the_cpu_compute_as_their_f32_widening() {
    use candle_core::DType;
    use kvbench::model::weights::WeightFormat;
    use kvbench::model::{LoadOptions, Model};
    kvbench::init_threads(None).unwrap();
    let dir = temp("f16-checkpoint");
    ok(&kvbench(&[
        "models",
        "--export",
        "random:tiny@6",
        dir.to_str().unwrap(),
    ]));
    let file = dir.join("model.safetensors");
    let narrowed: std::collections::HashMap<String, candle_core::Tensor> =
        candle_core::safetensors::load(&file, &candle_core::Device::Cpu)
            .unwrap()
            .into_iter()
            .map(|(name, t)| (name, t.to_dtype(DType::F16).unwrap()))
            .collect();
    candle_core::safetensors::save(&narrowed, &file).unwrap();
    for (model, dtype) in [
        ("random:tiny@6", DType::BF16),
        (dir.to_str().unwrap(), DType::F16),
    ] {
        let load = |format| {
            Model::load(
                model,
                &LoadOptions {
                    format,
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let (stored, widened) = (load(WeightFormat::Auto), load(WeightFormat::F32));
        assert_eq!(
            stored.transformer.weight_bytes() * 2,
            widened.transformer.weight_bytes(),
            "{dtype:?} weights are held in their two bytes"
        );
        let logits = |m: &Model| {
            let mut state = m
                .transformer
                .new_state(Box::new(kvbench::policy::Full))
                .unwrap();
            let mut out = vec![common::logits_of(
                m,
                &mut state,
                &(0..37).collect::<Vec<u32>>(),
            )];
            for t in [5u32, 900, 4095, 17] {
                out.push(common::logits_of(m, &mut state, &[t]));
            }
            out
        };
        let (a, b) = (logits(&stored), logits(&widened));
        let worst = a
            .iter()
            .flatten()
            .zip(b.iter().flatten())
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-4, "{dtype:?}: largest logit difference {worst}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `perf --mem-limit` measures the largest batch whose KV fits, up to `--max-batch`; a batch the cap
/// chose says so (the printed row and `batch_that_fits` in the export), and an uncapped one is the
/// batch that fits.
#[test]
fn perf_says_when_max_batch_capped_the_batch_that_fits() {
    let dir = temp("max-batch");
    std::fs::create_dir_all(&dir).unwrap();
    let decode_rows = |max: &str, file: &str| {
        let args = [
            "--decode-prompt-tokens",
            "64",
            "--decode-tokens",
            "2",
            "--batch",
            "1",
        ];
        let limit = ["--mem-limit", "4", "--max-batch", max];
        perf_decode_rows(&dir.join(file), &[&args[..], &limit[..]].concat())
    };
    let (out, rows) = decode_rows("8", "at-8.json");
    let fit = rows.iter().find(|r| r["fits_mem_limit"] == true).unwrap();
    assert_eq!(fit["batch"], 8);
    let all = fit["batch_that_fits"].as_u64().unwrap();
    assert!(all > 8, "{fit}");
    assert!(
        out.contains(&format!("{all} sequences' KV")) && out.contains("capped at --max-batch 8"),
        "{out}"
    );
    let (out, rows) = decode_rows("100000", "at-100000.json");
    let fit = rows.iter().find(|r| r["fits_mem_limit"] == true).unwrap();
    assert_eq!(fit["batch"].as_u64(), Some(all), "{fit}");
    assert_eq!(fit["batch_that_fits"].as_u64(), Some(all));
    assert!(!out.contains("capped at"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kvbench models` lists every model in one column (a long random name ran into its description),
/// and the test model's size in millions, not as 0.00 billion.
#[test]
fn the_model_list_keeps_its_columns() {
    let out = kvbench(&["models"]);
    ok(&out);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("  ")).collect();
    assert!(rows.len() >= 12, "{text}");
    // Where each row's description starts: after its name and the padding.
    let starts: Vec<usize> = rows
        .iter()
        .map(|r| {
            let name_end = 2 + r[2..].find(' ').unwrap();
            name_end + r[name_end..].find(|c: char| c != ' ').unwrap()
        })
        .collect();
    assert!(starts.iter().all(|&s| s == starts[0]), "{text}");
    let tiny = rows.iter().find(|r| r.contains("random:tiny ")).unwrap();
    assert!(
        tiny.contains(" M parameters") && tiny.contains(" MiB in bf16"),
        "{tiny}"
    );
    assert!(!text.contains("0.00 B"), "{text}");
}
