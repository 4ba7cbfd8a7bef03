#!/usr/bin/env bash
# ptxas-report.sh — registers, stack frames and spills of every CUDA kernel, from `ptxas -v` output.
#
#   scripts/ptxas-report.sh [options] [BUILD_LOG|-]     parse a build log (stdin when absent or "-"):
#        cmake --build build 2>&1 | tee build.log        (src/backend/cuda compiles kernels with -Xptxas=-v)
#   scripts/ptxas-report.sh --compile [--arch 90a] [--jobs N] [options]
#        compile kernels/*.cu itself, one nvcc per file for one architecture, with -Xptxas -v
#
# Prints Markdown: a header (date, commit, source), a table of the libmoe kernels (everything not in
# CUB / Thrust / libcu++ / CUTLASS: in practice namespace moe_kcuda of kernels/*.cu) and a table of the
# library kernels (information only), columns kernel (demangled with c++filt when present), file, arch,
# registers, stack frame, spill stores, spill loads (bytes). Rows without registers are non-inlined
# device functions ("Function properties" without "Compiling entry function").
#
# Exit status: 0 no libmoe kernel spills; 1 some libmoe kernel has spill stores or loads > 0;
#              2 usage error, compile failure, or no ptxas -v output found in the input.
#
# Options:
#   --compile        compile kernels/*.cu (whatever is there now) instead of reading a log
#   --arch A         with --compile: the architecture, e.g. 90a (default), 100a, 90 (sm_ prefix optional)
#   --jobs N         with --compile: parallel nvcc processes (default 2; each writes its own log)
#   --nvcc PATH      with --compile: the compiler (default: $CUDACXX, else nvcc on PATH, else /usr/local/cuda/bin/nvcc)
#   --full-names     keep demangled parameter lists (default: dropped; template arguments stay)
#   -h, --help       this text
#
# A log from a parallel Makefile build (make -jN) can interleave the ptxas lines of two nvcc
# processes; the parser notices lines that do not fit the expected order and says so (the numbers
# may then be attributed to the wrong kernel: use --compile, or a Ninja build, which buffers output
# per command).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=log input=- arch=90a jobs=2 nvcc="" full=0
while [ $# -gt 0 ]; do
    case "$1" in
    --compile) mode=compile ;;
    --arch) [ $# -ge 2 ] || { echo "ptxas-report: --arch needs a value" >&2; exit 2; }; arch=${2#sm_}; shift ;;
    --jobs)
        if [ $# -lt 2 ] || ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then echo "ptxas-report: --jobs needs a count" >&2; exit 2; fi
        jobs=$2; shift ;;
    --nvcc) [ $# -ge 2 ] || { echo "ptxas-report: --nvcc needs a path" >&2; exit 2; }; nvcc=$2; shift ;;
    --full-names) full=1 ;;
    -h | --help) usage; exit 0 ;;
    -) input=- ;;
    -*) echo "ptxas-report: unknown option $1 (--help)" >&2; exit 2 ;;
    *) input=$1 ;;
    esac
    shift
