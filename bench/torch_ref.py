#!/usr/bin/python3
"""PyTorch reference of the libmoe layer for bench/compare.sh.

The layer is written the way a competent PyTorch user writes it (Hugging Face Mixtral style):
each expert owns its own nn.Linear weights (w1 = gate, w3 = up, w2 = down, no biases), the router is an
nn.Linear, routing is top-k over the logits then softmax over the k selected (libmoe's default score
function; Mixtral's softmax-then-top-k-then-renormalise is the same function), tokens are gathered per
expert with an index, and the expert outputs, scaled by their probability, are scattered back with
index_add_. Forward runs with autograd on (a training forward); backward is y.backward(dy) and computes
dx and every weight gradient.

Run with /usr/bin/python3 (Debian's python3-torch imports only there):
    /usr/bin/python3 bench/torch_ref.py --threads 2 --config target --json out.json
"""
import argparse
import json
import os
import statistics
import sys
import time

# Keep in sync with k_configs in bench/bench_layer.c (compare.sh checks the shapes match).
CONFIGS = [
    # name,         T,    H,    F,    E,  K, dtype,  reps
    ("target",      4096, 1024, 1024, 16, 2, "fp32", 5),
    ("target_bf16", 4096, 1024, 1024, 16, 2, "bf16", 3),
    ("small",       2048, 512,  512,  8,  2, "fp32", 9),
    ("finegrained", 4096, 1024, 256,  64, 8, "fp32", 3),
]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads and BLAS threads (default 2)")
    ap.add_argument("--reps", type=int, default=0, help="timed repetitions (default: per config)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed repetitions first (default 1)")
    ap.add_argument("--config", action="append", default=[], help="NAME[,NAME...] or all (repeatable)")
    ap.add_argument("--json", help="write machine-readable results here")
    ap.add_argument("--fixed-input", action="store_true",
                    help="the same x every repetition (default: fresh tokens each repetition)")
    ap.add_argument("--list", action="store_true", help="list the configs")
    return ap.parse_args()


ARGS = parse_args()
if ARGS.threads < 1:
    sys.exit("torch_ref.py: --threads must be >= 1")
# Threads must be fixed before torch (and the BLAS it links) is loaded: torch.set_num_threads sets the
# OpenMP pool but not OpenBLAS's own pthread pool, which Debian's torch uses for its GEMMs.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402


class Expert(nn.Module):
    """SwiGLU expert: w2(silu(w1 x) * w3 x)."""

    def __init__(self, hidden, ffn):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)  # gate
        self.w3 = nn.Linear(hidden, ffn, bias=False)  # up
        self.w2 = nn.Linear(ffn, hidden, bias=False)  # down

    def forward(self, x):
        return self.w2(Fn.silu(self.w1(x)) * self.w3(x))


class SparseMoE(nn.Module):
    def __init__(self, hidden, ffn, num_experts, top_k):
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList([Expert(hidden, ffn) for _ in range(num_experts)])

    def forward(self, x):
        logits = self.gate(x)                                        # [T, E]
        top_logits, selected = torch.topk(logits, self.top_k, dim=-1)  # [T, K]
        weights = torch.softmax(top_logits, dim=-1, dtype=torch.float).to(x.dtype)
        out = torch.zeros_like(x)
        # [E, K, T]: expert_mask[e, k, t] = 1 when token t's k-th choice is expert e
        expert_mask = Fn.one_hot(selected, num_classes=self.num_experts).permute(2, 1, 0)
        for e in range(self.num_experts):
            slot, tok = torch.where(expert_mask[e])
            if tok.numel() == 0:
                continue
            h = self.experts[e](x[tok]) * weights[tok, slot, None]
            out.index_add_(0, tok, h.to(out.dtype))
        return out


