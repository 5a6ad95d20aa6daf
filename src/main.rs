//! The `kvbench` binary: parse the command line, run it, map errors to exit codes
//! (0 success, 1 some work failed, 2 usage or input error).

use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
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
            eprintln!("error: {err:#}");
            let input = err.chain().any(|c| {
                c.downcast_ref::<kvbench::Error>()
                    .is_some_and(kvbench::Error::is_input_error)
                    || c.downcast_ref::<cli::UsageError>().is_some()
            });
            ExitCode::from(if input { 2 } else { 1 })
        }
    }
}
