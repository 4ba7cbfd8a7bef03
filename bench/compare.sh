#!/usr/bin/env bash
# Engine vs dense-GEMM ceiling vs PyTorch reference, one run, same threads and configs.
#
#   bench/compare.sh [--threads N] [--config NAME[,NAME...]] [--reps N] [--rounds N]
#                    [--torch-preload LIB] [--fixed-input] [--build-dir DIR] [--out DIR] [--profile]
#                    [--strict]
#
# Builds bench_layer if needed (cmake -S . -B build-bench), runs bench/bench_layer and
# bench/torch_ref.py (/usr/bin/python3) alternately --rounds times, and prints a Markdown table
# (medians over rounds; ratios are taken within a round). --torch-preload LIB also runs the
# reference with LD_PRELOAD=LIB (e.g. tcmalloc) and adds a column. Exit status: non-zero when a
# build or a run fails (or, with --strict, when the target config misses its goals).
# docs/benchmarks.md describes what is measured.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
threads=2
configs=all
reps=
rounds=1
torch_preload=
build_dir="$root/build-bench"
out_dir=
profile=
fixed=
strict=0

usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=${2:?--threads needs a value}; shift 2 ;;
    --config) configs=${2:?--config needs a value}; shift 2 ;;
    --reps) reps=${2:?--reps needs a value}; shift 2 ;;
    --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
    --torch-preload) torch_preload=${2:?--torch-preload needs a value}; shift 2 ;;
    --build-dir) build_dir=${2:?--build-dir needs a value}; shift 2 ;;
    --out) out_dir=${2:?--out needs a value}; shift 2 ;;
    --profile) profile=--profile; shift ;;
    --fixed-input) fixed=--fixed-input; shift ;;
    --strict) strict=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

case "$rounds" in ''|*[!0-9]*|0) echo "compare.sh: --rounds must be a positive integer" >&2; exit 2 ;; esac
if [ -n "$torch_preload" ] && [ ! -f "$torch_preload" ]; then
  echo "compare.sh: --torch-preload $torch_preload: no such file" >&2; exit 2
fi
if [ -z "$out_dir" ]; then
  out_dir=$(mktemp -d "${TMPDIR:-/tmp}/moe-compare.XXXXXX")
fi
mkdir -p "$out_dir"

# ---------------------------------------------------------------- build (if needed)
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  echo "== configuring $build_dir" >&2
  cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >"$out_dir/cmake.log" 2>&1 ||
    { cat "$out_dir/cmake.log" >&2; echo "compare.sh: cmake configure failed" >&2; exit 1; }
fi
echo "== building bench_layer" >&2
cmake --build "$build_dir" --target bench_layer -j "$(nproc)" >"$out_dir/build.log" 2>&1 ||
  { tail -n 40 "$out_dir/build.log" >&2; echo "compare.sh: build failed" >&2; exit 1; }
bench="$build_dir/bench/bench_layer"
[ -x "$bench" ] || { echo "compare.sh: $bench not found after the build" >&2; exit 1; }

reps_arg=()
[ -n "$reps" ] && reps_arg=(--reps "$reps")
[ -n "$fixed" ] && reps_arg+=("$fixed")

# ---------------------------------------------------------------- runs (alternating, so that a
# machine whose load changes over time affects both sides alike)
for r in $(seq 1 "$rounds"); do
  echo "== round $r/$rounds: engine: $bench --threads $threads --config $configs ${reps_arg[*]} $profile" >&2
  "$bench" --threads "$threads" --config "$configs" "${reps_arg[@]}" $profile \
    --json "$out_dir/engine.$r.json" | tee "$out_dir/engine.$r.txt" >&2 ||
    { echo "compare.sh: bench_layer failed" >&2; exit 1; }

  echo "== round $r/$rounds: torch: /usr/bin/python3 bench/torch_ref.py --threads $threads --config $configs ${reps_arg[*]}" >&2
  /usr/bin/python3 "$here/torch_ref.py" --threads "$threads" --config "$configs" "${reps_arg[@]}" \
    --json "$out_dir/torch.$r.json" | tee "$out_dir/torch.$r.txt" >&2 ||
    { echo "compare.sh: torch_ref.py failed" >&2; exit 1; }

  if [ -n "$torch_preload" ]; then
    echo "== round $r/$rounds: torch with LD_PRELOAD=$torch_preload" >&2
    LD_PRELOAD="$torch_preload" /usr/bin/python3 "$here/torch_ref.py" --threads "$threads" --config "$configs" \
      "${reps_arg[@]}" --json "$out_dir/torchpre.$r.json" | tee "$out_dir/torchpre.$r.txt" >&2 ||
      { echo "compare.sh: torch_ref.py (LD_PRELOAD) failed" >&2; exit 1; }
  fi
