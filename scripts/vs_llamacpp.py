#!/usr/bin/env python3
"""kvbench against llama.cpp on the same GGUF file, in one interleaved run.

For each model, ROUNDS times in turn: `kvbench perf` twice (prefill of 512 tokens, then decode at batch 1
of 128 tokens after a 64-token prompt; and decode of 64 tokens after 64-token prompts at batch 1, 8
and 32), llama.cpp's `llama-bench` (pp512; tg128 after 64 tokens of context, `-d 64`, the same work as
kvbench's batch-1 row, and from an empty context, its default) and `llama-batched-bench` (64-token
prompts, 64 new tokens, 1, 8 and 32 sequences). Each kvbench process does one llama.cpp tool's work, so
peak RSS compares like with like. Interleaving puts both engines under the same drift of this shared
machine; the ratio is taken round by round. After the rounds, `--pairs N` times, batch-1 decoding
alone in adjacent short processes of each engine (order swapped each pair): the like-with-like row for
batch 1, whose speed follows this machine's memory from one minute to the next. Prints, per measure,
the median and range of each engine and of the ratio, and each process's peak RSS (its own
accounting, from wait4). A benchmark, not a test.

usage: scripts/vs_llamacpp.py [--model NAME_OR_GGUF ...] [--rounds 3] [--threads 2] [--repeats 1]
                              [--pairs 6] [--deep TOKENS] [--llamacpp DIR] [--kvbench PATH]
--deep TOKENS adds, after the rounds, --pairs adjacent batch-1 pairs after TOKENS of context (llama-bench
`-d TOKENS`); with --rounds 0 only those.
--repeats N measures prefill and batch-1 decoding N times within each process of a round (kvbench
`--repeats N` after its warm-up, llama-bench `-r N`), and takes the median of each engine's N: on a
machine whose speed drifts within a process, one slow stretch then moves a round less.
llama.cpp's tools come from ../shared/tools/llamacpp.sh (default DIR ~/.cache/llamacpp-anchor).
Built-in model names are fetched by kvbench into its cache; the same file is given to llama.cpp.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Tokens of context before every decode measured: kvbench's `--decode-prompt-tokens`, llama-bench's `-d`
# (besides 0) and llama-batched-bench's `-npp`, so each pair of rows decodes at the same positions.
DECODE_CONTEXT = 64


def run_rss(cmd, timeout):
    """Runs cmd (no shell: arguments are a list); returns its stdout and its own peak RSS in MiB,
    from wait4. The child is killed after `timeout` seconds."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{text[-2000:]}")
    return text, usage.ru_maxrss / 1024.0


def gguf_path(model):
    p = pathlib.Path(model)
    if p.is_file():
        return p
    cache = pathlib.Path(os.environ.get("KVBENCH_CACHE", pathlib.Path.home() / ".cache" / "kvbench"))
    found = sorted((cache / "models" / model).glob("*.gguf"))
    if not found:
        sys.exit(f"{model}: not a file and not in kvbench's cache ({cache}/models)")
    return found[0]


