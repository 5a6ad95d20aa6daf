//! The edges issue 43's hostile-input battery found, one test each: two commands on one results
//! directory, thread counts from the environment, unreadable results, pipes and streams, signals and
//! file-size limits, terminal injection from data files, planning large sweeps, empty regrades. They
//! run on a random-weight model (`random:tiny`), so they need no download.

mod common;

use common::{kvbench, ok};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvbench-rel-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A sweep of `units` units that takes a few seconds: one sequence at a time, to the length limit.
fn slow_config(dir: &Path, units: usize) -> PathBuf {
    let cfg = dir.join("slow.toml");
    std::fs::write(
        &cfg,
        format!(
            "name = \"slow\"\nmodel = \"random:tiny\"\nlimit = {units}\nprompt = \"plain\"\nmax_new_tokens = 1200\nignore_eos = true\nbatch_size = 1\n[[policy]]\nname = \"full\"\n"
        ),
    )
    .unwrap();
    cfg
}

/// Sends SIGTERM to `child`, checks it ended with 143 (128 + SIGTERM) and returns its standard error.
fn terminate(child: std::process::Child) -> String {
    signal(child, "TERM", 143)
}

/// Sends signal `name` to `child`, checks it ended with exit code `code` and returns its standard
/// error.
fn signal(child: std::process::Child, name: &str, code: i32) -> String {
    Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    let done = child.wait_with_output().unwrap();
    assert_eq!(done.status.code(), Some(code), "SIG{name}");
    String::from_utf8_lossy(&done.stderr).into_owned()
}

/// The hidden files a process leaves in `dir` while it runs: temporary files and its lock holder.
fn hidden_leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-") || n.starts_with(".lock.holder-"))
        .collect()
}