done
[[ $arch =~ ^[0-9]+[af]?$ ]] || { echo "ptxas-report: --arch '$arch': expected e.g. 90a, 100a, 90" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ptxas-report.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# the kernels' tree object: the same across rebases and merges for as long as kernels/ is unchanged
ktree=$(git -C "$root" rev-parse --short=12 HEAD:kernels 2>/dev/null || echo unknown)
commit="$commit, kernels/ tree $ktree"
dirty=$(git -C "$root" status --porcelain -- kernels 2>/dev/null | head -1 || true)
[ -z "$dirty" ] || commit="$commit + uncommitted changes in kernels/"
[ "$mode" = compile ] || commit="$commit (this script's checkout; the log should come from the same tree)"

# ---------------------------------------------------------------- collect ptxas output into $tmp/ptxas.log
# Lines "#FILE name" tell the parser which kernel file the following lines came from (compile mode).
if [ "$mode" = compile ]; then
    if [ -z "$nvcc" ]; then
        if [ -n "${CUDACXX:-}" ]; then nvcc=$CUDACXX
        elif command -v nvcc >/dev/null 2>&1; then nvcc=$(command -v nvcc)
        else nvcc=/usr/local/cuda/bin/nvcc; fi
    fi
    [ -x "$nvcc" ] || command -v "$nvcc" >/dev/null 2>&1 || { echo "ptxas-report: nvcc not found ($nvcc)" >&2; exit 2; }
    shopt -s nullglob
    files=("$root"/kernels/*.cu)
    shopt -u nullglob
    [ ${#files[@]} -gt 0 ] || { echo "ptxas-report: no kernels/*.cu under $root" >&2; exit 2; }
    # the flags of src/backend/cuda/CMakeLists.txt (Release), one architecture
    flags=(-c -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -Xcompiler=-fPIC -Xcompiler=-fvisibility=hidden
        -DMOE_BUILDING_LIBRARY=1 -D_POSIX_C_SOURCE=200809L
        -I"$root/abi" -I"$root/src" -I"$root/kernels"
        "--generate-code=arch=compute_$arch,code=[sm_$arch]" -Xptxas=-v --Wno-deprecated-gpu-targets)
    source_desc="nvcc --compile of ${#files[@]} kernels/*.cu files for sm_$arch ($("$nvcc" --version | grep -o 'release [0-9.]*' || echo '?'))"
    i=0
    pids=()
    for f in "${files[@]}"; do
        i=$((i + 1))
        ( st=0; "$nvcc" "${flags[@]}" -o "$tmp/$i.o" "$f" >"$tmp/$i.out" 2>&1 || st=$?; echo "$st" >"$tmp/$i.rc" ) &
        pids+=($!)
        if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
    done
    for p in "${pids[@]}"; do wait "$p"; done
    : >"$tmp/ptxas.log"
    i=0
    fail=0
    for f in "${files[@]}"; do
        i=$((i + 1))
        if [ "$(cat "$tmp/$i.rc")" != 0 ]; then
            echo "ptxas-report: nvcc failed on ${f#"$root"/}:" >&2
            cat "$tmp/$i.out" >&2
            fail=1
        fi
        echo "#FILE ${f#"$root"/}" >>"$tmp/ptxas.log"
        cat "$tmp/$i.out" >>"$tmp/ptxas.log"
    done
    [ $fail = 0 ] || exit 2
else
    if [ "$input" = - ]; then
        cat >"$tmp/ptxas.log"
        source_desc="build log from stdin"
    else
        [ -r "$input" ] || { echo "ptxas-report: cannot read $input" >&2; exit 2; }
        tr -d '\r' <"$input" >"$tmp/ptxas.log"
        source_desc="build log $(basename "$input")"
    fi
fi

# ---------------------------------------------------------------- parse: one TSV row per function
# name  arch  file  regs  stack  spill_st  spill_ld   (regs "-" for non-entry functions)
awk -v OFS='\t' -v meta="$tmp/meta" '
function flush_anomaly(msg) { anomalies++; if (anomalies <= 3) printf("ptxas-report: warning: %s (line %d)\n", msg, NR) > "/dev/stderr" }
function anon_file(name,    m) {   # _GLOBAL__N__<hash>_<len>_<file>_cu_<hash> -> kernels/<file>.cu
    if (match(name, /_GLOBAL__N__[0-9a-f]+_[0-9]+_[A-Za-z0-9_]+_cu_/)) {
        m = substr(name, RSTART, RLENGTH); sub(/^_GLOBAL__N__[0-9a-f]+_[0-9]+_/, "", m); sub(/_cu_$/, "", m)
        return "kernels/" m ".cu"
    }
    return "?"
}
function add(name, a, kind) {
    n++; nm[n] = name; ar[n] = a; fl[n] = (file != "" ? file : anon_file(name)); rg[n] = "-"; sf[n] = ""; ss[n] = ""; sl[n] = ""
    kd[n] = kind; return n
}
/^#FILE / { file = $2; next }
/ptxas (warning|error) *:/ { wl = $0; sub(/^.*ptxas /, "ptxas ", wl); if (!(wl in seenw)) { seenw[wl] = 1; warns[++nw] = wl }; next }
/ptxas info *: Compiling entry function / {
    if (entry && rg[entry] == "-") flush_anomaly("entry function without a register line")
    name = $0; sub(/^.*Compiling entry function \047/, "", name); a = name
    sub(/\047.*$/, "", name)
    sub(/^.*for \047/, "", a); sub(/\047.*$/, "", a); arch = a
    entry = add(name, a, "entry"); props = 0; next
}
/ptxas info *: Function properties for / {
    name = $0; sub(/^.*Function properties for /, "", name); sub(/[ \t]+$/, "", name)
    if (entry && nm[entry] == name && sf[entry] == "") props = entry
    else { props = add(name, (arch != "" ? arch : "?"), "func") }
    next
}
/bytes stack frame, .* bytes spill stores, .* bytes spill loads/ {
    if (!props || sf[props] != "") { flush_anomaly("stack/spill line without a \"Function properties\" line before it"); next }
    split($0, w, /[ \t,]+/); k = 0
    for (i = 1; i in w; i++) if (w[i] ~ /^[0-9]+$/) v[++k] = w[i]
    sf[props] = v[1]; ss[props] = v[2]; sl[props] = v[3]; props = 0; next
}
/ptxas info *: Used [0-9]+ registers/ {
    if (!entry || rg[entry] != "-") { flush_anomaly("register line without its entry function"); next }
    r = $0; sub(/^.*Used /, "", r); sub(/ registers.*$/, "", r); rg[entry] = r; next
}
END {
    for (i = 1; i <= n; i++) {
        if (sf[i] == "") { sf[i] = "?"; ss[i] = "?"; sl[i] = "?"; if (kd[i] == "entry") flush_anomaly("no stack/spill line for " nm[i]) }
        print nm[i], ar[i], fl[i], rg[i], sf[i], ss[i], sl[i]
    }
    if (anomalies) printf("ptxas-report: warning: %d line(s) out of the expected order: interleaved output of a parallel build? Numbers may belong to other kernels; --compile is exact.\n", anomalies) > "/dev/stderr"
    printf("anomalies\t%d\n", anomalies + 0) > meta
    for (i = 1; i <= nw; i++) printf("warning\t%s\n", warns[i]) > meta
}' "$tmp/ptxas.log" | sort -u -t "$(printf '\t')" -k3,3 -k1,1 -k2,2 -k4,7 >"$tmp/rows.tsv"

if [ ! -s "$tmp/rows.tsv" ]; then
    echo "ptxas-report: no ptxas -v lines (\"Compiling entry function ...\") in the $source_desc" >&2
    exit 2
fi

# ---------------------------------------------------------------- demangle, classify, print
cut -f1 "$tmp/rows.tsv" >"$tmp/mangled"
if command -v c++filt >/dev/null 2>&1; then c++filt <"$tmp/mangled" >"$tmp/demangled"; else cp "$tmp/mangled" "$tmp/demangled"; fi
paste "$tmp/demangled" "$tmp/rows.tsv" >"$tmp/all.tsv"

awk -F '\t' -v meta="$tmp/meta" -v full="$full" -v src="$source_desc" -v commit="$commit" -v date="$(date -u +%Y-%m-%dT%H:%M:%SZ)" '
function short(s,    depth, i, c) {   # drop the final "(...)" parameter list; shorten anonymous namespaces
    gsub(/\(anonymous namespace\)/, "{anon}", s)
    gsub(/cub::CUB_[0-9]+_SM_[0-9_]+::/, "cub::", s)   # the versioned inline namespace of CUB
    gsub(/std::__[0-9]+::/, "std::", s)
    sub(/^void /, "", s)
    if (full || s !~ /\)$/) return s
    depth = 0
    for (i = length(s); i > 0; i--) {
        c = substr(s, i, 1)
        if (c == ")") depth++
        else if (c == "(") { depth--; if (depth == 0) return substr(s, 1, i - 1) }
    }
    return s
}
function is_lib(mangled) { return mangled ~ /^_ZN(K)?(3cub|6thrust|4cuda|7cutlass|4cute)/ }
function cell(s) { gsub(/\|/, "\\|", s); return s }
function table(which, title,    i, k, w1, w2, fmt) {
    k = 0; w1 = 6; w2 = 4
    for (i = 1; i <= n; i++) if (lib[i] == which) { k++; if (length(nm[i]) > w1) w1 = length(nm[i]); if (length(fl[i]) > w2) w2 = length(fl[i]) }
    printf("\n## %s (%d)\n\n", title, k)
    if (!k) { print "(none)"; return }
    fmt = "| %-" w1 "s | %-" w2 "s | %-7s | %4s | %5s | %8s | %8s |\n"
    printf(fmt, "kernel", "file", "arch", "regs", "stack", "spill st", "spill ld")
    printf("|%s|%s|---------|-----:|------:|---------:|---------:|\n", dashes(w1 + 2), dashes(w2 + 2))
    for (i = 1; i <= n; i++) if (lib[i] == which)
        printf(fmt, nm[i], fl[i], ar[i], rg[i], sf[i], ss[i] (sp[i] ? " !" : ""), sl[i] (sp[i] ? " !" : ""))
}
function dashes(k,    s) { s = ""; while (k-- > 0) s = s "-"; return s }
{
    n++; nm[n] = cell(short($1)); ar[n] = $3; fl[n] = $4; rg[n] = $5; sf[n] = $6; ss[n] = $7; sl[n] = $8
    lib[n] = is_lib($2); sp[n] = (ss[n] + 0 > 0 || sl[n] + 0 > 0)
    if (lib[n]) { nlib++; if (sp[n]) libspill++ } else { nours++; if (sp[n]) spill++; if (sf[n] == "?") unknown++ }
}
END {
    printf("# ptxas report\n\n")
    printf("- generated: %s by scripts/ptxas-report.sh\n- commit: %s\n- source: %s\n", date, commit, src)
    printf("- columns: registers per thread; stack frame, spill stores and spill loads in bytes per thread; \"!\" marks spills\n")
    table(0, "libmoe kernels (kernels/*.cu, checked: no spills allowed)")
    table(1, "library kernels (CUB / Thrust / libcu++, information only)")
    nw = 0; anomalies = 0
    while ((getline line < meta) > 0) {
        split(line, f, "\t")
        if (f[1] == "anomalies") anomalies = f[2] + 0; else if (f[1] == "warning") w[++nw] = f[2]
    }
    if (nw) { printf("\n## ptxas warnings (%d)\n\n", nw); for (i = 1; i <= nw; i++) printf("- `%s`\n", w[i]) }
    if (anomalies)
        printf("\n**Warning:** %d ptxas line(s) out of the expected order (interleaved output of a parallel build?): some numbers may belong to other kernels; `--compile` is exact.\n", anomalies)
    printf("\n**Summary:** %d libmoe function(s), %d with spills%s; %d library function(s), %d with spills (not checked).\n",
           nours, spill, (unknown ? sprintf(", %d with unknown spill counts", unknown) : ""), nlib, libspill)
    exit(spill > 0 ? 1 : 0)
}' "$tmp/all.tsv" && rc=0 || rc=$?
exit "$rc"
