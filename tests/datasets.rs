//! Problem files in the hub's layouts: Parquet as `datasets` writes it (the fixtures in `tests/data`,
//! made by `scripts/make_parquet_fixtures.py`), and the built-in names resolved through a Hugging Face
//! cache laid out as hf-hub leaves it, with no network.
//!
//! One test per process state: the hub test sets `HF_HOME` and `KVBENCH_CACHE`, so it is the only test
//! in this file that resolves a built-in name.

use kvbench::eval::dataset::{self, Fields};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("data")
        .join(name)
}

#[test]
fn parquet_rows_keep_their_fields_across_row_groups() {
    let aime = dataset::load(&fixture("aime-layout.parquet"), &Fields::default()).unwrap();
    let got: Vec<(&str, &str)> = aime
        .iter()
        .map(|p| (p.id.as_str(), p.answer.as_str()))
        .collect();
    assert_eq!(got, [("60", "005"), ("61", "7"), ("62", "\\frac{5}{6}")]);
    assert_eq!(aime[1].problem, "Find $x$ if $x^2 = 49$ and $x > 0$.");

    let amc_fields = Fields {
        problem: "question".into(),
        ..Fields::default()
    };
    let amc = dataset::load(&fixture("amc-layout.parquet"), &amc_fields).unwrap();
    let answers: Vec<&str> = amc.iter().map(|p| p.answer.as_str()).collect();
    assert_eq!(answers, ["4", "-1", "2.5", "27"], "float answers as text");
    assert_eq!(amc[3].problem, "Twice $13.5$?");
    assert_eq!(amc.len(), 4, "rows of both row groups");

    let err = dataset::load(&fixture("amc-layout.parquet"), &Fields::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("amc-layout.parquet: row 1: no 'problem' (problem) field"),
        "{err}"
    );
    let err = dataset::load(&fixture("null-answer.parquet"), &Fields::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("null-answer.parquet: row 2: no 'answer' (answer) field"),
        "{err}"
    );
}

/// The compressions the hub's datasets use (zstd, gzip, brotli, lz4; snappy above) all read
/// (issue 43: zstd and gzip were refused as "Disabled feature at compile time").
#[test]
fn parquet_files_of_every_common_compression_read() {
    for codec in ["zstd", "gzip", "brotli", "lz4"] {
        let file = fixture(&format!("compressed-{codec}.parquet"));
        let ps =
            dataset::load(&file, &Fields::default()).unwrap_or_else(|e| panic!("{codec}: {e}"));
        let got: Vec<(&str, &str)> = ps
            .iter()
            .map(|p| (p.id.as_str(), p.answer.as_str()))
            .collect();
        assert_eq!(got, [("c1", "7"), ("c2", "9"), ("c3", "42")], "{codec}");
    }
}

