//! A missing or corrupt model is a clear error naming the file, and a usage error exits with code 2.

mod common;

use kvbench::model::{LoadOptions, Model};
use std::io::Write;

fn load_err(path: &std::path::Path) -> String {
    match Model::load(path.to_str().unwrap(), &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => {
            assert!(e.is_input_error(), "{e} should be an input error");
            e.to_string()
        }
    }
}

#[test]
fn missing_wrong_magic_and_truncated_files_are_named() {
    let dir = std::env::temp_dir().join(format!("kvbench-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let missing = dir.join("absent.gguf");
    let msg = load_err(&missing);
    assert!(msg.contains("absent.gguf"), "{msg}");

    let bad = dir.join("bad.gguf");
    std::fs::File::create(&bad)
        .unwrap()
        .write_all(b"NOTAGGUF file at all")
        .unwrap();
    let msg = load_err(&bad);
    assert!(
        msg.contains("bad.gguf") && msg.contains("not a GGUF file (it starts with \"NOTA\""),
        "{msg}"
    );
    // A file of a Hugging Face checkpoint: the directory is the model.
    std::fs::write(dir.join("config.json"), "{}").unwrap();
    let weights = dir.join("model.safetensors");
    std::fs::write(&weights, [8u8, 0, 0, 0]).unwrap();
    let msg = load_err(&weights);
    assert!(msg.contains("give its directory"), "{msg}");
    std::fs::remove_file(dir.join("config.json")).unwrap();

    // The real model cut in half: the header parses, the tensor data is missing.
    let real = std::fs::read(common::gguf_path()).unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &real[..real.len() / 2]).unwrap();
    let msg = load_err(&cut);
    assert!(
        msg.contains("cut.gguf") && msg.contains("truncated"),
        "{msg}"
    );

    // A directory without config.json.
    let msg = load_err(&dir);
    assert!(msg.contains("config.json"), "{msg}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unknown_names_are_resolution_errors() {
    let e = Model::load("no-such-model", &LoadOptions::default())
        .err()
        .expect("must fail");
    assert!(e.to_string().contains("no-such-model"), "{e}");
}

use common::{kvbench, ok};

#[test]
fn bad_flags_exit_with_code_2_and_say_which() {
    let out = kvbench(&["run", "--policy", "nonsense"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown policy 'nonsense'") && err.contains("--policy"),
        "{err}"
    );

    // An output file that is a directory is refused before anything runs.
    let tmp = std::env::temp_dir();
    let out = kvbench(&[
        "run",
        "--policy",
        "rkv",
        "--budget",
        "64",
        "--trace",
        tmp.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--trace") && err.contains("a directory"),
        "{err}"
    );

    // A replot of a file without data rows is refused, not drawn empty.
    let empty = tmp.join(format!("kvbench-empty-{}.csv", std::process::id()));
    std::fs::write(&empty, "garbage\n").unwrap();
    let out = kvbench(&[
        "scaling",
        "--replot",
        empty.to_str().unwrap(),
        "--out",
        tmp.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--replot"));
    std::fs::remove_file(&empty).unwrap();

    for budget in ["0", "-1", "2e19"] {
        let out = kvbench(&["run", "--budget", budget]);
        assert_eq!(out.status.code(), Some(2), "budget {budget}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--budget"));
    }

    let out = kvbench(&["run", "--model", "./missing/model.gguf"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing/model.gguf"));

    let out = kvbench(&["run", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));

    // A study option `fidelity` has no use for is refused, not ignored.
    for (flag, value) in [
        ("--out", "x"),
        ("--batch-size", "4"),
        ("--fidelity", "true"),
    ] {
        let out = kvbench(&["fidelity", "--policy", "rkv", "--budget", "64", flag, value]);
        assert_eq!(out.status.code(), Some(2), "{flag}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains("not used"), "{err}");
    }

    // The study's options out of range name the flag (a config's key is named by the config test).
    for (flag, value) in [
        ("--max-new-tokens", "0"),
        ("--samples", "0"),
        ("--batch-size", "0"),
        ("--top-p", "0"),
        ("--top-p", "1.5"),
        ("--temperature", "-1"),
        ("--temperature", "nan"),
    ] {
        let arg = format!("{flag}={value}");
        for args in [vec!["run", &arg], vec!["sweep", "configs/smoke.toml", &arg]] {
            let out = kvbench(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains(flag) && err.lines().count() <= 3, "{err}");
            assert!(out.stdout.is_empty(), "{args:?} printed");
        }
    }

    for limit in ["-5", "0", "nan", "inf"] {
        let flag = format!("--mem-limit={limit}");
        let out = kvbench(&["perf", &flag]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains("--mem-limit"), "{err}");
    }
    for max in ["0", "-2", "many"] {
        let flag = format!("--max-batch={max}");
        let out = kvbench(&["perf", &flag]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains("--max-batch"), "{err}");
    }
    let out = kvbench(&["run", "--limit", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "--limit 0: {err}");
    assert!(err.contains("'0' for '--limit"), "{err}");

    // Threads are bounded (four per logical core) and at least one, checked before anything starts.
    for threads in ["0", "100000", "-3", "many"] {
        let flag = format!("--threads={threads}");
        let out = kvbench(&["run", &flag]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--threads {threads}: {err}");
        assert!(
            err.contains("--threads") && err.contains("four per logical core"),
            "{err}"
        );
    }

    // A plan is counted before it is built: a billion samples a problem is refused, not allocated.
    let out = kvbench(&[
        "sweep",
        "configs/smoke.toml",
        "--samples",
        "1000000000",
        "--dry-run",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("1000000000 samples") && err.contains("split"),
        "{err}"
    );
    // Every command checks what it will generate against the model's context and the batch's full
    // caches against the machine's memory before running, naming the flags.
    let scaling_out = std::env::temp_dir().join(format!("kvbench-scal-{}", std::process::id()));
    for (args, needle) in [
        (
            vec!["perf", "--decode-tokens", "18446744073709551615"],
            "--decode-tokens",
        ),
        (vec!["perf", "--prompt-tokens", "9000"], "--prompt-tokens"),
        (
            vec!["perf", "--batch", "1000000", "--no-bandwidth"],
            "KV cache without compression",
        ),
        (
            vec![
                "scaling",
                "--lengths",
                "1000000000000",
                "--out",
                scaling_out.to_str().unwrap(),
            ],
            "--lengths",
        ),
        (
            vec![
                "fidelity",
                "--policy",
                "streaming",
                "--budget",
                "64",
                "--max-new-tokens",
                "99999999999",
            ],
            "max_new_tokens 99999999999",
        ),
        // Budgets that wait for the full run's mean length, where none runs: the remedy fits the
        // policy (Kara's absolute budget is always read as ρ = B / mean; --budget-rule seen would
        // not help it).
        (
            vec!["fidelity", "--policy", "rkv", "--budget", "0.5"],
            "or --budget-rule seen",
        ),
        (
            vec!["fidelity", "--policy", "kara", "--budget", "128"],
            "ρ = 128 / the full run's mean",
        ),
        (
            vec![
                "run",
                "--policy",
                "kara",
                "--budget",
                "128",
                "--no-baseline",
            ],
            "ρ = 128 / the full run's mean",
        ),
    ] {
        let out = kvbench(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert!(
        !scaling_out.exists(),
        "a refused scaling run writes nothing"
    );
    // Any base seed works: the per-sample seeds wrap instead of overflowing.
    ok(&kvbench(&[
        "sweep",
        "configs/smoke.toml",
        "--seed",
        "18446744073709551615",
        "--samples",
        "2",
        "--dry-run",
    ]));
}

#[test]
fn prompt_and_new_tokens_beyond_the_context_are_refused_before_running() {
    common::model(kvbench::model::weights::WeightFormat::Native); // make sure the model is cached
    let dir = std::env::temp_dir().join(format!("kvbench-context-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SmolLM2's context is 8,192 tokens.
    let out = kvbench(&[
        "run",
        "--limit",
        "1",
        "--max-new-tokens",
        "8180",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("max_new_tokens 8180") && err.contains("context of 8192"),
        "{err}"
    );
    assert!(
        kvbench::results::dir::read_samples(&dir)
            .map(|s| s.records.is_empty())
            .unwrap_or(true),
        "no sample was run"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// When every unit of a run fails (here a checkpoint whose final norm holds NaN: every logit is NaN,
/// which stops each generation), the run names the failure, says no sample finished instead of
/// printing means over nothing ("pass@1 -0.0%", zero tokens/s), prints no empty comparison table,
/// and exits with code 1.
#[test]
fn a_run_whose_every_unit_fails_says_so_instead_of_printing_zeros() {
    let dir = std::env::temp_dir().join(format!("kvbench-allfail-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("ckpt");
    common::ok(&kvbench(&[
        "models",
        "--export",
        "random:tiny",
        ckpt.to_str().unwrap(),
    ]));
    poison(&ckpt.join("model.safetensors"), "model.norm.weight");
    let results = dir.join("results");
    let out = kvbench(&[
        "run",
        "--policy",
        "rkv",
        "--budget",
        "0.1",
        "--limit",
        "1",
        "--max-new-tokens",
        "4",
        "--model",
        ckpt.to_str().unwrap(),
        "--out",
        results.to_str().unwrap(),
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("non-finite logit") && stderr.contains("2 units failed"),
        "{stderr}"
    );
    assert!(
        stdout.contains("no sample of this policy finished"),
        "{stdout}"
    );
    for zero in [
        "pass@1",
        "-0.0",
        "tokens/s",
        "against the full-cache baseline",
    ] {
        assert!(!stdout.contains(zero), "{zero} printed: {stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sets every value of tensor `name` of a bf16 safetensors file to NaN.
fn poison(file: &std::path::Path, name: &str) {
    let mut bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header[name]["dtype"], "BF16");
    let range = &header[name]["data_offsets"];
    let (start, end) = (
        8 + n + range[0].as_u64().unwrap() as usize,
        8 + n + range[1].as_u64().unwrap() as usize,
    );
    for value in bytes[start..end].chunks_exact_mut(2) {
        value.copy_from_slice(&0x7fc0u16.to_le_bytes());
    }
    std::fs::write(file, bytes).unwrap();
}

#[test]
fn run_prints_answers_grades_and_speed() {
    common::model(kvbench::model::weights::WeightFormat::Native); // make sure the model is cached
    let dir = std::env::temp_dir().join(format!("kvbench-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = kvbench(&[
        "run",
        "--policy",
        "streaming",
        "--budget",
        "0.5",
        "--limit",
        "2",
        "--max-new-tokens",
        "16",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("| problem | answer | gold | correct | tokens | finish |"),
        "{text}"
    );
    assert_eq!(text.matches("| builtin-").count(), 2, "{text}");
    assert!(
        text.contains("accuracy: pass@1") && text.contains("decode ") && text.contains("tokens/s"),
        "{text}"
    );
    // The full-cache baseline ran beside the policy, and the comparison table names both.
    assert!(text.contains("against the full-cache baseline"), "{text}");
    // The ratio budget was resolved from the full run, and the run says to what.
    assert!(text.contains("resolved: B = "), "{text}");
    assert!(
        text.contains("| full | - |") && text.contains("| streaming | 0.5 (B = "),
        "{text}"
    );
    let records = kvbench::results::dir::read_samples(&dir).unwrap().records;
    assert_eq!(records.len(), 4);
    // Rerunning the same command reuses the finished units.
    let out = kvbench(&[
        "run",
        "--policy",
        "streaming",
        "--budget",
        "0.5",
        "--limit",
        "2",
        "--max-new-tokens",
        "16",
        "--out",
        dir.to_str().unwrap(),
        "--no-baseline",
    ]);
    // A ratio budget without the full run: refused before anything, naming both flags.
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--no-baseline") && err.contains("--budget 0.5"),
        "{err}"
    );
    // Another budget rule is another configuration (not only another grid): refused, nothing written.
    let out = kvbench(&[
        "run",
        "--policy",
        "streaming",
        "--budget",
        "0.5",
        "--budget-rule",
        "seen",
        "--limit",
        "2",
        "--max-new-tokens",
        "16",
        "--out",
        dir.to_str().unwrap(),
        "--no-baseline",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another configuration"));
    assert_eq!(
        kvbench::results::dir::read_samples(&dir)
            .unwrap()
            .records
            .len(),
        4
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn stored_samples_regrade_without_generating() {
    common::model(kvbench::model::weights::WeightFormat::Native);
    let dir = std::env::temp_dir().join(format!("kvbench-regrade-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let samples = dir.join("samples.jsonl");
    let s = samples.to_str().unwrap();
    let out = kvbench(&[
        "run",
        "--limit",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = kvbench::results::sample::read_records(&samples).unwrap();
    assert_eq!(records.len(), 2);
    assert!(!records[0].output.is_empty() && records[0].grader.starts_with("kvbench-grader"));
    // The same grader changes nothing.
    let out = kvbench(&["regrade", s]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 verdicts changed"));
    // A corrupt line is named, and the file is left as it was.
    let before = std::fs::read_to_string(&samples).unwrap();
    std::fs::write(&samples, format!("{before}{{not json\n")).unwrap();
    let out = kvbench(&["regrade", s, "--in-place"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("samples.jsonl:3"));
    assert!(std::fs::read_to_string(&samples)
        .unwrap()
        .starts_with(&before));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_sweep_configs_give_one_clear_error_each() {
    let dir = std::env::temp_dir().join(format!("kvbench-sweepcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = "name = \"t\"\nlimit = 2\nbudgets = [0.1]\n";
    let cases = [
        (
            "unknown-key",
            format!("{base}colour = 3\n[[policy]]\nname = \"rkv\"\n"),
            "colour",
        ),
        (
            "unknown-policy",
            format!("{base}[[policy]]\nname = \"magic\"\n"),
            "magic",
        ),
        (
            "zero-budget",
            format!("{base}[[policy]]\nname = \"rkv\"\nbudgets = [0.0]\n"),
            "budget",
        ),
        (
            "negative-budget",
            format!("{base}[[policy]]\nname = \"rkv\"\nbudgets = [-1.0]\n"),
            "budget",
        ),
        (
            "bad-arg",
            format!("{base}[[policy]]\nname = \"rkv\"\nargs = {{ lamda = 1 }}\n"),
            "lamda",
        ),
        (
            "missing-model",
            format!("model = \"/nope/model.gguf\"\n{base}[[policy]]\nname = \"full\"\n"),
            "/nope/model.gguf",
        ),
        (
            "unreadable-data",
            format!("data = \"missing.jsonl\"\n{base}[[policy]]\nname = \"full\"\n"),
            "missing.jsonl",
        ),
        (
            "huge-budget",
            format!(
                "{base}[[policy]]\nname = \"rkv\"\nbudgets = [2e19]\nargs = {{ buffer = 4 }}\n"
            ),
            "at most 1073741824 entries",
        ),
        (
            "huge-budget-1e308",
            format!("{base}[[policy]]\nname = \"rkv\"\nbudgets = [1e308]\n"),
            "budget 1e308 (--budget, or `budgets` in a sweep config): at most 1073741824 entries",
        ),
        (
            "duplicate-budget",
            format!("{base}[[policy]]\nname = \"rkv\"\nbudgets = [64.0, 64.0]\n"),
            "listed twice",
        ),
        (
            "duplicate-policy",
            format!("{base}[[policy]]\nname = \"rkv\"\n[[policy]]\nname = \"rkv\"\n"),
            "listed twice",
        ),
        (
            "path-name",
            "name = \"../../x\"\nlimit = 2\n[[policy]]\nname = \"full\"\n".to_string(),
            "name \"../../x\"",
        ),
        (
            "empty-name",
            "name = \"\"\nlimit = 2\n[[policy]]\nname = \"full\"\n".to_string(),
            "name \"\"",
        ),
    ];
    for (name, text, needle) in cases {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = kvbench(&["sweep", path.to_str().unwrap(), "--dry-run"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(needle), "{name}: {err}");
        assert_eq!(err.matches("error:").count(), 1, "{name}: one error: {err}");
    }
    let out = kvbench(&["sweep", "configs/smoke.toml", "--dry-run"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("42 work units"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The test model patched in memory by `patch`, written to `dir/NAME.gguf`.
fn patched_model(
    dir: &std::path::Path,
    name: &str,
    patch: impl FnOnce(&mut Vec<u8>),
) -> std::path::PathBuf {
    let mut bytes = std::fs::read(common::gguf_path()).unwrap();
    patch(&mut bytes);
    let path = dir.join(format!("{name}.gguf"));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The test model with one metadata value overwritten in place (a u32 or f32 value of `key`).
fn with_metadata(dir: &std::path::Path, key: &str, value: [u8; 4]) -> std::path::PathBuf {
    patched_model(dir, key, |bytes| {
        let at = bytes
            .windows(key.len())
            .position(|w| w == key.as_bytes())
            .unwrap_or_else(|| panic!("{key} in the test model"));
        let ty = u32::from_le_bytes(
            bytes[at + key.len()..at + key.len() + 4]
                .try_into()
                .unwrap(),
        );
        assert!(ty == 4 || ty == 6, "{key} is a u32 or f32");
        let v = at + key.len() + 4;
        bytes[v..v + 4].copy_from_slice(&value);
    })
}

/// GGUF metadata that disagrees with the tensors, or is not finite, is refused before anything is
/// allocated from it, naming the file, the value and the tensor.
#[test]
fn gguf_metadata_is_checked_against_the_tensors_and_for_finite_values() {
    common::model(kvbench::model::weights::WeightFormat::Native);
    let dir = std::env::temp_dir().join(format!("kvbench-gguf-md-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: [(&str, [u8; 4], &str); 6] = [
        (
            "llama.embedding_length",
            (1u32 << 31).to_le_bytes(),
            "embedding_length",
        ),
        (
            "llama.embedding_length",
            512u32.to_le_bytes(),
            "token_embd.weight",
        ),
        ("llama.block_count", 31u32.to_le_bytes(), "has 31 layers"),
        (
            "llama.attention.layer_norm_rms_epsilon",
            f32::NAN.to_le_bytes(),
            "RMSNorm epsilon NaN",
        ),
        (
            "llama.rope.freq_base",
            f32::NAN.to_le_bytes(),
            "RoPE frequency base NaN",
        ),
        (
            "llama.rope.freq_base",
            (-1.0f32).to_le_bytes(),
            "RoPE frequency base -1",
        ),
    ];
    for (key, value, needle) in cases {
        let path = with_metadata(&dir, key, value);
        let started = std::time::Instant::now();
        let msg = load_err(&path);
        assert!(
            msg.contains(needle) && msg.contains(path.file_name().unwrap().to_str().unwrap()),
            "{key}: {msg}"
        );
        assert!(
            started.elapsed().as_secs() < 10,
            "{key}: refused before loading"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The test model with the two dimensions of one tensor's shape swapped in its header: the same
/// byte size (so the file's bounds still hold), a shape the metadata does not allow.
fn with_swapped_dims(dir: &std::path::Path, tensor: &str) -> std::path::PathBuf {
    patched_model(dir, tensor, |bytes| {
        // A tensor info: name length (u64), name, dimension count (u32), dimensions (u64 each).
        let at = bytes
            .windows(tensor.len() + 1)
            .position(|w| &w[..tensor.len()] == tensor.as_bytes() && w[tensor.len()] == 2)
            .unwrap_or_else(|| panic!("{tensor} in the test model"));
        let d = at + tensor.len() + 4;
        let (a, b) = (bytes[d..d + 8].to_vec(), bytes[d + 8..d + 16].to_vec());
        assert_ne!(a, b, "{tensor} is not square");
        bytes[d..d + 8].copy_from_slice(&b);
        bytes[d + 8..d + 16].copy_from_slice(&a);
    })
}

/// A damaged shape in any layer, not only the first, is refused at load naming the tensor, rather
/// than failing inside a matrix product mid-forward.
#[test]
fn a_damaged_tensor_shape_in_a_later_layer_is_refused_by_name() {
    common::model(kvbench::model::weights::WeightFormat::Native);
    let dir = std::env::temp_dir().join(format!("kvbench-gguf-shape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for tensor in [
        "blk.29.ffn_down.weight",
        "blk.17.attn_k.weight",
        "blk.0.ffn_up.weight",
    ] {
        let path = with_swapped_dims(&dir, tensor);
        let msg = load_err(&path);
        assert!(
            msg.contains(&format!("tensor {tensor} has shape")) && msg.contains(".gguf"),
            "{tensor}: {msg}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Files that are devices, directories or endless are refused by name before anything is read from
/// them: a config, a problem file, a tokenizer, and a results directory's own files.
#[cfg(unix)]
#[test]
fn devices_and_directories_in_place_of_files_are_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("kvbench-devices-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let check = |args: &[&str], needle: &str| {
        let started = std::time::Instant::now();
        let out = common::kvbench(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(started.elapsed().as_secs() < 60, "{args:?} took too long");
    };
    check(&["sweep", "/dev/zero", "--dry-run"], "/dev/zero");
    check(
        &["sweep", dir.to_str().unwrap(), "--dry-run"],
        "is a directory",
    );
    check(
        &[
            "run",
            "--dataset",
            "math500",
            "--data",
            "/dev/zero",
            "--limit",
            "1",
        ],
        "/dev/zero",
    );
    check(
        &["run", "--tokenizer", "/dev/zero", "--limit", "1"],
        "/dev/zero",
    );
    check(&["grade", "--cases", "/dev/zero"], "/dev/zero");
    // A results directory whose samples file is a link to an endless device.
    let res = dir.join("res");
    std::fs::create_dir_all(&res).unwrap();
    std::os::unix::fs::symlink("/dev/zero", res.join("samples.jsonl")).unwrap();
    check(
        &["report", res.to_str().unwrap(), "--no-plots"],
        "samples.jsonl",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A malformed kernel setting (`KVBENCH_PREFETCH`, `KVBENCH_REPACK`, `KVBENCH_VNNI`, `KVBENCH_PATH`:
/// read inside the kernels) is refused before any command runs, naming the variable and its value.
#[test]
fn a_bad_kernel_setting_exits_with_code_2_and_names_the_variable() {
    let run = |var: &str, value: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .arg("policies")
            .env(var, value)
            .output()
            .expect("run kvbench")
    };
    for (var, bad, good) in [
        ("KVBENCH_PREFETCH", "4k", "0"),
        ("KVBENCH_REPACK", "yes", "0"),
        ("KVBENCH_VNNI", "on", "1"),
        ("KVBENCH_PATH", "sse9", "avx2"),
        // The GPU's comparison switches: any value turned them on, `=0` too.
        ("KVBENCH_HOST_SCORES", "yes", "1"),
        ("KVBENCH_HOST_LOGITS", "true", "0"),
        ("KVBENCH_COMPRESS_EACH", "", "0"),
        ("KVBENCH_PREFILL_EACH", "on", "0"),
        ("KVBENCH_POLICY_PER_LAYER", "2", "1"),
        ("KVBENCH_VERIFY", "y", "0"),
    ] {
        let out = run(var, bad);
        assert_eq!(out.status.code(), Some(2), "{var}={bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(var) && err.contains(&format!("\"{bad}\"")),
            "{err}"
        );
        assert_eq!(run(var, good).status.code(), Some(0), "{var}={good}");
    }
}

/// `kvbench report` with no directory named reads `results/` of the working directory: where there is
/// none, it says what to do (exit 2), not an i/o error.
#[test]
fn report_without_a_results_folder_says_what_to_name() {
    let dir = std::env::temp_dir().join(format!("kvbench-noresults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .arg("report")
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no result directories under results/") && err.lines().count() == 1,
        "{err}"
    );
    assert!(std::fs::read_dir(&dir).unwrap().next().is_none(), "wrote");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A cases file with no case in it (empty, or blank lines only) is refused by name: grading nothing
/// printed nothing and exited 0, as if every case had been graded.
#[test]
fn a_cases_file_without_cases_is_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("kvbench-nocases-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in [("empty.jsonl", ""), ("blank.jsonl", "\n  \n\n")] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let out = common::kvbench(&["grade", "--cases", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(name) && err.contains("no cases"), "{err}");
        assert!(out.stdout.is_empty());
    }
    let path = dir.join("one.jsonl");
    std::fs::write(&path, "{\"id\":\"a\",\"pred\":\"2\",\"gold\":\"2\"}\n").unwrap();
    let out = common::kvbench(&["grade", "--cases", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A results directory that cannot be made (a file in its place or in place of a parent) is refused
/// before a model loads, naming the option, and the file in the way is left as it was.
#[test]
fn a_results_directory_that_cannot_be_made_names_the_option() {
    let dir = std::env::temp_dir().join(format!("kvbench-out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a-file");
    std::fs::write(&file, "keep me\n").unwrap();
    let data = dir.join("problems.jsonl");
    std::fs::write(
        &data,
        "{\"id\": \"p1\", \"problem\": \"1+1?\", \"answer\": \"2\"}\n",
    )
    .unwrap();
    // A model not yet fetched: refused before it is resolved (a first run would download it only
    // to stop at the directory).
    let no_fetch = common::NoFetch::under(&dir);
    for (out, why, model) in [
        (
            file.clone(),
            "exists and is not a directory",
            "random:smollm2-135m",
        ),
        (
            file.join("sub"),
            "is not a directory",
            "random:smollm2-135m",
        ),
        (
            file.join("sub"),
            "is not a directory",
            common::NoFetch::MODEL,
        ),
    ] {
        for command in ["run", "sweep"] {
            let mut args = vec![command];
            if command == "sweep" {
                args.push("configs/smoke.toml");
            }
            args.extend([
                "--model",
                model,
                "--data",
                data.to_str().unwrap(),
                "--limit",
                "1",
                "--max-new-tokens",
                "2",
                "--out",
                out.to_str().unwrap(),
            ]);
            let err = no_fetch.refused(&args);
            assert!(
                err.contains("--out") && err.contains(why),
                "{args:?}: {err}"
            );
            assert!(!err.contains("loaded in"), "{args:?}: refused late: {err}");
        }
    }
    // The other commands that write a folder or a file: the same, naming their flag.
    let stored = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results/study-math500");
    let (stored, under) = (stored.to_str().unwrap(), file.join("sub"));
    let samples = format!("{stored}/samples.jsonl");
    for (args, flag) in [
        (
            vec!["scaling", "--model", "random:smollm2-135m", "--out"],
            "--out",
        ),
        (vec!["report", stored, "--no-plots", "--out"], "--out"),
        (vec!["regrade", &samples, "--out"], "--out"),
        (
            vec!["perf", "--model", "random:smollm2-135m", "--export-json"],
            "--export-json",
        ),
        (vec!["models", "--export", "random:tiny"], "--export"),
    ] {
        let mut args = args.clone();
        args.push(under.to_str().unwrap());
        let got = common::kvbench(&args);
        let err = String::from_utf8_lossy(&got.stderr);
        assert_eq!(got.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(flag) && err.contains("is not a directory"),
            "{args:?}: {err}"
        );
        assert!(got.stdout.is_empty(), "{args:?}: printed before refusing");
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--tokenizer` (and `forward --token-file`) names a file that must exist: refused as the flags are
/// parsed, by every command that loads a model, before the model is fetched (an empty cache, a
/// Python that cannot fetch).
#[test]
fn a_missing_tokenizer_file_is_refused_before_the_model_is_fetched() {
    let dir = std::env::temp_dir().join(format!("kvbench-tok-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let no_fetch = common::NoFetch::under(&dir);
    let (missing, a_dir) = (dir.join("no-such.json"), dir.to_str().unwrap().to_string());
    for tokenizer in [missing.to_str().unwrap(), a_dir.as_str()] {
        for command in [
            vec!["run"],
            vec!["sweep", "configs/smoke.toml"],
            vec!["perf"],
            vec!["scaling"],
            vec!["fidelity", "--policy", "h2o"],
            vec!["forward"],
        ] {
            let mut args = command.clone();
            args.extend(["--model", common::NoFetch::MODEL, "--tokenizer", tokenizer]);
            let err = no_fetch.refused(&args);
            assert!(
                err.contains("--tokenizer") && err.contains(tokenizer),
                "{args:?}: {err}"
            );
        }
        let args = [
            "forward",
            "--model",
            common::NoFetch::MODEL,
            "--token-file",
            tokenizer,
        ];
        let err = no_fetch.refused(&args);
        assert!(
            err.contains("--token-file") && err.contains(tokenizer),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file to read that is not there is named with the flag that named it (exit 2): the bare i/o
/// error said which file but not where it came from.
#[test]
fn a_missing_input_file_is_named_with_its_flag() {
    let dir = std::env::temp_dir().join(format!("kvbench-missing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("no-such.jsonl");
    let m = missing.to_str().unwrap();
    for (args, named) in [
        (
            vec!["run", "--model", "random:tiny", "--data", m],
            "problems file",
        ),
        (
            vec![
                "sweep",
                "configs/smoke.toml",
                "--model",
                "random:tiny",
                "--data",
                m,
            ],
            "problems file",
        ),
        (vec!["grade", "--cases", m], "--cases"),
        (vec!["sweep", m], "sweep config"),
        (vec!["regrade", m], "samples file"),
    ] {
        let out = common::kvbench(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("{named} {m}")) && err.contains("No such file"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing written"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `KVBENCH_CACHE` naming a file is an error naming the variable (exit 2), before anything is
/// fetched or written (it was an i/o error on a path under the file).
#[test]
fn a_cache_variable_that_is_not_a_directory_is_named() {
    let dir = std::env::temp_dir().join(format!("kvbench-cachevar-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    for args in [
        vec!["run", "--model", "smollm2-135m", "--limit", "1"],
        vec!["run", "--model", "random:tiny", "--dataset", "aime24"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(&args)
            .current_dir(&dir)
            .env("KVBENCH_CACHE", &file)
            .output()
            .expect("run kvbench");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!(
                "KVBENCH_CACHE={}: not a directory",
                file.display()
            )),
            "{args:?}: {err}"
        );
    }
    let mut left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["a-file"], "nothing written");
    std::fs::remove_dir_all(&dir).unwrap();
}
