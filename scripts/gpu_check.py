#!/usr/bin/env python3
"""kvbench's GPU checks in one prepared run (issue 39), for a machine with an H100 or H200, no network and
no Rust: a `cuda` build of kvbench (scripts/build_cuda.sh, carried there), PyTorch and transformers.

Writes OUT/gpu_check.json after every step, so a run cut short keeps what it measured:

1. env: the GPU, driver, library versions, and what the kvbench binary links.
2. cpu_vs_gpu: one random-weight model (same seed) on both devices, in f32: teacher-forced logits over 256
   tokens (max and mean absolute difference, top-1 agreement) and the greedy tokens of a batch of
   four prompts of different lengths decoded together under full, rkv, snapkv and h2o (first
   divergence per sequence).
3. vs_transformers: a random Qwen2 model at DeepSeek-R1-Distill-Qwen-1.5B's shapes, exported once as
   safetensors by kvbench and loaded by both kvbench and transformers (bf16, sdpa): teacher-forced
   logits over 256 tokens and the first greedy divergence; the logits again with both in f32, and
   with kvbench's activations in bf16 (`--activations weights`, as transformers keeps them).
4. speed_kvbench / speed_transformers / speed_compressed: R1-Distill-Qwen-7B shapes (random weights,
   bf16): prefill of 1,024 tokens; decoding after a 1,024-token prompt at batch 1, 8 and 32 (full),
   and at batch 8 with per-sequence attention (the engine before pooled attention);
   device memory; transformers' generate at the same shapes and batches (and its model's own decoding
   step in a plain loop); rkv, snapkv and h2o at B = 1,024 at batch 32 beside full (h2o also with its
   calls after every layer); batch 1 with a bf16 and an f32
   cache, and with bf16 activations at batch 1 and 32 (`speed_batch1`, not in the default steps; each decode
   row's bytes read per second as a share of the device's measured copy bandwidth).
5. long_outputs: full against rkv at B = 1,024 over 8K-token outputs, each at the largest batch whose
   KV cache fits the GPU: both measured at an 8K-token context, then the full cache at the midpoints of
   the output's quarters, and the throughput over the whole output estimated from those rates.
6. speed_sparse (not in the default steps): RocketKV at B = 256 after the speed steps' 1,024-token prompt
   (so that it selects its entries every step) at batch 1 and the largest speed batch, its batch attending
   through the pool and, in a second run, one sequence at a time, beside the full cache.

7. prefill_batch (not in the default steps): `run`'s prefill of the built-in problems at the speed shapes,
   several sequences a pass against one a pass (`KVBENCH_PREFILL_EACH`).

`--activations weights` runs speed_compressed, long_outputs and prefill_batch with kvbench's activations in bf16 (the
default, f32, converts a bf16 cache to f32 at every layer, which costs the full cache more than R-KV's).

Each step has a time allowance; what would run past the deadline is recorded as skipped. Scratch
files (logits, exported weights) go to a scratch folder, never to OUT (its files travel back).

`--quick` shrinks every shape and length for a dry run on a CPU machine (`--device cpu`): the same
code paths, in a minute or two.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

STARTED = time.time()


def now():
    return time.time() - STARTED


class Check:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(args.scratch)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.results = {
            "device": args.device,
            "quick": args.quick,
            "deadline_s": args.deadline,
            "steps": {},
        }

    def save(self):
        path = self.out / "gpu_check.json"
        tmp = path.with_suffix(".partial")
        tmp.write_text(json.dumps(self.results, indent=2, default=str))
        tmp.replace(path)

    def kv(self, *argv, timeout=None, check=True, env=None):
        """Runs kvbench (with `env` added to the environment); returns its standard output."""
        cmd = [self.args.kvbench, *map(str, argv)]
        left = self.args.deadline - now()
        timeout = min(timeout or left, max(left, 1))
        t = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **(env or {})})
        log = self.results.setdefault("commands", [])
        shown = " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), *cmd])
        log.append({"cmd": shown, "rc": p.returncode, "secs": round(time.time() - t, 1)})
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-2000:]}")
        return p.stdout

    def step(self, name, allowance, fn):
        """Runs one step if `allowance` seconds are left before the deadline."""
        left = self.args.deadline - now()
        if left < allowance:
            self.results["steps"][name] = {"skipped": f"{left:.0f} s left, the step needs about {allowance}"}
            self.save()
            return
        t = time.time()
        try:
            self.results["steps"][name] = fn()
        except Exception as e:  # record and go on: later steps are independent
            self.results["steps"][name] = {"error": f"{type(e).__name__}: {e}"[-3000:]}
        self.results["steps"][name]["secs"] = round(time.time() - t, 1)
        print(f"[{now():6.0f} s] {name}: {json.dumps(self.results['steps'][name])[:400]}", flush=True)
        self.save()


def read_f32_logits(path):
    """The `logits` tensor of a safetensors file kvbench wrote (f32, [positions, vocab]) as (rows,
    columns, values), in plain Python: for a dry run on a machine without PyTorch."""
    import array
    import struct

    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    meta = json.loads(raw[8:8 + n])["logits"]
    if meta["dtype"] != "F32" or len(meta["shape"]) != 2:
        raise ValueError(f"{path}: logits {meta['dtype']} {meta['shape']}, expected F32 [positions, vocab]")
    start, end = meta["data_offsets"]
    values = array.array("f")
    values.frombytes(raw[8 + n + start:8 + n + end])
    return meta["shape"][0], meta["shape"][1], values


def compare_plain(a_path, b_path):
    """`compare_logits` of two files without PyTorch (the same figures; the spread is the population
    standard deviation where torch's is the sample one, a difference of one part in the count)."""
    rows, cols, a = read_f32_logits(a_path)
    rows_b, cols_b, b = read_f32_logits(b_path)
    if (rows, cols) != (rows_b, cols_b):
        raise ValueError(f"logits of shapes {rows}x{cols} and {rows_b}x{cols_b}")
    diffs = [abs(x - y) for x, y in zip(a, b)]
    argmax = lambda v, r: max(range(cols), key=lambda j: v[r * cols + j])  # noqa: E731
    tops = [(argmax(a, r), argmax(b, r)) for r in range(rows)]
    mean = sum(a) / len(a)
    return {
        "positions": rows,
        "vocab": cols,
        "max_abs_diff": max(diffs),
        "mean_abs_diff": sum(diffs) / len(diffs),
        "logit_std": (sum((x - mean) ** 2 for x in a) / len(a)) ** 0.5,
        "top1_agreement": sum(x == y for x, y in tops) / rows,
        "first_top1_disagreement": next((i for i, (x, y) in enumerate(tops) if x != y), None),
    }


def compare_logits(a_path, b_path):
    """Max and mean absolute difference of two `logits` tensors, their scale, top-1 agreement."""
    try:
        import torch
        from safetensors.torch import load_file
    except ImportError:
        if isinstance(b_path, (str, Path)):
            return compare_plain(a_path, b_path)
        raise

    a = load_file(str(a_path))["logits"].float()
    b = load_file(str(b_path))["logits"].float() if isinstance(b_path, (str, Path)) else b_path.float().cpu()
    diff = (a - b).abs()
    top1 = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    return {
        "positions": a.shape[0],
        "vocab": a.shape[1],
        "max_abs_diff": diff.max().item(),
        "mean_abs_diff": diff.mean().item(),
        "logit_std": a.std().item(),
        "top1_agreement": top1,
        "first_top1_disagreement": next(
            (i for i, (x, y) in enumerate(zip(a.argmax(-1).tolist(), b.argmax(-1).tolist())) if x != y), None
        ),
    }


def first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def env(c):
    info = {"python": sys.version.split()[0]}
    try:
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip()
    except Exception as e:
        info["nvidia_smi"] = f"unavailable: {e}"
    for mod in ["torch", "transformers", "safetensors"]:
        try:
            info[mod] = __import__(mod).__version__
        except Exception as e:
            info[mod] = f"missing: {e}"
    info["kvbench"] = c.kv("--version").strip()
    info["kvbench_binary"] = c.args.kvbench
    # The CUDA libraries the binary needs at start-up (none for scripts/build_cuda.sh's, which loads
    # them when it opens the GPU; its -linked twin needs them).
    try:
        info["needed_cuda_libraries"] = [
            l.split()[-1] for l in subprocess.run(["objdump", "-p", c.args.kvbench], capture_output=True,
                                                  text=True).stdout.splitlines()
            if "NEEDED" in l and re.search(r"libcu|libnv", l)]
    except OSError as e:
        info["needed_cuda_libraries"] = f"unknown: {e}"
    ldd = subprocess.run(["ldd", c.args.kvbench], capture_output=True, text=True).stdout
    info["missing_libraries"] = [l.strip() for l in ldd.splitlines() if "not found" in l]
    info["cpu"] = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo"], capture_output=True, text=True).stdout.strip()
    return info


def cpu_vs_gpu(c):
    """The device path's correctness: both devices compute in f32 (`--weights f32`: the random
    model's bf16 values held as f32, so the same numbers), where only the order of operations differs.
    A random model's logits are nearly tied (their spread is about 0.6), so bf16 arithmetic on one side
    alone would change many argmaxes without any fault: that comparison is reported beside it
    (`gpu_bf16_vs_cpu_f32`), not judged."""
    q = c.args.quick
    # SmolLM2's shapes (Llama architecture, 30 layers): the CPU side's f32 decoding stays fast there
    # (the 0.5B Qwen2 took 20 s a greedy run on the H100 machine's CPU), and the transformers step
    # checks the Qwen2 architecture.
    model = "random:tiny" if q else "random:smollm2-135m"
    threads = str(min(os.cpu_count() or 1, 16))
    # f32 weights and an f32 cache on both (kvbench 0.5 defaults to f16 caches on the CPU, bf16 on a GPU).
    cpu = ["--device", "cpu", "--threads", threads, "--weights", "f32", "--kv-type", "f32"]
    # On a CPU-only dry run the second "device" is the same CPU: the code paths run.
    gpu = ["--device", c.args.device, "--weights", "f32", "--kv-type", "f32"]
    res = {"model": model, "tokens": 256, "weights": "f32 on both devices"}
    files = {}
    runs = [("cpu", cpu), ("gpu", gpu)]
    if c.args.device != "cpu":
        runs.append(("gpu_bf16", ["--device", c.args.device]))
    for name, dev in runs:
        files[name] = c.scratch / f"logits-{name}.safetensors"
        c.kv("forward", "--model", model, *dev, "--tokens", 256, "--token-seed", 1,
             "--logits", files[name], "--json", c.scratch / f"fwd-{name}.json")
    res["logits"] = compare_logits(files["cpu"], files["gpu"])
    res["top1_ok"] = res["logits"]["top1_agreement"] >= 0.99
    if "gpu_bf16" in files:
        res["gpu_bf16_vs_cpu_f32"] = compare_logits(files["cpu"], files["gpu_bf16"])
    c.save()
    # Greedy tokens of a batch of four sequences decoded together (prompts of 128, 125, 122 and 119
    # tokens): on a GPU they attend through pooled caches, padded and masked; the CPU decodes them
    # with its own loop. Sequence 0 is the single-sequence comparison of earlier runs.
    greedy = {}
    new = 32 if q else 64
    for policy in ["full", "rkv", "snapkv", "h2o"]:
        budget = [] if policy == "full" else ["--budget", 64]
        outs = {}
        for name, dev in [("cpu", cpu), ("gpu", gpu)]:
            path = c.scratch / f"greedy-{policy}-{name}.json"
            c.kv("forward", "--model", model, *dev, "--tokens", 128, "--token-seed", 3, "--generate", new,
                 "--batch", 4, "--policy", policy, *budget, "--json", path)
            outs[name] = json.loads(path.read_text())["generated_batch"]
        greedy[policy] = {
            "tokens": new,
            "sequences": len(outs["gpu"]),
            "first_divergence": [first_divergence(a, b) for a, b in zip(outs["cpu"], outs["gpu"])],
        }
    res["greedy"] = greedy
    for f in files.values():
        f.unlink(missing_ok=True)
    return res


def transformers_device(c):
    return "cuda" if c.args.device.startswith("cuda") else "cpu"


def vs_transformers(c):
    import torch
    from transformers import AutoModelForCausalLM

    q = c.args.quick
    name = "random:tiny" if q else "random:r1-distill-qwen-1.5b"
    ckpt = c.scratch / "hf-checkpoint"
    shutil.rmtree(ckpt, ignore_errors=True)
    c.kv("models", "--export", name, ckpt)
    kv_logits = c.scratch / "logits-kv.safetensors"
    kv_json = c.scratch / "fwd-kv.json"
    new = 16 if q else 64
    c.kv("forward", "--model", ckpt, "--device", c.args.device, "--tokens", 256, "--token-seed", 2,
         "--generate", new, "--logits", kv_logits, "--json", kv_json)
    fwd = json.loads(kv_json.read_text())
    dev = transformers_device(c)
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.bfloat16, attn_implementation="sdpa").to(dev)
    model.eval()
    ids = torch.tensor([fwd["prompt"]], device=dev)
    with torch.no_grad():
        hf_logits = model(ids).logits[0]
    res = {"model": name, "checkpoint": "exported by kvbench models --export (bf16 safetensors)"}
    res["logits"] = compare_logits(kv_logits, hf_logits)
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, num_beams=1)
    hf_new = gen[0, ids.shape[1]:].tolist()
    res["greedy"] = {"tokens": new, "first_divergence": first_divergence(fwd["generated"], hf_new)}
    del model

    def against(kv_flags, dtype):
        """kvbench's teacher-forced logits under `kv_flags` against transformers' in `dtype`."""
        c.kv("forward", "--model", ckpt, "--device", c.args.device, *kv_flags, "--tokens", 256, "--token-seed", 2,
             "--logits", kv_logits, "--json", kv_json)
        hf = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=dtype, attn_implementation="sdpa").to(dev)
        hf.eval()
        with torch.no_grad():
            theirs = hf(ids).logits[0]
        del hf
        return compare_logits(kv_logits, theirs)

    # The same checkpoint in f32 on both sides: what is left is the engines' own difference, not
    # bf16's rounding (the first H100 run saw top-1 91% in bf16 and could not tell the two apart).
    res["logits_f32"] = against(["--weights", "f32", "--kv-type", "f32"], torch.float32)
    # kvbench with bf16 activations (as transformers keeps them) against transformers in bf16.
    res["logits_bf16_activations"] = against(["--activations", "weights"], torch.bfloat16)
    kv_logits.unlink(missing_ok=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    return res


def speed_shapes(c):
    q = c.args.quick
    return {
        "model": "random:tiny" if q else "random:r1-distill-qwen-7b",
        "prompt": 64 if q else 1024,
        "decode": 16 if q else c.args.decode_tokens,
        "batches": [1, 2] if q else [1, 8, 32],
        "budget": 32 if q else 1024,
    }


def speed_kvbench(c):
    s = speed_shapes(c)
    res = {"shapes": s}
    full = c.out / "perf_full.json"
    c.kv("perf", "--model", s["model"], "--device", c.args.device, "--prompt-tokens", s["prompt"],
         "--decode-prompt-tokens", s["prompt"], "--decode-tokens", s["decode"], "--batch",
         ",".join(map(str, s["batches"])), "--policy", "full", "--warmup", 1, "--warmup-tokens", 16, "--repeats", 1,
         "--export-json", full)
    res["full"] = json.loads(full.read_text())
    c.save()
    # The engine before pooled attention, at batch 8 in the same run: what batching the attention gives.
    per_seq = c.out / "perf_per_sequence.json"
    c.kv("perf", "--model", s["model"], "--device", c.args.device, "--prompt-tokens", s["prompt"],
         "--decode-prompt-tokens", s["prompt"], "--decode-tokens", s["decode"], "--batch",
         s["batches"][1], "--policy", "full", "--attention", "per-sequence", "--warmup", 1, "--warmup-tokens",
         16, "--repeats", 1, "--no-bandwidth", "--export-json", per_seq)
    res["per_sequence"] = json.loads(per_seq.read_text())
    return res


def speed_compressed(c):
    """R-KV, SnapKV, H2O and LazyEviction at B = 1,024 at the largest batch of the speed shapes, beside the
    full cache in the same call (after transformers' step: the first H100 run spent its deadline here).
    Their rate over full's is their per-step cost: at these lengths R-KV and SnapKV hold about as many
    entries as full, H2O evicts one entry per layer and step, and LazyEviction (keys per query head: seven
    times the cache, pooled) reads every query head's attention row at every step. Then H2O again with its scores on the host
    (`KVBENCH_HOST_SCORES`, kvbench before a pooled batch kept them on the device): every layer's attention
    rows copied at every step against only the evicted entries' indices. Then R-KV and H2O with each
    sequence's compression scored and gathered on its own (`KVBENCH_COMPRESS_EACH`, kvbench before a pooled
    batch's were done together): R-KV compresses once in the 128 tokens, H2O evicts at every step."""
    s = speed_shapes(c)
    res = {"shapes": s}
    # (file name, policies, environment, suffix of their rates' names)
    runs = [("compressed", "full,rkv,snapkv,h2o,lazy", None, ""),
            ("h2o_host_scores", "h2o", {"KVBENCH_HOST_SCORES": "1"}, "_host_scores"),
            ("each", "rkv,h2o", {"KVBENCH_COMPRESS_EACH": "1"}, "_each")]
    rate, copied = {}, {}
    for name, policies, env, suffix in runs:
        path = c.out / f"perf_{name}.json"
        c.kv("perf", "--model", s["model"], "--device", c.args.device, "--prompt-tokens", s["prompt"],
             "--decode-prompt-tokens", s["prompt"], "--decode-tokens", s["decode"], "--batch",
             s["batches"][-1], "--policy", policies, "--budget", s["budget"], "--activations",
             c.args.activations, "--warmup", 1, "--warmup-tokens", 16, "--repeats", 1, "--export-json", path,
             env=env)
        res[name] = json.loads(path.read_text())
        c.save()
        for r in res[name]["rows"]:
            if r["measurement"].get("phase") == "decode":
                policy = r["measurement"]["policy"].split()[0]
                rate[policy + suffix] = r["tokens_per_s_median"]
                copied[policy + suffix] = host_copies(r)
    res["rate"] = rate
    res["host_copies_per_step"] = copied
    if rate.get("full"):
        res["rate_over_full"] = {p: x / rate["full"] for p, x in rate.items() if p != "full"}
    return res


def speed_sparse(c):
    """RocketKV at a budget below the prompt, where its second stage selects every step's entries on the
    host: pooled (the batch's selections gathered from the pool at once) and per sequence (`--attention
    per-sequence`, kvbench before sparse attention pooled), beside the full cache in the first run."""
    s = speed_shapes(c)
    budget = 16 if c.args.quick else 256
    batches = f"1,{s['batches'][-1]}"
    res = {"shapes": s, "budget": budget}
    rate, copied = {}, {}
    for name, policies, attention in [("sparse", "full,rocket", "batched"),
                                      ("sparse_per_sequence", "rocket", "per-sequence")]:
        path = c.out / f"perf_{name}.json"
        c.kv("perf", "--model", s["model"], "--device", c.args.device, "--prompt-tokens", s["prompt"],
             "--decode-prompt-tokens", s["prompt"], "--decode-tokens", s["decode"], "--batch", batches,
             "--policy", policies, "--budget", budget, "--attention", attention, "--activations",
             c.args.activations, "--warmup", 1, "--warmup-tokens", 16, "--repeats", 1, "--export-json", path)
        res[name] = json.loads(path.read_text())
        c.save()
        for r in res[name]["rows"]:
            m = r["measurement"]
            if m.get("phase") == "decode":
                key = f"{m['policy'].split()[0]}_{attention}_b{m['batch']}"
                rate[key] = r["tokens_per_s_median"]
                copied[key] = host_copies(r)
    res["rate"] = rate
    res["host_copies_per_step"] = copied
    return res


def host_copies(row):
    """A perf decode row's copies to the host per step and their KiB, for the whole batch (kvbench's
    `host_copy` count; null on the CPU's own loop)."""
    m = row["measurement"]
    n, b = m.get("host_copies_per_step"), m.get("host_bytes_per_step")
    return None if n is None else {"copies": round(n, 2), "kib": round(b / 1024, 2)}


def prefill_batch(c):
    """`run`'s prefill of a benchmark's prompts (the built-in problems, a few hundred tokens each, at the
    speed shapes) several sequences a pass (up to 8,192 prompt tokens) against one a pass
    (`KVBENCH_PREFILL_EACH`, kvbench before), two new tokens each. Two batches of 30 per process: the
    second's figures are kept (the first pays for loading the device's kernels, once a process, which one
    pass would carry alone). Prefill tokens/s over each sequence's share of its pass; time to first token
    as each sequence saw it."""
    s = speed_shapes(c)
    res = {"shapes": s}
    for name, env in [("batched", None), ("each", {"KVBENCH_PREFILL_EACH": "1"})]:
        out = c.scratch / f"prefill_{name}"
        shutil.rmtree(out, ignore_errors=True)
        c.kv("run", "--model", s["model"], "--device", c.args.device, "--policy", "full", "--no-baseline",
             "--limit", 30, "--samples", 2, "--batch-size", 30, "--max-new-tokens", 2, "--ignore-eos",
             "--activations", c.args.activations, "--out", out, env=env)
        records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line]
        second = [r["metrics"] for r in records[len(records) // 2:]]
        tokens = sum(m["prompt_tokens"] for m in second)
        cost = sum(m.get("prefill_share_secs") or m["prefill_secs"] for m in second)
        ttft = sorted(m["prefill_secs"] for m in second)
        res[name] = {"sequences": len(second), "prompt_tokens": tokens,
                     "prefill_tokens_per_s": tokens / max(cost, 1e-9),
                     "ttft_median_s": ttft[len(ttft) // 2]}
        c.save()
    if res["each"]["prefill_tokens_per_s"]:
        res["batched_over_each"] = res["batched"]["prefill_tokens_per_s"] / res["each"]["prefill_tokens_per_s"]
    return res


def speed_batch1(c):
    """Batch-1 decoding with the cache in bf16 (the GPU default) and in f32, f32 activations, the rest
    as the speed step (a bf16 cache is converted to the f32 queries' type at every step); then bf16
    activations (`--activations weights`: no conversion around each product) at batch 1 and the
    largest speed batch, against the first run of the same call, and the same with the logits copied to
    the host for the greedy choice (`KVBENCH_HOST_LOGITS`, kvbench before the device chose them). Each
    with `--profile`: one more run that waits for the device after every phase of every layer, to say
    where a step's time goes. The first run also measures the device's copy bandwidth, and every decode
    row's bytes read per second (weights and cache) are given as a share of it: the issue's "share of the
    bandwidth bound", whichever GPU ran (a copy kernel reaches a little less than the data sheet's
    figure, so the share is a little more than against the data sheet)."""
    s = speed_shapes(c)
    res = {"shapes": s}
    largest = [1, s["batches"][-1]]
    host_logits = {"KVBENCH_HOST_LOGITS": "1"}
    runs = [("bf16", "bf16", "f32", [1], None), ("f32", "f32", "f32", [1], None),
            ("bf16_activations", "bf16", "weights", largest, None),
            ("bf16_activations_host_logits", "bf16", "weights", largest, host_logits)]
    bandwidth = None
    res["share_of_copy_bandwidth"] = {}
    for name, kv_type, activations, batches, env in runs:
        path = c.out / f"perf_batch1_{name}.json"
        measure_bandwidth = [] if bandwidth is None else ["--no-bandwidth"]
        c.kv("perf", "--model", s["model"], "--device", c.args.device, "--kv-type", kv_type, "--activations",
             activations, "--prompt-tokens", s["prompt"], "--decode-prompt-tokens", s["prompt"], "--decode-tokens",
             s["decode"], "--batch", ",".join(map(str, batches)), "--policy", "full", "--warmup", 1,
             "--warmup-tokens", 16, "--repeats", 1, *measure_bandwidth, "--profile", "--export-json", path,
             env=env)
        res[name] = json.loads(path.read_text())
        if bandwidth is None:
            bandwidth = res[name].get("copy_bandwidth_bytes_per_s")
            res["copy_bandwidth_bytes_per_s"] = bandwidth
        if bandwidth:
            res["share_of_copy_bandwidth"][name] = {
                str(r["measurement"]["batch"]): r["measurement"]["achieved_bytes_per_s"] / bandwidth
                for r in res[name]["rows"]
                if r["measurement"].get("phase") == "decode" and r["measurement"].get("achieved_bytes_per_s")}
        c.save()
    return res


def hf_config(c):
    """The config of the speed shapes, as transformers reads it (R1-Distill-Qwen-7B's config.json)."""
    from transformers import Qwen2Config

    if c.args.quick:
        return Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=4096, max_position_embeddings=4096)
    return Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, max_position_embeddings=131072,
                       rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)


def speed_transformers(c):
    import torch
    from transformers import AutoModelForCausalLM

    s = speed_shapes(c)
    dev = transformers_device(c)
    cfg = hf_config(c)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    res = {"shapes": s, "attention": "sdpa", "dtype": "bfloat16", "rows": []}
    gen = torch.Generator(device="cpu").manual_seed(0)
    for b in s["batches"]:
        ids = torch.randint(0, cfg.vocab_size, (b, s["prompt"]), generator=gen).to(dev)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
            if dev == "cuda":
                torch.cuda.reset_peak_memory_stats()
            sync()
            t = time.time()
            model(ids)
            sync()
            prefill = time.time() - t
            t = time.time()
            model.generate(ids, max_new_tokens=s["decode"], min_new_tokens=s["decode"], do_sample=False)
            sync()
            total = time.time() - t
        decode = max(total - prefill, 1e-9)
        # The model's own decoding step without generate's loop around it: the prompt through the
        # model once, then `loop` greedy steps each fed its last token with the cache, timed after the
        # first (generate's figure above includes its per-step overhead; this one does not).
        loop = 8 if c.args.quick else 32
        with torch.no_grad():
            out = model(ids, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            out = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            sync()
            t = time.time()
            for _ in range(loop):
                out = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            sync()
            forward_loop = time.time() - t
        del out, past
        res["rows"].append({
            "batch": b,
            "prefill_tokens_per_s": b * s["prompt"] / prefill,
            "decode_tokens_per_s": b * (s["decode"] - 1) / decode,
            "forward_loop_decode_tokens_per_s": b * loop / forward_loop,
            "end_to_end_s": total,
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if dev == "cuda" else None,
        })
        print(f"  transformers batch {b}: {res['rows'][-1]}", flush=True)
    del model
    return res


def long_outputs(c):
    """R-KV at B = 1,024 against the full cache over 8K-token outputs, each at the largest batch whose
    cache fits the GPU. Decoding 8,192 tokens at those batches takes minutes, past the check's
    deadline, so the step measures the rate at the points that decide it and integrates: first both
    policies at an 8,192-token context (the batch that fits at the outputs' longest, and its rate
    there), then the full cache at the same batch at the midpoints of the output's four quarters
    (1,024, 3,072, 5,120, 7,168), and R-KV at its batch where it still holds every entry (below
    B + its buffer; past that it holds at most B + buffer whatever the length, so its rate at 8,192
    stands for the rest). The estimated throughput over the whole output is the length over the sum
    of each quarter's length over its rate (the rates' harmonic mean): an estimate from measured
    rates, labelled as such in the results."""
    q = c.args.quick
    length = 256 if q else 8192
    budget = 32 if q else 1024
    # 128 tokens: R-KV compresses every 128 generated tokens (its buffer), so one compression falls in
    # each measurement and its cost is in the rate.
    decode = 16 if q else 128
    if c.args.device == "cpu":
        limit_mib = 256
    else:
        import torch

        free, _ = torch.cuda.mem_get_info()
        weights = 15.2 * 2**30  # R1-Distill-Qwen-7B in bf16
        # perf fits the batch to the KV bytes held at batch 1; a batch's pooled caches hold up to an
        # eighth more capacity than entries, and attention's f32 copies of a layer come on top.
        limit_mib = max((free - weights - 6 * 2**30) / 1.15 / 2**20, 1024)
    model = speed_shapes(c)["model"]

    def perf(name, policy, context, batch_flags):
        path = c.out / f"perf_long_{name}.json"
        c.kv("perf", "--model", model, "--device", c.args.device, "--prompt-tokens", 16,
             "--decode-prompt-tokens", context, "--decode-tokens", decode, *batch_flags, "--policy", policy,
             "--budget", budget, "--activations", c.args.activations, "--warmup", 1, "--warmup-tokens", 4,
             "--repeats", 1, "--no-bandwidth", "--export-json", path)
        return [r for r in json.loads(path.read_text())["rows"] if r["measurement"].get("phase") == "decode"]

    # perf's default cap (256) would bind R-KV's batch below what fits (at B = 1,024 a sequence holds
    # 1,152 entries of 56 KiB, 66 MB: about a thousand fit on an 80 GB H100, some 1,800 on a 141 GB
    # H200, where the full cache too fits twice the batch); a batch the cap still binds says so
    # (`batch_that_fits`).
    rows = perf("end", "full,rkv", length, ["--batch", 1, "--mem-limit", f"{limit_mib:.0f}", "--max-batch",
                                            256 if q else 2048])
    fits = [r for r in rows if r["measurement"].get("fits_mem_limit")]
    res = {"length": length, "budget": budget, "kv_limit_mib": limit_mib, "largest_batches": fits}
    by_policy = {r["measurement"]["policy"].split()[0]: r for r in fits}
    rate = {p: r["tokens_per_s_median"] for p, r in by_policy.items()}
    if rate.get("full") and rate.get("rkv"):
        res["rkv_over_full_throughput_at_length"] = rate["rkv"] / rate["full"]
    try:
        res["estimated_over_whole_outputs"] = whole_output_estimate(by_policy, rate, length, budget, decode, perf)
    except Exception as e:  # the rates at the full length stand on their own
        res["estimate_error"] = f"{type(e).__name__}: {e}"[-2000:]
        return res
    est = res["estimated_over_whole_outputs"]
    if "full" in est and "rkv" in est:
        res["rkv_over_full_estimated"] = est["rkv"]["estimated_tokens_per_s"] / est["full"]["estimated_tokens_per_s"]
    return res


def whole_output_estimate(by_policy, rate, length, budget, decode, perf):
    """Each policy's rate at its batch at the midpoints of the output's quarters, and the throughput
    over the whole output those rates give (see `long_outputs`)."""
    quarters = 4
    mids = [length * (2 * i + 1) // (2 * quarters) for i in range(quarters)]
    estimate = {}
    for p, r in by_policy.items():
        batch = r["measurement"]["batch"]
        m = re.search(r"buffer=(\d+)", r["measurement"]["policy"])
        holds_all_below = budget + int(m.group(1)) if p == "rkv" and m else length + 1
        rates = []
        for mid in mids:
            if mid + decode >= holds_all_below:
                rates.append({"context": mid, "tokens_per_s": rate[p], "from": f"measured at {length}"})
                continue
            (row,) = perf(f"{p}_{mid}", p, mid, ["--batch", batch])
            rates.append({"context": mid, "tokens_per_s": row["tokens_per_s_median"], "from": "measured"})
        est = length / sum(length / quarters / x["tokens_per_s"] for x in rates)
        estimate[p] = {"batch": batch, "quarters": rates, "estimated_tokens_per_s": est}
    return estimate


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvbench", default="target/cuda/kvbench")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-check"))
    ap.add_argument("--scratch", default="/tmp/gpu-check-scratch")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--deadline", type=float, default=450, help="seconds for all steps")
    ap.add_argument("--decode-tokens", type=int, default=256, help="decode length of the speed steps")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a dry run on a CPU machine")
    ap.add_argument("--activations", default="f32", choices=["f32", "weights"],
                    help="kvbench's activations in speed_compressed and long_outputs (weights: the bf16 "
                         "weights' own type, where a bf16 cache is not converted to f32 at every layer)")
    ap.add_argument("--steps", default="env,cpu_vs_gpu,speed_kvbench,speed_transformers,vs_transformers,"
                    "speed_compressed,long_outputs")
    args = ap.parse_args()
    plan = {
        "env": (5, env),
        "cpu_vs_gpu": (60, cpu_vs_gpu),
        "vs_transformers": (60, vs_transformers),
        "speed_kvbench": (70, speed_kvbench),
        "speed_transformers": (60, speed_transformers),
        "speed_compressed": (190, speed_compressed),
        "long_outputs": (150, long_outputs),
        "speed_batch1": (90, speed_batch1),
        "speed_sparse": (100, speed_sparse),
        "prefill_batch": (80, prefill_batch),
    }
    steps = args.steps.split(",")
    unknown = [name for name in steps if name not in plan]
    if unknown:
        ap.error(f"--steps: no step named {', '.join(map(repr, unknown))}; the steps: {', '.join(plan)}")
    if args.decode_tokens < 2:
        ap.error("--decode-tokens: from 2 (the first new token comes from the prefill)")
    c = Check(args)
    for name in steps:
        allowance, fn = plan[name]
        c.step(name, 2 if args.quick else allowance, lambda fn=fn: fn(c))
    c.results["total_s"] = round(now(), 1)
    c.save()
    shutil.rmtree(c.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
