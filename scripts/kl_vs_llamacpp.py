#!/usr/bin/env python3
"""KL divergence of quantized KV caches, kvbench against llama.cpp's own perplexity tool, on the same
GGUF file and the same text (issue 42).

llama.cpp's `llama-perplexity` splits a text into chunks of --ctx tokens, runs each as one batch and
scores the second half of each chunk; with `--kl-divergence-base` it saves the logits of a reference
run (here its default f16 cache) and with `--kl-divergence` reports the mean KL divergence of another
run (`-ctk q8_0 -ctv q8_0`, ...) from them. This script does the same with kvbench: the same token
ids (from `llama-tokenize`, so both read identical tokens), each chunk prefilled in one pass by
`kvbench forward --token-file` with `--kv-type f16` (the reference) and each quantized type, and the
mean KL over the same positions. Both engines quantize keys and values as they enter the cache and
attend over the stored entries, so the two KLs measure the same thing with two implementations.

Needs: numpy; llama.cpp's llama-tokenize and llama-perplexity (../shared/tools/llamacpp.sh builds the
tools; `ninja -C DIR/build llama-perplexity llama-tokenize` adds these two); a kvbench binary.

  python3 scripts/kl_vs_llamacpp.py --gguf MODEL.gguf --llamacpp ~/.cache/llamacpp-anchor/build/bin \
      --text ../shared/datasets/math500.jsonl --chunks 4
"""

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def text_of(path, max_chars):
    """Plain text: a .jsonl file's problems (and solutions or answers) one after another, else the file."""
    p = Path(path)
    if p.suffix == ".jsonl":
        parts = []
        for line in p.read_text().splitlines():
            row = json.loads(line)
            parts.append(row.get("problem", ""))
            parts.append(row.get("solution", row.get("answer", "")))
            if sum(map(len, parts)) > max_chars:
                break
        return "\n\n".join(parts)
    return p.read_text()[:max_chars]


def tokenize(bin_dir, gguf, text_file):
    out = subprocess.run(
        [str(Path(bin_dir) / "llama-tokenize"), "-m", gguf, "-f", text_file, "--ids", "--log-disable"],
        capture_output=True, text=True, check=True,
    ).stdout
    ids = re.search(r"\[([0-9, ]+)\]", out)
    if not ids:
        sys.exit(f"llama-tokenize printed no ids: {out[-500:]}")
    return [int(x) for x in ids.group(1).split(",")]


def llama_kld(bin_dir, gguf, text_file, ctx, chunks, kv, base, threads):
    """Mean KLD llama-perplexity reports for cache type `kv` against the saved f16 base."""
    cmd = [str(Path(bin_dir) / "llama-perplexity"), "-m", gguf, "-f", text_file, "-c", str(ctx),
           "--chunks", str(chunks), "-t", str(threads), "-fa", "on", "-ctk", kv, "-ctv", kv]
    if kv == "f16":
        cmd += ["--kl-divergence-base", base]
    else:
        cmd += ["--kl-divergence-base", base, "--kl-divergence"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {p.stderr[-2000:]}")
    if kv == "f16":
        return None
    text = p.stdout + p.stderr
    m = re.search(r"Mean\s+KLD:\s+([0-9.eE+-]+)", text)
    top = re.search(r"Same top p:\s+([0-9.]+)", text)
    if not m:
        sys.exit(f"no 'Mean KLD' in llama-perplexity's output: {text[-1500:]}")
    return {"mean_kld": float(m.group(1)), "same_top_percent": float(top.group(1)) if top else None}


def read_logits(path):
    """The `logits` tensor of a safetensors file kvbench wrote ([tokens, vocab] f32)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        meta = header["logits"]
        start, end = meta["data_offsets"]
        f.seek(8 + n + start)
        data = np.frombuffer(f.read(end - start), dtype="<f4")
    return data.reshape(meta["shape"])


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--llamacpp", required=True, help="folder of llama-tokenize and llama-perplexity")
    ap.add_argument("--kvbench", default="target/release/kvbench")
    ap.add_argument("--text", required=True, help="a text file, or a .jsonl of problems")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--types", default="q8_0,q4_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="kl-vs-llamacpp-") as tmp:
        tmp = Path(tmp)
        text_file = tmp / "text.txt"
        text_file.write_text(text_of(args.text, 8 * args.ctx * args.chunks))
        ids = tokenize(args.llamacpp, args.gguf, str(text_file))
        if len(ids) < args.ctx * args.chunks:
            sys.exit(f"the text has {len(ids)} tokens; {args.ctx * args.chunks} are needed")
        base = str(tmp / "base.kld")
        types = args.types.split(",")
        llama_kld(args.llamacpp, args.gguf, str(text_file), args.ctx, args.chunks, "f16", base, args.threads)
        llama = {kv: llama_kld(args.llamacpp, args.gguf, str(text_file), args.ctx, args.chunks, kv, base,
                               args.threads) for kv in types}

        first = args.ctx // 2  # llama-perplexity scores the second half of each chunk
        kls = {kv: [] for kv in types}
        same_top = {kv: [] for kv in types}
        for c in range(args.chunks):
            chunk = tmp / "chunk.json"
            chunk.write_text(json.dumps(ids[c * args.ctx:(c + 1) * args.ctx]))
            logp = {}
            for kv in ["f16", *types]:
                path = tmp / f"logits-{kv}.safetensors"
                subprocess.run([args.kvbench, "forward", "--model", args.gguf, "--token-file", str(chunk),
                                "--kv-type", kv, "--threads", str(args.threads), "--logits", str(path),
                                "--json", str(tmp / "fwd.json")], check=True)
                logp[kv] = log_softmax(read_logits(path)[first:])
                path.unlink()
            p_ref = np.exp(logp["f16"])
            for kv in types:
                kls[kv].extend((p_ref * (logp["f16"] - logp[kv])).sum(axis=-1).tolist())
                same_top[kv].extend((logp["f16"].argmax(-1) == logp[kv].argmax(-1)).tolist())
            print(f"chunk {c + 1}/{args.chunks} done", file=sys.stderr, flush=True)

    result = {
        "gguf": os.path.basename(args.gguf),
        "ctx": args.ctx,
        "chunks": args.chunks,
        "positions_scored": len(next(iter(kls.values()))),
        "reference": "f16 cache (llama.cpp's default)",
        "types": {
            kv: {
                "kvbench_mean_kld": float(np.mean(kls[kv])),
                "kvbench_same_top_percent": 100.0 * float(np.mean(same_top[kv])),
                "llamacpp_mean_kld": llama[kv]["mean_kld"],
                "llamacpp_same_top_percent": llama[kv]["same_top_percent"],
            }
            for kv in types
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
