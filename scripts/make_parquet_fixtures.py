"""Writes the small Parquet files that tests/datasets.rs reads.

They copy the layouts of the hub's AIME and AMC copies (see datasets/*.toml): pyarrow's default
writer (snappy pages), as Hugging Face `datasets` uses; integer ids, string or float answers, several
row groups. The problems are made up here. Run with pyarrow installed:

    python3 scripts/make_parquet_fixtures.py tests/data
"""

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # HuggingFaceH4/aime_2024's layout: id int64, problem, solution, answer (string), url, year.
    aime = pa.table(
        {
            "id": pa.array([60, 61, 62], pa.int64()),
            "problem": ["What is $2+3$?", "Find $x$ if $x^2 = 49$ and $x > 0$.", "Compute $\\frac{1}{2} + \\frac{1}{3}$."],
            "solution": ["$\\boxed{5}$", "$\\boxed{7}$", "$\\boxed{\\frac56}$"],
            "answer": ["005", "7", "\\frac{5}{6}"],
            "url": ["u1", "u2", "u3"],
            "year": ["2024", "2024", "2024"],
        }
    )
    pq.write_table(aime, out / "aime-layout.parquet", row_group_size=2)
    # The Qwen2.5-Math AMC layout: id int64, question, answer float64 (27.0 for 27).
    amc = pa.table(
        {
            "id": pa.array([0, 1, 2, 3], pa.int64()),
            "question": ["How many primes are below $10$?", "What is $-3+2$?", "Half of $5$?", "Twice $13.5$?"],
            "answer": pa.array([4.0, -1.0, 2.5, 27.0], pa.float64()),
        }
    )
    pq.write_table(amc, out / "amc-layout.parquet", row_group_size=3)
    # A row without an answer (null), to check the error names the row.
    bad = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "problem": ["What is $1+1$?", "What is $2+2$?"],
            "answer": pa.array(["2", None], pa.string()),
        }
    )
    pq.write_table(bad, out / "null-answer.parquet")
    # The compressions the hub's datasets use besides snappy, one file each (issue 43): the same rows,
    # two row groups.
    rows = pa.table(
        {
            "id": pa.array(["c1", "c2", "c3"], pa.string()),
            "problem": ["What is $3+4$?", "What is $10-1$?", "What is $6 \\times 7$?"],
            "answer": ["7", "9", "42"],
        }
    )
    for codec in ["zstd", "gzip", "brotli", "lz4"]:
        pq.write_table(rows, out / f"compressed-{codec}.parquet", compression=codec, row_group_size=2)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data"))