def kvbench_perf(kvbench, model, threads, batches, decode_tokens, repeats=1, prompt_tokens=512,
                 context=DECODE_CONTEXT):
    """One `kvbench perf` process: its rows keyed as llama.cpp's (each the median of its `repeats`),
    and its peak RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "perf.json"
        _, rss = run_rss(
            [kvbench, "perf", "--model", model, "--threads", str(threads),
             "--prompt-tokens", str(prompt_tokens),
             "--batch", batches, "--decode-prompt-tokens", str(context),
             "--decode-tokens", str(decode_tokens), "--warmup", "1", "--repeats", str(repeats),
             "--no-bandwidth", "--export-json", str(out)],
            1800,
        )
        doc = json.loads(out.read_text())
    got = {}
    for row in doc["rows"]:
        m = row["measurement"]
        key = "pp512" if m["phase"] == "prefill" else f"decode b{m['batch']}"
        got[key] = row["tokens_per_s_median"]
    return got, rss


def kvbench_round(kvbench, model, threads, repeats):
    """Two processes, each doing one llama.cpp tool's work, so that peak memory compares like with
    like: batch 1 with 128 new tokens after DECODE_CONTEXT (llama-bench's pp512 + tg128; its decode is
    the row compared with tg128 at that depth), then batches 1, 8 and 32 of 64 new tokens after 64-token
    prompts (llama-batched-bench's)."""
    single, rss_single = kvbench_perf(kvbench, model, threads, "1", 128, repeats)
    got, rss_batched = kvbench_perf(kvbench, model, threads, "1,8,32", 64)
    got["decode b1 (128)"] = single["decode b1"]
    return got, rss_single, rss_batched


def llama_bench(tools, path, threads, repeats, prompt, depths):
    """One llama-bench process (pp`prompt` unless 0; tg128 at each depth): its rows keyed as
    kvbench's, and its peak RSS."""
    text, rss = run_rss(
        [tools / "llama-bench", "-m", path, "-t", str(threads), "-p", str(prompt), "-n", "128",
         "-d", ",".join(map(str, depths)), "-r", str(repeats), "-o", "json"],
        1800,
    )
    got = {}
    for row in json.loads(text):
        # The median of its repetitions, as kvbench's rows are (its mean where the samples are absent).
        rate = statistics.median(row.get("samples_ts") or [row["avg_ts"]])
        depth = row.get("n_depth", 0)
        if row["n_prompt"] and not row["n_gen"] and depth == 0:
            got["pp512"] = rate
        elif row["n_gen"] and not row["n_prompt"]:
            got["tg128" if depth == 0 else f"tg128 d{depth}"] = rate
    return got, rss


def llama_round(tools, path, threads, repeats):
    got, rss_bench = llama_bench(tools, path, threads, repeats, 512, [0, DECODE_CONTEXT])
    text, rss_batched = run_rss(
        [tools / "llama-batched-bench", "-m", path, "-t", str(threads), "-c", "8192",
         "-npp", str(DECODE_CONTEXT), "-ntg", "64", "-npl", "1,8,32"],
        1800,
    )
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if (len(cells) >= 8 and cells[0] == str(DECODE_CONTEXT) and cells[1] == "64"
                and cells[2].isdigit()):
            got[f"decode b{cells[2]}"] = float(cells[7])  # S_TG t/s
    return got, rss_bench, rss_batched


def batch1_pairs(kvbench, tools, model, path, threads, pairs, context=DECODE_CONTEXT):
    """Batch-1 decoding alone, kvbench and llama-bench in adjacent short processes (128 tokens after
    `context` tokens, one measurement each after a warm-up), the order swapped every pair. This machine's
    memory bandwidth jumps between two levels (about 34 and 57 GB/s read by two threads, measured
    2026-11-26) within a minute; at batch 1 both engines follow it, so a ratio is only like with like
    when its two runs are seconds apart. Returns the two engines' rates and the ratio of each pair."""
    kv, ll = [], []
    for i in range(pairs):
        for engine in ("kvbench", "llama") if i % 2 == 0 else ("llama", "kvbench"):
            if engine == "kvbench":
                got, _ = kvbench_perf(kvbench, model, threads, "1", 128, 1, prompt_tokens=16,
                                      context=context)
                kv.append(got["decode b1"])
            else:
                got, _ = llama_bench(tools, path, threads, 1, 0, [context])
                ll.append(got[f"tg128 d{context}"])
    return kv, ll, [x / y for x, y in zip(kv, ll)]


def spread(values):
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="built-in name or GGUF path (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1,
                    help="measurements of prefill and batch-1 decoding per process (median taken)")
    ap.add_argument("--pairs", type=int, default=6,
                    help="adjacent batch-1 runs of each engine after the rounds (0: none)")
    ap.add_argument("--deep", type=int, default=0, metavar="TOKENS",
                    help="also --pairs adjacent batch-1 runs after this many tokens of context "
                         "(llama-bench -d TOKENS): decoding where a reasoning model's chain of thought is")
    ap.add_argument("--llamacpp", default=str(pathlib.Path.home() / ".cache" / "llamacpp-anchor"))
    ap.add_argument("--kvbench", default=str(ROOT / "target" / "release" / "kvbench"))
    a = ap.parse_args()
    if a.rounds < 0 or a.repeats < 1 or a.threads < 1 or a.pairs < 0 or a.deep < 0:
        ap.error("--repeats and --threads must be at least 1, --rounds, --pairs and --deep at least 0")
    if a.rounds == 0 and not (a.pairs and a.deep):
        ap.error("--rounds 0 measures only the --deep pairs: give --deep TOKENS and --pairs N")
    models = a.model or ["qwen2.5-coder-1.5b", "smollm2-135m"]
    tools = pathlib.Path(a.llamacpp) / "build" / "bin"
    if not (tools / "llama-batched-bench").exists():
        sys.exit(f"no llama.cpp tools in {tools}: run ../shared/tools/llamacpp.sh first")
    print(f"kvbench vs llama.cpp, {a.threads} threads, {a.rounds} interleaved rounds, {a.repeats} "
          "repeat(s) of prefill and batch 1 per process; "
          "medians (min–max) of tokens/s, ratio kvbench/llama.cpp per round")
    for model in models:
        kv, ll = {}, {}
        path = gguf_path(model) if a.rounds == 0 else None
        rss = {k: [] for k in ("kvbench, batch 1", "llama-bench", "kvbench, batches 1/8/32",
                               "llama-batched-bench")}
        for r in range(a.rounds):
            # The first round fetches a built-in model.
            got, r_single, r_kv = kvbench_round(a.kvbench, model, a.threads, a.repeats)
            path = gguf_path(model)
            got_ll, r_b, r_bb = llama_round(tools, path, a.threads, a.repeats)
            for k, v in got.items():
                kv.setdefault(k, []).append(v)
            for k, v in got_ll.items():
                ll.setdefault(k, []).append(v)
            rss["kvbench, batch 1"].append(r_single)
            rss["llama-bench"].append(r_b)
            rss["kvbench, batches 1/8/32"].append(r_kv)
            rss["llama-batched-bench"].append(r_bb)
            print(f"  {model}: round {r + 1} of {a.rounds} done", file=sys.stderr)
        b1 = (batch1_pairs(a.kvbench, tools, model, path, a.threads, a.pairs)
              if a.pairs and a.rounds else None)
        deep = (batch1_pairs(a.kvbench, tools, model, path, a.threads, a.pairs, a.deep)
                if a.pairs and a.deep else None)
        print(f"\n{model} ({path.name}, {path.stat().st_size / 2**20:.0f} MiB)\n")
        print("| measure | kvbench | llama.cpp | ratio | target |")
        print("|---|---:|---:|---:|---:|")
        pairs = [("prefill 512 tokens", "pp512", "pp512", "≥ 1.0"),
                 (f"decode batch 1, 128 tokens after {DECODE_CONTEXT} "
                  f"(vs llama-bench tg128 -d {DECODE_CONTEXT})",
                  "decode b1 (128)", f"tg128 d{DECODE_CONTEXT}", "≥ 1.0"),
                 ("decode batch 1, 128 tokens (vs tg128 from an empty context)",
                  "decode b1 (128)", "tg128", ""),
                 ("decode batch 1 (vs batched-bench)", "decode b1", "decode b1", ""),
                 ("decode batch 8, aggregate", "decode b8", "decode b8", "≥ 1.2"),
                 ("decode batch 32, aggregate", "decode b32", "decode b32", "≥ 1.2")]
        for label, k_kv, k_ll, target in pairs:
            if k_kv in kv and k_ll in ll:
                ratios = [x / y for x, y in zip(kv[k_kv], ll[k_ll])]
                print(f"| {label} | {spread(kv[k_kv])} | {spread(ll[k_ll])} | "
                      f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | {target} |")
        for context, got in ((DECODE_CONTEXT, b1), (a.deep, deep)):
            if got:
                kv1, ll1, ratios = got
                print(f"| decode batch 1, 128 tokens after {context}, {len(ratios)} adjacent pairs "
                      f"(vs llama-bench tg128 -d {context}) | {spread(kv1)} | {spread(ll1)} | "
                      f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | ≥ 1.0 |")
        print()
        if not a.rounds:
            continue
        for name, values in rss.items():
            print(f"peak RSS {name}: {spread(values)} MiB")
        for ours, theirs in (("kvbench, batch 1", "llama-bench"),
                             ("kvbench, batches 1/8/32", "llama-batched-bench")):
            ratios = [x / y for x, y in zip(rss[ours], rss[theirs])]
            print(f"peak RSS ratio {ours} / {theirs}: {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}–{max(ratios):.2f}); target ≤ 1.2")


if __name__ == "__main__":
    main()
