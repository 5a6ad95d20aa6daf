//! The `kvbench` binary: parse the command line, run it, map errors to exit codes
//! (0 success, 1 some work failed, 2 usage or input error).

use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    match cli::run() {
        Ok(code) => code,
        Err(err) => {
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