def run_config(cfg, reps, warmup, fixed_input):
    name, T, H, F, E, K, dtype, _ = cfg
    torch.manual_seed(1234)
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    model = SparseMoE(H, F, E, K).to(dt)
    x = (torch.rand(T, H) * 2 - 1).to(dt).requires_grad_(True)
    dy = (torch.rand(T, H) * 2 - 1).to(dt)
    t_fwd, t_bwd, t_fb = [], [], []
    for i in range(warmup + reps):
        if i > 0 and not fixed_input:  # new tokens, untimed
            with torch.no_grad():
                x.copy_(torch.rand(T, H) * 2 - 1)
        x.grad = None
        t0 = time.perf_counter()
        y = model(x)
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        del y
        if i >= warmup:
            t_fwd.append((t1 - t0) * 1e3)
            t_bwd.append((t2 - t1) * 1e3)
            t_fb.append((t2 - t0) * 1e3)
    F1 = 2 * F
    R = T * K
    flops_fwd = 2.0 * R * H * F1 + 2.0 * R * F * H
    res = {
        "name": name, "T": T, "H": H, "F": F, "E": E, "K": K, "dtype": dtype, "activation": "swiglu",
        "warmup": warmup, "reps": reps, "fixed_input": int(fixed_input),
        "flops_fwd": flops_fwd, "flops_bwd": 2 * flops_fwd,
        "fwd_ms": statistics.median(t_fwd), "bwd_ms": statistics.median(t_bwd),
        "fwdbwd_ms": statistics.median(t_fb), "fwdbwd_min_ms": min(t_fb),
    }
    res["fwdbwd_gflops"] = 3 * flops_fwd / (res["fwdbwd_ms"] * 1e6)
    res["tokens_per_s"] = T / (res["fwdbwd_ms"] * 1e-3)
    res["dense_bf16_ms"] = dense_bf16_ms(R, 3 * (F1 + F), H, reps, warmup)
    res["dense_bf16_gflops"] = 3 * flops_fwd / (res["dense_bf16_ms"] * 1e6)
    return res


def dense_bf16_ms(m, n, k, reps, warmup):
    """Median ms of PyTorch's bf16 dense GEMM [m,k] x [k,n] (bf16 out), the FLOPs of the layer's
    fwd+bwd (bench_layer's dense ceiling shape): the bf16 ceiling compare.sh holds bf16 layers to."""
    torch.manual_seed(99)
    a = (torch.rand(m, k) * 2 - 1).to(torch.bfloat16)
    b = (torch.rand(k, n) * 2 - 1).to(torch.bfloat16)
    ts = []
    for i in range(warmup + reps):
        t0 = time.perf_counter()
        c = torch.matmul(a, b)
        t1 = time.perf_counter()
        del c
        if i >= warmup:
            ts.append((t1 - t0) * 1e3)
    return statistics.median(ts)


def main():
    if ARGS.list:
        for c in CONFIGS:
            print("%-12s T=%d H=%d F=%d E=%d K=%d swiglu %s reps=%d" % c)
        return 0
    names = [n for arg in ARGS.config for n in arg.split(",") if n] or ["all"]
    selected = []
    for n in names:
        matches = [c for c in CONFIGS if n in ("all", c[0])]
        if not matches:
            print("torch_ref.py: unknown config '%s'" % n, file=sys.stderr)
            return 2
        selected += [c for c in matches if c not in selected]
    torch.set_num_threads(ARGS.threads)
    print("torch_ref: torch %s, threads=%d (torch reports %d)" % (torch.__version__, ARGS.threads,
                                                                torch.get_num_threads()))
    results = []
    for cfg in selected:
        reps = ARGS.reps if ARGS.reps > 0 else cfg[7]
        r = run_config(cfg, reps, ARGS.warmup, ARGS.fixed_input)
        results.append(r)
        print("%-12s %5s fwd %9.2f ms  bwd %9.2f ms  fwd+bwd %9.2f ms (%6.1f GFLOP/s, %8.0f tokens/s), reps=%d; "
              "dense bf16 GEMM of the same FLOPs %.2f ms (%.1f GFLOP/s)" % (
                  r["name"], r["dtype"], r["fwd_ms"], r["bwd_ms"], r["fwdbwd_ms"], r["fwdbwd_gflops"],
                  r["tokens_per_s"], reps, r["dense_bf16_ms"], r["dense_bf16_gflops"]), flush=True)
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump({"tool": "torch_ref", "torch_version": torch.__version__, "threads": ARGS.threads,
                       "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
