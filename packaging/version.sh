#!/bin/sh
# Prints the package version: packaging/VERSION when HEAD is tagged
# v$(cat VERSION), else VERSION~gitYYYYMMDDHHMMSS.HASH (the commit's UTC
# time, so that later commits sort higher for dpkg), with +dirty for a tree
# with uncommitted changes. "~" sorts before the release: 0.1.0~git... < 0.1.0.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
base=$(cat "$here/VERSION")
cd "$here/.."
if ! git rev-parse --git-dir >/dev/null 2>&1; then
	echo "$base~dev"
	exit 0
fi
if [ "$(git describe --tags --exact-match 2>/dev/null || true)" = "v$base" ] && git diff --quiet HEAD 2>/dev/null; then
	echo "$base"
	exit 0
fi
when=$(TZ=UTC git log -1 --date=format-local:%Y%m%d%H%M%S --format=%cd)
hash=$(git rev-parse --short=7 HEAD)
dirty=
git diff --quiet HEAD 2>/dev/null || dirty=+dirty
echo "$base~git$when.$hash$dirty"