done

# ---------------------------------------------------------------- table
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' || true)
# MOE_BENCH_COMMIT names the source when the tree is not a git checkout (e.g. a `git archive` copy)
commit=${MOE_BENCH_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ -z "${MOE_BENCH_COMMIT:-}" ]; then
  dirty=$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | head -n1 || true)
  [ -n "$dirty" ] && commit="$commit+dirty"
fi

rc=0
/usr/bin/python3 - "$out_dir" "$rounds" "$threads" "$cpu" "$commit" "$strict" "$torch_preload" <<'PY' || rc=$?
import datetime, json, os, statistics, sys
out_dir, rounds, threads, cpu, commit, strict, preload = sys.argv[1:8]
rounds = int(rounds)
def load(prefix):
    if not os.path.exists(os.path.join(out_dir, "%s.1.json" % prefix)):
        return None
    return [json.load(open(os.path.join(out_dir, "%s.%d.json" % (prefix, r)))) for r in range(1, rounds + 1)]
eng, tor, pre = load("engine"), load("torch"), load("torchpre")
med = statistics.median
def by_name(runs):
    return [{x["name"]: x for x in run["results"]} for run in runs]
E, Tt = by_name(eng), by_name(tor)
P = by_name(pre) if pre else None
load_avg = open("/proc/loadavg").read().split()[:3]
print("Date: %s; commit %s; CPU: %s (%d online); threads: %s; torch %s; OPENBLAS_CORETYPE=%s; "
      "rounds: %d; load average after the runs: %s" % (
    datetime.date.today().isoformat(), commit, cpu, os.cpu_count(), threads, tor[0].get("torch_version"),
    os.environ.get("OPENBLAS_CORETYPE", "(unset)"), rounds, " ".join(load_avg)))
yn = lambda v: "yes" if v else "no"
print("bf16 on this CPU: avx512_bf16 %s, amx_bf16 %s; oneDNN ISA %s; the engine's bf16 layers multiply %s" % (
    yn(eng[0].get("avx512_bf16")), yn(eng[0].get("amx_bf16")), eng[0].get("onednn_isa", "?"),
    "bf16 operands natively (fp32 accumulation)" if eng[0].get("bf16_gemm_native") else
    "bf16 weights widened to fp32 (no bf16 dot products)"))
print()
hdr = ("| config | shape | engine fwd ms | engine bwd ms | torch fwd ms | torch bwd ms "
       "| engine/torch time (fwd+bwd) | speedup fwd+bwd | speedup fwd | engine GFLOP/s "
       "| dense OpenBLAS GFLOP/s | dense oneDNN GFLOP/s | layer/dense fp32 "
       "| dense bf16 GFLOP/s (oneDNN / PyTorch) | layer/dense bf16 | expert GEMMs |")
sep = "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"
if P:
    hdr += " torch+preload fwd+bwd ms | speedup vs torch+preload |"
    sep += "--:|--:|"
