//! The `kvbench` binary: parse the command line, run it, map errors to exit codes
//! (0 success, 1 some work failed, 2 usage or input error).

use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    tune_malloc();
    process_edges::install();
    // Read deep inside the kernels, so checked here, before any command runs.
    let env = [
        kvbench::kernels::dispatch::path_from_env().map(|_| ()),
        kvbench::kernels::dispatch::prefetch_from_env().map(|_| ()),
        kvbench::switches::check_all(),
    ];
    if let Some(Err(e)) = env.into_iter().find(Result::is_err) {
        kvbench::say!("error: {e}");
        return ExitCode::from(2);
    }
    match cli::run() {
        Ok(code) => code,
        Err(err) => {
            // A closed pipe (`kvbench grade … | head`) is the reader's choice, not a failure.
            let broken_pipe = err.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            });
            if broken_pipe {
                return ExitCode::SUCCESS;
            }
            kvbench::say!(
                "error: {}",
                kvbench::error::terminal_safe(&format!("{err:#}"))
            );
            let input = err.chain().any(|c| {
                c.downcast_ref::<kvbench::Error>()
                    .is_some_and(kvbench::Error::is_input_error)
                    || c.downcast_ref::<cli::UsageError>().is_some()
            });
            ExitCode::from(if input { 2 } else { 1 })
        }
    }
}

/// The edges of the process: what happens when standard output cannot be written, or a signal ends
/// the run.
mod process_edges {
    /// Installs the handlers below, before anything runs.
    pub fn install() {
        quiet_stdout_failures();
        signals();
    }

    /// `println!` panics when standard output fails (`> /dev/full`, a closed descriptor): the
    /// panic is turned into one line and exit code 1. A closed pipe (`kvbench grade … | head`) is the
    /// reader's choice: exit 0, as before. Every other panic keeps the default report.
    fn quiet_stdout_failures() {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            if let Some(why) = msg.strip_prefix("failed printing to stdout: ") {
                if why.contains("Broken pipe") {
                    std::process::exit(0);
                }
                kvbench::say!("error: cannot write to standard output: {why}");
                std::process::exit(1);
            }
            default(info);
        }));
    }

    /// SIGXFSZ (a file-size limit, `ulimit -f`) would kill the process silently: it is ignored, so
    /// the write fails with an error that names the file and the run ends with a message. SIGTERM,
    /// SIGINT (Ctrl-C) and SIGHUP end the process with a line (for `run` and `sweep`, what is kept:
    /// results are written a unit at a time and synced, so the directory resumes where it stopped),
    /// and exit code 128 + the signal's number, after removing the temporary files the process was
    /// writing ([`kvbench::temps`]): a stopped run leaves no hidden half-written files.
    ///
    /// The three signals are blocked here, in the main thread before any other thread exists, so
    /// every thread started later blocks them too; one thread of their own takes them with
    /// `sigwait` and does that work as ordinary code, where a handler could do only what is
    /// async-signal-safe (no directory walk, no lock). Child processes (pip) start with no signal
    /// blocked: the standard library clears the mask before `exec`.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn signals() {
        let command = std::env::args_os()
            .skip(1)
            .find(|a| !a.to_string_lossy().starts_with('-'));
        let resumable = command.is_some_and(|c| c == "run" || c == "sweep");
        // SAFETY: a sigset_t is plain data, initialised by sigemptyset before use; the mask is set
        // before any other thread exists.
        let set = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::sigaddset(&mut set, sig);
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            set
        };
        let waiter = std::thread::Builder::new()
            .name("kvbench-signals".into())
            .spawn(move || loop {
                let mut sig: libc::c_int = 0;
                // SAFETY: `set` is an initialised signal set; `sig` a valid place for the result.
                if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                    continue;
                }
                kvbench::temps::remove_all();
                let name = match sig {
                    libc::SIGINT => "interrupted (SIGINT)",
                    libc::SIGHUP => "hung up (SIGHUP)",
                    _ => "terminated (SIGTERM)",
                };
                let kept = match resumable {
                    true => "; every finished unit is kept: rerun the same command to resume",
                    false => "",
                };
                let msg = format!("\nkvbench: {name}{kept}\n");
                // SAFETY: write(2) of an owned buffer, then _exit(2), which ends every thread at once
                // (the others may be mid-write; what is complete on disk stays).
                unsafe {
                    libc::write(2, msg.as_ptr().cast(), msg.len());
                    libc::_exit(128 + sig);
                }
            });
        if waiter.is_err() {
            // No thread, no taking of signals: leave them to their default action.
            // SAFETY: restores the mask set above, in the main thread.
            unsafe {
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            }
        }
    }

    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    fn signals() {}
}

/// glibc's allocator, set for a process that allocates tensors of megabytes many times a second.
///
/// - Arenas: glibc gives threads that allocate at the same time heaps of their own (up to eight per
///   core) and keeps what is freed in each for reuse there. The forward pass runs on rayon's threads,
///   so every thread ends up holding its own high-water mark of tensors: with `perf --batch 1,8,32` on
///   SmolLM2 the process peaked at 410 MB with the default, at 317 MB with one arena, and at 323 to
///   353 MB with two, at no measurable cost in speed: kvbench allocates per tensor, not in its inner
///   loops.
/// - Large blocks: by default a block above a threshold (128 KiB, raised on the fly up to 32 MiB) is
///   its own mapping, returned to the OS when freed, and the heap's top is given back past twice that.
///   Every prefill layer's activations and attention scores (a few MiB each) then came as fresh pages
///   that the kernel zeroed one fault at a time: 5% of a 512-token prefill of SmolLM2 in page faults
///   and page clearing (perf). Blocks up to 32 MiB (glibc's largest threshold) now come from the heap,
///   and up to 256 MiB freed at its top are kept for the next layer: SmolLM2 prefill of 512 tokens
///   278–299 → 351–425 tokens/s (six rounds each, Zen 4), peak RSS 180–193 → 184–193 MiB.
/// - Blocks above 32 MiB: glibc cannot raise the threshold further, so they were still mappings of their
///   own, faulted in and zeroed page by page each time: Qwen2.5-Coder-1.5B's gate and up projections of a
///   512-token prefill are 36 MiB a layer. No block is a mapping of its own now (`M_MMAP_MAX` 0): all come
///   from the heap, whose top keeps up to 256 MiB freed. That prefill 94.0 / 99.0 / 96.5 → 102.4 / 103.5 /
///   102.0 tokens/s (alternated, a Xeon with AVX-512), peak RSS 1,250 → 1,248 MiB.
///
/// A user's `MALLOC_ARENA_MAX`, `MALLOC_MMAP_MAX_`, `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_` is
/// left to win.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_malloc() {
    let settings = [
        ("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, 1),
        ("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, 32 << 20),
        ("MALLOC_MMAP_MAX_", libc::M_MMAP_MAX, 0),
        ("MALLOC_TRIM_THRESHOLD_", libc::M_TRIM_THRESHOLD, 256 << 20),
    ];
    for (env, param, value) in settings {
        if std::env::var_os(env).is_none() {
            // SAFETY: `mallopt` only sets an allocator parameter; it runs before any other thread
            // exists.
            unsafe {
                libc::mallopt(param, value);
            }
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_malloc() {}
