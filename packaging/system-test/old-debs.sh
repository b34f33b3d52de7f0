#!/usr/bin/env bash
# old-debs.sh OUTDIR: builds the packages of earlier versions that the
# system test upgrades from under a flood, and prints their paths:
#   - cd7296b's own `make deb` (the last version before map migrations);
#   - 2392467's binary (its maps had other layouts: the upgrade migrates
#     them), packaged with cd7296b's scripts (2392467 had no packaging).
# Built from this clone's history with the module cache (GOPROXY=off); a
# clone without those commits (a shallow one) gets a warning and no
# packages, and the upgrade steps do not run.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: old-debs.sh OUTDIR}
GO=${GO:-go}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for c in cd7296b 2392467; do
	if ! git -C "$repo" cat-file -e "$c^{commit}" 2>/dev/null; then
		echo "old-debs: $c is not in this clone's history: no upgrade steps" >&2
		exit 0
	fi
done
ver() { echo "0.1.0~git$(TZ=UTC git -C "$repo" log -1 --date=format-local:%Y%m%d%H%M%S --format=%cd "$1").$1"; }
work=$(mktemp -d "${TMPDIR:-/tmp}/xlimit-old-debs.XXXXXX")
trap 'rm -rf "$work"' EXIT
export GOPROXY=off GOFLAGS=-mod=mod CGO_ENABLED=0
for c in cd7296b 2392467; do
	mkdir -p "$work/$c"
	git -C "$repo" archive "$c" | tar -x -C "$work/$c"
done
v=$(ver cd7296b)
if [[ ! -f $out/xlimit_${v}_amd64.deb ]]; then
	make -s -C "$work/cd7296b" deb PKG_VERSION="$v" DIST="$out" >&2
fi
echo "$out/xlimit_${v}_amd64.deb"
v=$(ver 2392467)
if [[ ! -f $out/xlimit_${v}_amd64.deb ]]; then
	(cd "$work/2392467" && "$GO" build -trimpath -ldflags "-s -w -X main.version=$v" -o "$work/xlimit-2392467" ./cmd/xlimit)
	"$work/cd7296b/packaging/build-deb.sh" "$work/xlimit-2392467" "$v" "$out" >&2
fi
echo "$out/xlimit_${v}_amd64.deb"
