//! `kvbench sweep --emit slurm`: a submit script for a Slurm job array, one array task per shard (at
//! most K at once) and a report job that starts when every task has ended. kvbench writes the script
//! and never runs it; paths are single-quoted for the shell that will.

use std::path::Path;

/// What the script runs.
pub struct SlurmJob<'a> {
    /// The sweep's name (job names).
    pub name: &'a str,
    /// kvbench itself, the config and the results directory, as absolute paths.
    pub kvbench: &'a Path,
    pub config: &'a Path,
    pub out: &'a Path,
    pub shards: u32,
    /// Array tasks running at once (`%K`).
    pub concurrency: u32,
    /// Run the full-cache units first, as their own array, and the policies' array after it
    /// succeeded (ratio budgets are resolved from the full run).
    pub full_first: bool,
    /// The sweep runs on a GPU: each array task asks for one (`--gres=gpu:1`) and runs on the one
    /// Slurm gives it (`--device cuda:0`: Slurm makes it the task's only visible GPU).
    pub gpu: bool,
}

/// Quotes a string for a POSIX shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The submit script, or why none can be written (a path Slurm's `#SBATCH` lines cannot hold).
pub fn script(job: &SlurmJob<'_>) -> Result<String, String> {
    let out = job.out.to_string_lossy();
    if out.chars().any(|c| c.is_whitespace() || c == '%') {
        return Err(format!(
            "{out}: a results directory for Slurm must not contain spaces or '%' (it is named in #SBATCH lines)"
        ));
    }
    let name: String = job
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let (n, k) = (job.shards, job.concurrency.max(1));
    let kvbench = quote(&job.kvbench.to_string_lossy());
    let config = quote(&job.config.to_string_lossy());
    let out_q = quote(&out);
    let array = |phase: &str, dependency: &str| {
        format!(
            r#"$(sbatch --parsable {dependency}<<'SLURM'
#!/usr/bin/env bash
#SBATCH --job-name=kvbench-{name}{suffix}
#SBATCH --array=1-{n}%{k}
#SBATCH --output={out}/slurm-%A_%a.out{gres}
set -euo pipefail
exec {kvbench} sweep {config} --out {out_q} --shard "${{SLURM_ARRAY_TASK_ID}}/{n}"{phase_flag}{device}
SLURM
)"#,
            gres = if job.gpu {
                "\n#SBATCH --gres=gpu:1"
            } else {
                ""
            },
            device = if job.gpu { " --device cuda:0" } else { "" },
            suffix = if phase.is_empty() {
                String::new()
            } else {
                format!("-{phase}")
            },
            phase_flag = if phase.is_empty() {
                String::new()
            } else {
                format!(" --phase {phase}")
            },
        )
    };
    let arrays = if job.full_first {
        format!(
            "full_job={}\narray_job={}",
            array("full", ""),
            array("policies", "--dependency=\"afterok:${full_job%%;*}\" ")
        )
    } else {
        format!("array_job={}", array("", ""))
    };
    Ok(format!(
        r#"#!/usr/bin/env bash
# kvbench sweep '{name}' on Slurm, written by kvbench {version}: {n} array tasks (one per shard, at most
# {k} at once), then a report job that runs when all of them have ended (afterany: a failed shard still
# gets its finished units reported, with the command that runs the missing ones).
# Submit with: bash THIS_FILE. Add #SBATCH lines (partition, time, CPUs, memory) to both jobs as your
# cluster needs. Shards take file locks in the results directory: it must be on a file system with
# working locks (local or NFSv4).
set -euo pipefail
# With ratio budgets, the full-cache units run first as their own array: the policies' array starts
# when it succeeded, since their budgets are resolved from the full run's mean generation length.
mkdir -p {out_q}
{arrays}
sbatch --dependency="afterany:${{array_job%%;*}}" <<'SLURM'
#!/usr/bin/env bash
#SBATCH --job-name=kvbench-{name}-report
#SBATCH --output={out}/slurm-report-%j.out
set -euo pipefail
exec {kvbench} report {out_q}
SLURM
echo "submitted array job $array_job ({n} shards) and its report job"
"#,
        version = env!("CARGO_PKG_VERSION"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_quotes_paths_and_names_every_shard() {
        let job = SlurmJob {
            name: "aime 24",
            kvbench: Path::new("/opt/kv bench/kvbench"),
            config: Path::new("/home/u/it's.toml"),
            out: Path::new("/scratch/results/aime"),
            shards: 16,
            concurrency: 4,
            full_first: false,
            gpu: false,
        };
        let s = script(&job).unwrap();
        assert!(s.contains("#SBATCH --array=1-16%4"));
        assert!(s.contains("--shard \"${SLURM_ARRAY_TASK_ID}/16\""));
        assert!(s.contains("'/opt/kv bench/kvbench' sweep '/home/u/it'\\''s.toml'"));
        assert!(s.contains("kvbench-aime_24-report"));
        assert!(s.contains("exec '/opt/kv bench/kvbench' report '/scratch/results/aime'"));
        let bad = SlurmJob {
            out: Path::new("/scratch/my results"),
            ..job
        };
        assert!(script(&bad).is_err());
        // Ratio budgets: the full array first, the policies' array after it succeeded.
        let s = script(&SlurmJob {
            full_first: true,
            ..job
        })
        .unwrap();
        let full = s.find("--phase full").unwrap();
        let policies = s.find("--phase policies").unwrap();
        assert!(full < policies);
        assert!(s.contains("--dependency=\"afterok:${full_job%%;*}\""));
        assert!(s.contains("afterany:${array_job%%;*}"));
        assert!(!s.contains("--gres"));
        // On GPUs: one per array task, the task's only visible one.
        let s = script(&SlurmJob { gpu: true, ..job }).unwrap();
        assert_eq!(s.matches("#SBATCH --gres=gpu:1").count(), 1);
        assert!(s.contains("/16\" --device cuda:0"));
    }
}
