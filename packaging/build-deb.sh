#!/usr/bin/env bash
# build-deb.sh BINARY VERSION OUTDIR: builds OUTDIR/xlimit_VERSION_amd64.deb
# with dpkg-deb (no debhelper, no source package: the binary is built by
# `make deb`, statically, with VERSION stamped in). Layout and maintainer
# scripts: packaging/README.md.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
bin=$1 version=$2 out=$3

die() { echo "build-deb: $*" >&2; exit 1; }
[[ -x $bin ]] || die "$bin: no such executable"
got=$("$bin" version) || die "$bin version failed"
[[ $got == "xlimit $version" ]] || die "$bin says '$got', want 'xlimit $version' (stamp the version with -ldflags -X main.version=)"

# Reproducible: timestamps from the commit, files sorted, owned by root.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}

work=$(mktemp -d "${TMPDIR:-/tmp}/xlimit-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
umask 022
mkdir -p "$root/DEBIAN"

# The binary and its unit. The unit is deploy/systemd/xlimit.service with
# the packaged binary's path (/usr/bin instead of /usr/local/bin); nothing
# else changes.
install -D -m 0755 "$bin" "$root/usr/bin/xlimit"
install -d "$root/lib/systemd/system"
sed 's|/usr/local/bin/xlimit|/usr/bin/xlimit|g' "$repo/deploy/systemd/xlimit.service" >"$root/lib/systemd/system/xlimit.service"
chmod 0644 "$root/lib/systemd/system/xlimit.service"
! grep -q /usr/local "$root/lib/systemd/system/xlimit.service" || die "the packaged unit still names /usr/local"

# The default rules: a conffile that attaches nowhere.
install -D -m 0644 "$here/rules.yaml" "$root/etc/xlimit/rules.yaml"
"$bin" check "$root/etc/xlimit/rules.yaml" >/dev/null || die "packaging/rules.yaml does not validate"

# Alerting rules and dashboard.
install -D -m 0644 "$repo/deploy/prometheus/xlimit-alerts.yaml" "$root/usr/share/xlimit/prometheus/xlimit-alerts.yaml"
install -D -m 0644 "$repo/deploy/grafana/xlimit-dashboard.json" "$root/usr/share/xlimit/grafana/xlimit-dashboard.json"

# Documentation: the man page from --help, the operator's docs, copyright
# and a changelog (a native package: no Debian revision).
install -d "$root/usr/share/man/man8" "$root/usr/share/doc/xlimit" "$root/usr/share/lintian/overrides"
"$here/man.sh" "$bin" "$version" | gzip -9n >"$root/usr/share/man/man8/xlimit.8.gz"
for f in README.md docs/config.md docs/operations.md docs/fleet.md deploy/systemd/README.md; do
	name=$(basename "$f")
	[[ $f == deploy/systemd/README.md ]] && name=systemd.md
	gzip -9n <"$repo/$f" >"$root/usr/share/doc/xlimit/$name.gz"
done
install -m 0644 "$here/debian/copyright" "$root/usr/share/doc/xlimit/copyright"
{
	echo "xlimit ($version) unstable; urgency=medium"
	echo
	echo "  * Built from commit $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)."
	echo
	echo " -- xlimit maintainers <maintainers@users.noreply.a-seed-6ccc11c8.example>  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$root/usr/share/doc/xlimit/changelog.gz"
install -m 0644 "$here/debian/lintian-overrides" "$root/usr/share/lintian/overrides/xlimit"

# Control files.
for s in postinst prerm postrm; do install -m 0755 "$here/debian/$s" "$root/DEBIAN/$s"; done
install -m 0644 "$here/debian/conffiles" "$root/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" "$here/debian/control.in" >"$root/DEBIAN/control"
(cd "$root" && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$out"
deb=$out/xlimit_${version}_amd64.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