print(hdr)
print(sep)
bad = 0
summary = {}
for e0 in eng[0]["results"]:
    name = e0["name"]
    try:
        es = [r[name] for r in E]
        ts = [r[name] for r in Tt]
        ps = [r[name] for r in P] if P else None
    except KeyError:
        print("compare.sh: results for %s missing" % name, file=sys.stderr)
        bad = 1
        continue
    for k in ("T", "H", "F", "E", "K", "dtype"):
        if e0[k] != ts[0][k]:
            print("compare.sh: config %s differs between engine and torch in %s (%s vs %s)" % (
                name, k, e0[k], ts[0][k]), file=sys.stderr)
            bad = 1
    fb_flops = e0["flops_fwd"] + e0["flops_bwd"]
    e_fwd, e_bwd, e_fb = med([x["fwd_ms"] for x in es]), med([x["bwd_ms"] for x in es]), med([x["fwdbwd_ms"] for x in es])
    t_fwd, t_bwd = med([x["fwd_ms"] for x in ts]), med([x["bwd_ms"] for x in ts])
    ratio_t = med([e["fwdbwd_ms"] / t["fwdbwd_ms"] for e, t in zip(es, ts)])
    speed = med([t["fwdbwd_ms"] / e["fwdbwd_ms"] for e, t in zip(es, ts)])
    speed_f = med([t["fwd_ms"] / e["fwd_ms"] for e, t in zip(es, ts)])
    dense = med([x["dense_gflops"] for x in es])
    dnnl_vals = [x.get("dense_dnnl_gflops") for x in es]
    dense_dnnl = med(dnnl_vals) if all(v is not None for v in dnnl_vals) else None
    ratio_d = med([x["ratio_to_dense"] for x in es])
    # the bf16 ceiling: the faster of oneDNN's bf16 matmul (engine run) and PyTorch's bf16 matmul (torch
    # run) in the same round, same FLOPs
    def best16(e, t):
        v = [x for x in (e.get("dense_bf16_gflops"), t.get("dense_bf16_gflops")) if isinstance(x, (int, float))]
        return max(v) if v else None
    b16 = [best16(e, t) for e, t in zip(es, ts)]
    ratio_b = med([fb_flops / (e["fwdbwd_ms"] * 1e6) / b for e, b in zip(es, b16)]) if all(b16) else None
    d16e = [x.get("dense_bf16_gflops") for x in es]
    d16t = [x.get("dense_bf16_gflops") for x in ts]
    fmt = lambda v: ("%.1f" % med(v)) if all(isinstance(x, (int, float)) for x in v) else "n/a"
    shape = "T=%d H=%d F=%d E=%d K=%d %s" % (e0["T"], e0["H"], e0["F"], e0["E"], e0["K"], e0["dtype"])
    row = "| %s | %s | %.1f | %.1f | %.1f | %.1f | %.2f | %.2fx | %.2fx | %.1f | %.1f | %s | %.2f | %s / %s | %s | %s |" % (
        name, shape, e_fwd, e_bwd, t_fwd, t_bwd, ratio_t, speed, speed_f, fb_flops / (e_fb * 1e6), dense,
        "%.1f" % dense_dnnl if dense_dnnl is not None else "n/a", ratio_d, fmt(d16e), fmt(d16t),
        "%.2f" % ratio_b if ratio_b is not None else "n/a", e0.get("gemm_path", "?"))
    if ps:
        row += " %.1f | %.2fx |" % (med([x["fwdbwd_ms"] for x in ps]),
                                     med([p["fwdbwd_ms"] / e["fwdbwd_ms"] for e, p in zip(es, ps)]))
    print(row)
    summary[name] = (ratio_d, speed, ratio_b)
print()
print("Times are medians of the repetitions (and of the rounds); ratios and speedups are taken within a round. "
      "GFLOP/s = expert GEMM FLOPs of fwd+bwd, 3 x (2*R*H*F1 + 2*R*F*H) with R = T*K and F1 = 2F, over the "
      "median fwd+bwd time. Dense = one GEMM M=R N=3*(F1+F) K=H of the same FLOPs, same run, same "
      "threads: fp32 with OpenBLAS (cblas_sgemm) and oneDNN (dnnl_sgemm), layer/dense fp32 against the "
      "faster of the two; bf16 x bf16 with oneDNN's matmul (fp32 out) and PyTorch's matmul (bf16 out), "
      "layer/dense bf16 against the faster of the two.%s" % (
          (" torch+preload: the same reference with LD_PRELOAD=%s." % preload) if P else ""))
# the goals (docs/benchmarks.md): fp32 layers at >= 0.9 of the fp32 dense ceiling; the bf16 target layer
# >= 1.5x PyTorch bf16 and >= 0.9 of the bf16 dense ceiling (met only on CPUs with bf16 dot products)
goals = []
for n in ("target", "small", "finegrained"):
    if n in summary:
        goals.append(("%s fp32: layer/dense fp32" % n, summary[n][0], 0.9, "%.2f"))
if "target_bf16" in summary:
    r, s_, rb = summary["target_bf16"]
    goals.append(("target_bf16: speedup vs PyTorch bf16 fwd+bwd", s_, 1.5, "%.2fx"))
    if rb is not None:
        goals.append(("target_bf16: layer/dense bf16", rb, 0.9, "%.2f"))
if goals:
    print()
for label, v, want, f in goals:
    ok = v >= want
    print(("Goal %s = " + f + " (>= " + f + "): %s") % (label, v, want, "met" if ok else "MISSED"))
    if strict == "1" and not ok:
        bad = bad or 3
sys.exit(bad)
PY
echo "(raw results: $out_dir)" >&2
exit $rc
