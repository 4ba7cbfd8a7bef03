#!/usr/bin/env bash
# Provides Julia 1.5.3 for the Julia binding's tests. Debian 12 ships no Julia, so this unpacks
# Debian 11's julia packages into a private prefix (never dpkg -i: nothing of bullseye enters the
# system's package database) and borrows the few runtime libraries that Debian 12 still has.
# Exception: libunwind comes from bullseye too. With Debian 12's libunwind 1.6 every exception thrown
# from compiled Julia code segfaults while the backtrace is taken; 1.3.2 is what julia 1.5.3 was built for.
#
#   bash scripts/setup-julia.sh     # prints the wrapper command (one line on stdout)
#
# Idempotent: a finished prefix is only checked. Prefix: ${MOE_TOOLS_DIR:-/opt/libmoe-tools}/julia.
# Progress goes to stderr, so `julia=$(bash scripts/setup-julia.sh)` captures just the command.
set -euo pipefail

tools=${MOE_TOOLS_DIR:-/opt/libmoe-tools}
prefix=$tools/julia
libdir=$prefix/usr/lib/x86_64-linux-gnu
wrapper=$prefix/bin/julia
stamp=$prefix/.complete
# Bump when the recipe changes, so an older prefix is rebuilt.
recipe="julia 1.5.3+dfsg-3; libunwind8 from bullseye"

log() { echo "setup-julia: $*" >&2; }

# One setup at a time (CI stages or helpers may call this concurrently); the others wait, then find
# the finished prefix.
mkdir -p "$tools"
exec 9>"$tools/.julia.lock"
flock 9

# What the binding's tests need: @ccall, Test, Libdl, and exceptions thrown from compiled code.
smoke='using Test, Libdl
@assert VERSION == v"1.5.3"
@assert @ccall(strlen("julia"::Cstring)::Csize_t) == 5
thrower() = throw(ArgumentError("caught"))
@assert (try thrower(); false catch e; e isa ArgumentError end)'

if [[ -f "$stamp" && "$(cat "$stamp")" == "$recipe" && -x "$wrapper" ]] && "$wrapper" -e "$smoke" >/dev/null 2>&1; then
  log "julia 1.5.3 present in $prefix"
  echo "$wrapper"
  exit 0
fi

if [[ "$(dpkg --print-architecture)" != amd64 ]]; then
  log "only amd64 is supported (the prefix mirrors Debian's x86_64 library paths)"
  exit 1
fi

sudo=()
if [[ "$(id -u)" -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then sudo=(sudo -n); else
    log "not root and no sudo: cannot install the Debian 12 runtime libraries"; exit 1
  fi
fi
apt_opts=(-q -y -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=600)

# The Debian archive this machine already uses (deb822 *.sources or one-line *.list files); read at
# run time so the repository names no mirror.
archive_uri() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    # first URIs: line of a stanza whose Suites carry a plain release name (not -security)
    uri=$(awk '
      /^[[:space:]]*$/ { if (u != "" && ok) { print u; exit } u = ""; ok = 0; next }
      /^URIs:/ { u = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i !~ /-/) ok = 1 }
      END { if (u != "" && ok) print u }' "$f" | head -n 1)
    if [[ "$uri" == *debian* && "$uri" != *security* ]]; then echo "$uri"; return 0; fi
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    uri=$(awk '$1 == "deb" && $0 !~ /security/ {
      for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; exit } }' "$f" | head -n 1)
    if [[ "$uri" == *debian* ]]; then echo "$uri"; return 0; fi
  done
  return 1
}

# ---------------------------------------------------------------- 1. Debian 12 runtime libraries
# libjulia's bundled-library links (usr/lib/x86_64-linux-gnu/julia/*.so) point at these sonames.
system_pkgs=(libcurl3-gnutls libssh2-1 libgmp10 libmpfr6 libpcre2-8-0)
missing=()
for p in "${system_pkgs[@]}"; do
  [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" == installed ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing ${missing[*]} (Debian 12)"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update >&2
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install "${missing[@]}" >&2 </dev/null
fi

# ---------------------------------------------------------------- 2. bullseye packages, unpacked
uri=$(archive_uri) || { log "no Debian archive found in /etc/apt/sources*"; exit 1; }
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
work=$tools/julia-apt
mkdir -p "$work/lists/partial" "$work/debs"
# Debian 12's keyring still holds bullseye's signing keys; fall back to apt's trusted set without it.
signed=""
if [[ -f "$keyring" ]]; then signed=" [signed-by=$keyring]"; fi
echo "deb$signed $uri bullseye main" >"$work/sources.list"
private=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
         -o Dir::State::Lists="$work/lists" -o Dir::Cache::archives="$work/debs")
log "bullseye package lists from $uri"
apt-get "${private[@]}" -q -o Dpkg::Use-Pty=0 update >&2

bullseye_pkgs=(julia libjulia1 julia-common libllvm9 libgit2-1.1 libmbedcrypto3 libmbedtls12 libmbedx509-0
               libdsfmt-19937-1 libopenlibm3 libutf8proc2 libhttp-parser2.9 libffi7 libunwind8)
# Pin bullseye's version of each: where Debian 12 has a newer one installed (libunwind8), apt would
# otherwise pick that as the candidate and find no source for it.
pinned=()
for p in "${bullseye_pkgs[@]}"; do
  v=$(apt-cache "${private[@]}" madison "$p" | awk -F'|' '/bullseye/ { gsub(/ /, "", $2); print $2; exit }')
  [[ -n "$v" ]] || { log "bullseye has no package $p"; exit 1; }
  pinned+=("$p=$v")
done
log "downloading ${#pinned[@]} packages"
# apt-get download writes into the current directory; _apt needs to be able to write there.
chmod 0777 "$work/debs"
rm -f "$work/debs/"*.deb
(cd "$work/debs" && apt-get "${private[@]}" -q download "${pinned[@]}" >&2)

rm -rf "$prefix"
mkdir -p "$prefix"
for p in "${bullseye_pkgs[@]}"; do
  debs=("$work/debs/${p}_"*.deb)
  dpkg -x "${debs[0]}" "$prefix"
done
rm -f "$work/debs/"*.deb # unpacked; a rebuild downloads afresh anyway

for p in "${system_pkgs[@]}"; do
  while IFS= read -r so; do
    [[ "$so" == */x86_64-linux-gnu/*.so* ]] || continue
    ln -sf "$so" "$libdir/$(basename "$so")"
  done < <(dpkg-query -L "$p:amd64" 2>/dev/null || dpkg-query -L "$p")
done

# ---------------------------------------------------------------- 3. wrapper
mkdir -p "$prefix/bin"
cat >"$wrapper" <<EOF
#!/bin/sh
# Julia 1.5.3 from Debian 11, unpacked by scripts/setup-julia.sh.
export LD_LIBRARY_PATH="$libdir:$libdir/julia\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$prefix/usr/bin/julia" "\$@"
EOF
chmod +x "$wrapper"

"$wrapper" -e "$smoke" >&2
echo "$recipe" >"$stamp"
log "julia 1.5.3 ready: $(du -sh "$prefix" | cut -f1) in $prefix"
echo "$wrapper"