/// Only the rows a selection needs are read: with `--limit` the rest of the file is counted and
/// hashed but not parsed (a damaged tail does not matter), and with `--ids` only those rows are kept.
#[test]
fn a_limited_read_stops_parsing_at_the_limit_and_hashes_the_whole_file() {
    use kvbench::eval::rows::{read, Want};
    let dir = std::env::temp_dir().join(format!("kvbench-want-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.jsonl");
    let mut text: String = (0..1000)
        .map(|i| format!("{{\"id\": \"p{i}\", \"problem\": \"What is {i}?\", \"answer\": {i}}}\n"))
        .collect();
    text.push_str("not json at all\n");
    std::fs::write(&path, &text).unwrap();
    let r = read(&path, &Fields::default(), &Want::First(2)).unwrap();
    assert_eq!(r.problems.len(), 2);
    assert_eq!(r.rows, 1001, "every line counted");
    assert_eq!(
        r.sha256,
        kvbench::loading::verify::sha256_file(&path).unwrap()
    );
    let ids: std::collections::HashSet<String> = ["p7".to_string(), "p3".to_string()].into();
    let r = read(&path, &Fields::default(), &Want::Ids(ids)).unwrap();
    let got: Vec<&str> = r.problems.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(got, ["p3", "p7"], "file order");
    // Reading everything still finds the damaged line, by number.
    let e = read(&path, &Fields::default(), &Want::All)
        .unwrap_err()
        .to_string();
    assert!(e.contains(".jsonl:1001: "), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Lays out `bytes` as hf-hub caches a dataset file: `datasets--owner--name/blobs/<sha256>`, a
/// snapshot that links to it, and `refs/main` naming the snapshot.
fn cache_dataset_file(hf_home: &Path, repo: &str, file: &str, bytes: &[u8]) -> PathBuf {
    use sha2::{Digest, Sha256};
    let root = hf_home
        .join("hub")
        .join(format!("datasets--{}", repo.replace('/', "--")));
    let sha: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let blob = root.join("blobs").join(&sha);
    std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
    std::fs::write(&blob, bytes).unwrap();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let link = root.join("snapshots").join(commit).join(file);
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&blob, &link).unwrap();
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs").join("main"), commit).unwrap();
    blob
}

#[test]
fn built_in_names_resolve_through_the_hub_cache_in_the_manifest_layout() {
    let home = std::env::temp_dir().join(format!("kvbench-hfhome-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::env::set_var("HF_HOME", &home);
    std::env::set_var("KVBENCH_CACHE", home.join("kvbench"));
    // aime24 and amc23 come from Parquet files, aime25 from JSON Lines, each with its manifest's fields.
    let m = dataset::manifest("aime24").unwrap();
    let h = m.hub.as_ref().unwrap();
    let aime = std::fs::read(fixture("aime-layout.parquet")).unwrap();
    cache_dataset_file(&home, &h.repo, &h.file, &aime);
    let d = dataset::resolve("aime24", None, &Fields::default(), &dataset::Want::All).unwrap();
    assert_eq!(d.problems.len(), 3);
    assert_eq!(d.problems[0].id, "60");
    assert_eq!(
        d.warnings.len(),
        1,
        "a row-count warning only, no hash warning for the hub's layout: {:?}",
        d.warnings
    );
    assert!(d.warnings[0].contains("3 rows, the aime24 manifest expects 30"));

    let h = dataset::manifest("amc23").unwrap().hub.unwrap();
    let amc = std::fs::read(fixture("amc-layout.parquet")).unwrap();
    cache_dataset_file(&home, &h.repo, &h.file, &amc);
    let d = dataset::resolve("amc23", None, &Fields::default(), &dataset::Want::All).unwrap();
    assert_eq!(d.problems[3].answer, "27");

    let h = dataset::manifest("aime25").unwrap().hub.unwrap();
    let rows = "{\"id\": 1, \"problem\": \"What is $1+1$?\", \"answer\": \"2\"}\n{\"problem\": \"What is $3 \\\\cdot 3$?\", \"answer\": 9}\n";
    cache_dataset_file(&home, &h.repo, &h.file, rows.as_bytes());
    let d = dataset::resolve("aime25", None, &Fields::default(), &dataset::Want::All).unwrap();
    let got: Vec<(&str, &str)> = d
        .problems
        .iter()
        .map(|p| (p.id.as_str(), p.answer.as_str()))
        .collect();
    assert_eq!(got, [("1", "2"), ("line-2", "9")]);

    // A cached blob whose content does not match its name is refused, naming the file.
    let blob = cache_dataset_file(&home, &h.repo, &h.file, rows.as_bytes());
    std::fs::write(&blob, "{\"problem\": \"tampered\", \"answer\": 1}\n").unwrap();
    let err = dataset::resolve("aime25", None, &Fields::default(), &dataset::Want::All)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("test.jsonl") && err.contains("sha256"),
        "{err}"
    );
    std::fs::remove_dir_all(&home).unwrap();
}