fn sweep(cfg: &Path, out: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvbench"));
    c.args([
        "sweep",
        cfg.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ])
    .env("RAYON_NUM_THREADS", "1")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    c
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Waits until `path` has at least `n` lines (or panics after a minute).
fn wait_for_lines(path: &Path, n: usize) {
    let started = Instant::now();
    while lines(path) < n {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no progress in {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn regrade_in_place_is_refused_while_a_sweep_writes_and_every_unit_survives() {
    let dir = temp("lock");
    let cfg = slow_config(&dir, 6);
    let out = dir.join("results");
    let mut running = sweep(&cfg, &out).spawn().unwrap();
    let samples = out.join("samples.jsonl");
    wait_for_lines(&samples, 1);
    let r = kvbench(&["regrade", samples.to_str().unwrap(), "--in-place"]);
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("in use by another kvbench process")
            && err.contains("pid ")
            && err.contains("sweep"),
        "{err}"
    );
    assert!(running.wait().unwrap().success());
    assert_eq!(lines(&samples), 6, "every unit kept");
    // Once the sweep has ended, the rewrite goes ahead.
    ok(&kvbench(&[
        "regrade",
        samples.to_str().unwrap(),
        "--in-place",
    ]));
    assert_eq!(lines(&samples), 6);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_ends_a_sweep_with_a_message_and_it_resumes() {
    let dir = temp("term");
    let cfg = slow_config(&dir, 4);
    let out = dir.join("results");
    let running = sweep(&cfg, &out).spawn().unwrap();
    let samples = out.join("samples.jsonl");
    wait_for_lines(&samples, 1);
    let err = terminate(running);
    assert!(
        err.contains("terminated (SIGTERM)") && err.contains("resume"),
        "{err}"
    );
    let kept = lines(&samples);
    assert!((1..4).contains(&kept), "{kept}");
    assert_eq!(hidden_leftovers(&out), Vec::<String>::new());
    let resumed = sweep(&cfg, &out).output().unwrap();
    assert!(resumed.status.success());
    assert!(String::from_utf8_lossy(&resumed.stderr)
        .contains(&format!("{kept} of 4 units already finished")));
    assert_eq!(lines(&samples), 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_size_limit_ends_a_sweep_with_a_message_not_a_signal() {
    let dir = temp("fsize");
    let cfg = slow_config(&dir, 3);
    let out = dir.join("results");
    let limited = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -f 8; exec '{}' sweep '{}' --out '{}'",
            env!("CARGO_BIN_EXE_kvbench"),
            cfg.display(),
            out.display()
        ))
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .unwrap();
    // An error exit with a message, not death by SIGXFSZ.
    assert!(matches!(limited.status.code(), Some(1 | 2)), "{limited:?}");
    let err = String::from_utf8_lossy(&limited.stderr);
    assert!(err.contains("File too large"), "{err}");
    let resumed = sweep(&cfg, &out).output().unwrap();
    assert!(resumed.status.success());
    assert_eq!(lines(&out.join("samples.jsonl")), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn thread_counts_from_the_environment_obey_the_flag_s_bounds() {
    for bad in ["100000", "0", "many"] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(["forward", "--model", "random:tiny", "--tokens", "2"])
            .env("RAYON_NUM_THREADS", bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("RAYON_NUM_THREADS={bad}")), "{err}");
    }
}

/// A count that must be at least 1 given as 0 (or not a number, or past its bound) is refused with
/// exit code 2 by the flag's name, before a model is loaded (a missing model file would be the error
/// otherwise).
#[test]
fn zero_counts_are_refused_by_the_flag_s_name_before_loading() {
    let missing = "/nonexistent/model.gguf";
    let cases: &[(&[&str], &str)] = &[
        (&["perf", "--batch", "1,0"], "--batch"),
        (&["perf", "--repeats", "0"], "--repeats"),
        // Warm-up and repeats summed past `usize` measured nothing and printed NaN rates.
        (&["perf", "--repeats", "18446744073709551615"], "--repeats"),
        (&["perf", "--warmup", "18446744073709551615"], "--warmup"),
        (&["perf", "--decode-tokens", "0"], "--decode-tokens"),
        // One new token is the prefill's: no decoding step would be timed (a rate of NaN).
        (&["perf", "--decode-tokens", "1"], "--decode-tokens"),
        (
            &["perf", "--decode-prompt-tokens", "0"],
            "--decode-prompt-tokens",
        ),
        (&["perf", "--prompt-tokens", "x"], "--prompt-tokens"),
        (&["perf", "--warmup-tokens", "0"], "--warmup-tokens"),
        (&["scaling", "--lengths", "0,512"], "--lengths"),
        (&["scaling", "--lengths", "1,512"], "--lengths"),
        (&["scaling", "--prompt-tokens", "0"], "--prompt-tokens"),
        (&["forward", "--tokens", "0"], "--tokens"),
        (&["forward", "--batch", "0"], "--batch"),
    ];
    for (args, flag) in cases {
        let mut all = args.to_vec();
        all.extend(["--model", missing]);
        let out = kvbench(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(
            !err.contains(missing),
            "{args:?} looked for the model: {err}"
        );
    }
    for flag in ["--shards", "--concurrency"] {
        let out = kvbench(&["sweep", "configs/aime.toml", "--emit", "slurm", flag, "0"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(flag), "{flag}: {err}");
    }
}

#[test]
fn results_that_are_not_records_are_errors_naming_file_and_line() {
    let dir = temp("nul");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("results/study-math500/sweep.json"),
        dir.join("sweep.json"),
    )
    .unwrap();
    // Megabytes of NUL bytes and no newline: not a record being written, an unreadable file.
    std::fs::write(dir.join("samples.jsonl"), vec![0u8; 4 << 20]).unwrap();
    let out = kvbench(&["report", dir.to_str().unwrap(), "--no-plots"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("samples.jsonl:1"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn regrading_nothing_is_an_error_and_writes_nothing() {
    let dir = temp("empty");
    let empty = dir.join("samples.jsonl");
    std::fs::write(&empty, "").unwrap();
    let target = dir.join("out.jsonl");
    let out = kvbench(&[
        "regrade",
        empty.to_str().unwrap(),
        "--out",
        target.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("samples.jsonl: no sample records"));
    assert!(!target.exists());
    let out = kvbench(&["regrade", dir.join("missing.jsonl").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.jsonl"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn streams_are_read_once_and_a_pipe_with_no_writer_does_not_hang() {
    let dir = temp("streams");
    let fifo = dir.join("fifo.jsonl");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let started = Instant::now();
    let out = kvbench(&[
        "run",
        "--model",
        "random:tiny",
        "--data",
        fifo.to_str().unwrap(),
        "--limit",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the FIFO was waited on"
    );
    // Named as a pipe that gave nothing, not as an empty problem set.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("fifo.jsonl: a pipe that gave no bytes"),
        "{err}"
    );
    // Data on standard input: the recorded hash is of the bytes read.
    let line = "{\"id\":\"s1\",\"problem\":\"What is 1+1?\",\"answer\":\"2\"}\n";
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args([
            "run",
            "--model",
            "random:tiny",
            "--data",
            "/dev/stdin",
            "--max-new-tokens",
            "1",
        ])
        .args(["--no-baseline", "--out", dir.join("r").to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(line.as_bytes())
        .unwrap();
    let done = child.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let digest = {
        use sha2::Digest;
        format!("{:x}", sha2::Sha256::digest(line.as_bytes()))
    };
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(err.contains(&digest[..16]), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/dev/full`, opened for writing: every write fails with "no space left on device".
fn full() -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap()
}

#[test]
fn a_failed_write_to_standard_output_is_one_line_and_exit_1() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .arg("policies")
        .stdout(full())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot write to standard output"), "{err}");
}

#[test]
fn an_unwritable_standard_error_loses_diagnostics_not_work_or_exit_codes() {
    let dir = temp("stderr-full");
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["run", "--model", "random:tiny", "--max-new-tokens", "2"])
        .args(["--limit", "2", "--no-baseline", "--out"])
        .arg(dir.join("r"))
        .stderr(full())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(lines(&dir.join("r").join("samples.jsonl")), 2);
    assert!(String::from_utf8_lossy(&out.stdout).contains("| problem |"));
    let refused = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["run", "--model", "random:tiny", "--out"])
        .arg(dir.join("bad"))
        .args(["--policy", "nope"])
        .stderr(full())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(!dir.join("bad").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Named values on the command line in any case, and policies by their papers' names, plan the same
/// sweep as kvbench's own spelling: the same config hash and unit ids, names printed as typed.
#[test]
fn names_in_any_case_plan_the_same_sweep() {
    let dir = temp("any-case");
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        "name = \"c\"\nlimit = 2\n[[policy]]\nname = \"full\"\n",
    )
    .unwrap();
    let plan = |args: &[&str]| {
        let mut all = vec![
            "sweep",
            cfg.to_str().unwrap(),
            "--dry-run",
            "--budget",
            "16",
        ];
        all.extend_from_slice(args);
        let out = kvbench(&all);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let theirs = plan(&[
        "--model",
        "Random:Tiny",
        "--policy",
        "R-KV,StreamingLLM",
        "--preset",
        "R1",
        "--weights",
        "Q8",
        "--dataset",
        "BuiltIn",
        "--budget-rule",
        "Seen",
        "--kv-type",
        "Q8_0",
        "--device",
        "CPU",
        "--policy-arg",
        "sinks=4",
    ]);
    let ours = plan(&[
        "--model",
        "random:tiny",
        "--policy",
        "rkv,streaming",
        "--preset",
        "r1",
        "--weights",
        "q8",
        "--dataset",
        "builtin",
        "--budget-rule",
        "seen",
        "--kv-type",
        "q8_0",
        "--device",
        "cpu",
        "--policy-arg",
        "sinks=4",
    ]);
    // The output directory is the same; so must every other line be.
    assert_eq!(theirs, ours);
    assert!(ours.contains("prompt r1, weights q8"), "{ours}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ids_and_text_from_a_data_file_cannot_drive_the_terminal() {
    let dir = temp("inject");
    let data = dir.join("evil.jsonl");
    std::fs::write(
        &data,
        "{\"id\":\"evil\\u001b[2J\\nrow\\u202e\",\"problem\":\"What is \\u001b]0;pwned\\u0007 1+1?\",\"answer\":\"2\\u001b[31m\"}\n",
    )
    .unwrap();
    let out = kvbench(&[
        "run",
        "--model",
        "random:tiny",
        "--data",
        data.to_str().unwrap(),
        "--max-new-tokens",
        "2",
        "--no-baseline",
        "--show-output",
        "--out",
        dir.join("r").to_str().unwrap(),
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    for raw in ['\u{1b}', '\u{7}', '\u{202e}'] {
        assert!(!text.contains(raw), "{raw:?} reached the terminal: {text}");
    }
    let row = text.lines().find(|l| l.contains("evil")).unwrap();
    assert!(row.contains("evil\\u{1b}[2J\\nrow\\u{202e}"), "{row}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_sweep_of_a_hundred_thousand_units_plans_in_seconds() {
    let dir = temp("plan");
    let data = dir.join("rows.jsonl");
    let rows: String = (0..100)
        .map(|i| format!("{{\"id\":\"p{i}\",\"problem\":\"What is {i}?\",\"answer\":\"{i}\"}}\n"))
        .collect();
    std::fs::write(&data, rows).unwrap();
    let budgets: Vec<String> = (0..1000).map(|i| (64 + i).to_string()).collect();
    let cfg = dir.join("big.toml");
    std::fs::write(
        &cfg,
        format!(
            "name = \"big\"\nmodel = \"random:tiny\"\ndata = \"{}\"\nbudgets = [{}]\n[[policy]]\nname = \"rkv\"\n",
            data.display(),
            budgets.join(", ")
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = ok(&kvbench(&["sweep", cfg.to_str().unwrap(), "--dry-run"]));
    assert!(out.contains("100000 work units"), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // Past the bound, refused before anything is allocated.
    let huge: Vec<String> = (0..20_000).map(|i| (64 + i).to_string()).collect();
    std::fs::write(
        &cfg,
        format!(
            "name = \"big\"\nmodel = \"random:tiny\"\ndata = \"{}\"\nsamples = 1000\nbudgets = [{}]\n[[policy]]\nname = \"rkv\"\n",
            data.display(),
            huge.join(", ")
        ),
    )
    .unwrap();
    let out = kvbench(&["sweep", cfg.to_str().unwrap(), "--dry-run"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the most one sweep plans"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_ends_other_commands_without_promising_a_resume() {
    let dir = temp("term-plain");
    let running = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args([
            "scaling",
            "--model",
            "random:tiny",
            "--lengths",
            "4000",
            "--threads",
            "1",
            "--out",
            dir.join("scaling").to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let err = terminate(running);
    assert!(
        err.contains("terminated (SIGTERM)") && !err.contains("resume") && !err.contains("unit"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C (SIGINT) and SIGHUP end a command as SIGTERM does (a line, exit code 128 + the signal),
/// and the temporary files it was writing go with it: an export stopped midway leaves no staging
/// directory beside its target (before, SIGINT killed the process where it stood and left
/// `.NAME.tmp-PID` until the next export to that target).
#[test]
fn an_interrupted_export_leaves_nothing_behind() {
    let dir = temp("interrupt");
    for (name, code, said) in [
        ("INT", 130, "interrupted (SIGINT)"),
        ("HUP", 129, "hung up (SIGHUP)"),
    ] {
        let target = dir.join("ckpt");
        let running = Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(["models", "--export", "random:qwen2.5-coder-0.5b"])
            .arg(&target)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while hidden_leftovers(&dir).is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no staging directory"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        let err = signal(running, name, code);
        assert!(err.contains(said) && !err.contains("resume"), "{err}");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "SIG{name} left {left:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `run --trace FILE` holds every unit of the policy, those an earlier run finished included (from
/// the results directory's traces), refuses units finished there untraced before anything runs,
/// and never replaces a file that is not a kvbench trace.
#[test]
fn a_run_trace_holds_every_unit_and_replaces_only_a_trace() {
    let dir = temp("trace");
    let run = |out: &str, trace: Option<&Path>| {
        let mut args = vec![
            "run",
            "--policy",
            "rkv",
            "--budget",
            "0.3",
            "--model",
            "random:tiny",
            "--limit",
            "2",
            "--max-new-tokens",
            "24",
            "--ignore-eos",
            "--threads",
            "1",
        ];
        let out = dir.join(out);
        args.extend(["--out", out.to_str().unwrap()]);
        if let Some(t) = trace {
            args.extend(["--trace", t.to_str().unwrap()]);
        }
        kvbench(&args)
    };
    // A user's file in the trace's place is kept, and nothing runs.
    let notes = dir.join("notes.txt");
    std::fs::write(&notes, "keep me\n").unwrap();
    let out = run("a", Some(&notes));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--trace") && err.contains("not a kvbench trace"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "keep me\n");
    assert!(!dir.join("a").exists(), "a results directory was made");

    // Both problems' sequences are in the file, and a rerun that reuses them writes it again.
    let trace = dir.join("trace.jsonl");
    ok(&run("a", Some(&trace)));
    let first = std::fs::read(&trace).unwrap();
    let lines = kvbench::results::trace::read_trace(&trace, 1 << 20).unwrap();
    let sequences: std::collections::BTreeSet<&str> =
        lines.iter().map(|l| l.sequence.as_str()).collect();
    assert_eq!(sequences.len(), 2, "{sequences:?}");
    // The report draws the first unit's trace; the other is kept apart for the file alone.
    let jsonl = |d: &Path| {
        std::fs::read_dir(d)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "jsonl")
            })
            .count()
    };
    let traces = dir.join("a").join("traces");
    assert_eq!((jsonl(&traces), jsonl(&traces.join("more"))), (1, 1));
    std::fs::write(&trace, "").unwrap();
    let again = ok(&run("a", Some(&trace)));
    assert!(again.contains("0 units run now"), "{again}");
    assert_eq!(std::fs::read(&trace).unwrap(), first);

    // Units finished without a trace cannot be in one: refused, the file not written.
    ok(&run("b", None));
    let untraced = dir.join("untraced.jsonl");
    let out = run("b", Some(&untraced));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without a trace"), "{err}");
    assert!(!untraced.exists());

    // A trace edited to an event past its sample's tokens (10^15 of them aborted the report
    // allocating the heat map's column) is refused by file and line before anything is written.
    let drawn = std::fs::read_dir(&traces)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .unwrap();
    let mut text = std::fs::read_to_string(&drawn).unwrap();
    let sequence = &lines[0].sequence;
    text.push_str(&format!(
        "{{\"sequence\":\"{sequence}\",\"generated\":1,\"seen\":1000000000000000,\"layer\":0,\"head\":0,\"kept\":[0]}}\n"
    ));
    std::fs::write(&drawn, text).unwrap();
    let report = dir.join("a").join("report");
    let out = kvbench(&["report", dir.join("a").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("{}:", drawn.display()))
            && err.contains("an event after 1000000000000000 tokens"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty() && !report.exists(),
        "written before the refusal"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
