#!/usr/bin/env bash
# make system-test: the .deb under real systemd and Debian's Prometheus.
#
#   packaging/system-test/run.sh DEB
#
# Builds a Debian 12 guest from Debian packages with mmdebstrap (cached as a
# tarball in build/system-test/cache/, keyed by the package list), unpacks
# a fresh copy, copies in DEB and the guest test (packaging/system-test/guest,
# compiled static), and boots it with systemd-nspawn -b: systemd is PID 1,
# the guest has its own network namespace (--private-network: only lo, no
# link to the host's interfaces) and makes its own lab inside (a veth to a
# second namespace for the flood). A oneshot unit in the guest runs the test
# and powers the guest off. The guest's log ends up in
# build/system-test/logs/; the exit status is the test's.
#
# Knobs: ST_TIMEOUT (seconds for the boot and the test, default 720),
# ST_KEEP=1 keeps the guest's root directory for a look afterwards,
# ST_OLD_DEBS (space-separated paths) packages of earlier versions that the
# guest first upgrades from to DEB under a flood (make system-test builds
# them: packaging/system-test/old-debs.sh).
# Choices and what each step verifies: packaging/README.md.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
deb=${1:?usage: run.sh DEB}
GO=${GO:-go}
ST_TIMEOUT=${ST_TIMEOUT:-720}
build=$repo/build/system-test
cache=$build/cache
logs=$build/logs

log() { printf '== system-test: %s\n' "$*" >&2; }
die() {
	printf 'system-test: %s\n' "$*" >&2
	exit 3
}

[[ $(id -u) == 0 ]] || die "needs root (systemd-nspawn, mmdebstrap)"
[[ -f $deb ]] || die "$deb: no such file (make deb)"
for c in mmdebstrap:mmdebstrap systemd-nspawn:systemd-container; do
	command -v "${c%%:*}" >/dev/null || die "${c%%:*} not found: install the Debian package ${c#*:} (make deps)"
done
mkdir -p "$cache" "$logs"

# One run at a time per checkout: they share the cache.
exec 8>"$build/.lock"
flock -n 8 || {
	log "waiting for another system-test run in this checkout"
	flock 8
}

# ------------------------------------------------------------- the guest image
# What the guest has besides the essential packages: systemd as init,
# iproute2 for the lab, Debian's prometheus and redis-server.
packages=systemd,systemd-sysv,dbus,iproute2,procps,prometheus,redis-server
# The host's apt sources (Debian 12 mirrors); no other network is needed.
sources=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[[ -n $sources ]] || sources=$(grep -h '^deb ' /etc/apt/sources.list 2>/dev/null || true)
[[ -n $sources ]] || die "no apt sources on this host for mmdebstrap"
key=$(printf '%s\n%s\n' "$packages" "$sources" | sha256sum | cut -c1-12)
image=$cache/bookworm-$key.tar
if [[ ! -f $image ]]; then
	log "building the guest image (mmdebstrap bookworm: $packages)"
	t0=$(date +%s)
	printf '%s\n' "$sources" >"$cache/sources.$$"
	mmdebstrap --quiet --variant=minbase --include="$packages" \
		--aptopt='Acquire::Check-Valid-Until "false"' \
		bookworm "$cache/partial-$key.tar" "$cache/sources.$$" ||
		{
			rm -rf "$cache/partial-$key.tar" "$cache/sources.$$"
			die "mmdebstrap failed"
		}
	rm -f "$cache/sources.$$"
	mv "$cache/partial-$key.tar" "$image"
	log "guest image built in $(($(date +%s) - t0))s: $image"
else
	log "guest image from the cache: $image"
fi

# ---------------------------------------------------------- a fresh guest root
machine=xlst$$
root=$(mktemp -d "$build/root.XXXXXX")
nspawn_pid=
cleanup() {
	local rc=$?
	if [[ -n $nspawn_pid ]] && kill -0 "$nspawn_pid" 2>/dev/null; then
		log "stopping the guest (pid $nspawn_pid)"
		kill -TERM "$nspawn_pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.2; done
		kill -KILL "$nspawn_pid" 2>/dev/null || true
		wait "$nspawn_pid" 2>/dev/null || true
	fi
	# Nothing of the guest may stay mounted (nspawn unmounts everything it
	# mounted when it exits; this catches a killed one).
	if findmnt -R -n -o TARGET "$root" >/dev/null 2>&1; then
		findmnt -R -n -o TARGET "$root" | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	fi
	rm -rf "/run/systemd/nspawn/propagate/$machine" 2>/dev/null || true
	if [[ ${ST_KEEP:-0} == 1 ]]; then
		log "kept the guest root: $root"
	else
		rm -rf "$root"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "unpacking the guest into $root"
tar -C "$root" -xf "$image"

# The test binary (static: the guest has no Go) and the package.
mkdir -p "$root/xlimit-test"
(cd "$repo" && CGO_ENABLED=0 "$GO" test -c -o "$root/xlimit-test/guest.test" ./packaging/system-test/guest) ||
	die "building the guest test failed"
cp "$deb" "$root/xlimit-test/xlimit.deb"
old_debs=
for o in ${ST_OLD_DEBS:-}; do
	[[ -f $o ]] || die "$o: no such file (ST_OLD_DEBS)"
	cp "$o" "$root/xlimit-test/"
	old_debs+=" /xlimit-test/$(basename "$o")"
done

# The unit that runs the test once the guest is up, then powers it off.
cat >"$root/etc/systemd/system/xlimit-system-test.service" <<EOF
[Unit]
Description=xlimit system test (packaging/system-test)
After=multi-user.target prometheus.service redis-server.service

[Service]
Type=oneshot
Environment=XLIMIT_SYSTEM_TEST_GUEST=1 XLIMIT_DEB=/xlimit-test/xlimit.deb "XLIMIT_OLD_DEBS=${old_debs# }"
ExecStart=/bin/sh -c 'cd /xlimit-test && ./guest.test -test.v -test.timeout 11m >out.log 2>&1; echo \$? >status'
ExecStopPost=/bin/systemctl --no-block poweroff
TimeoutStartSec=12m

[Install]
WantedBy=multi-user.target
EOF
ln -sf /etc/systemd/system/xlimit-system-test.service "$root/etc/systemd/system/multi-user.target.wants/"

# --------------------------------------------------------------------- boot
# --private-network: the guest's own network namespace with only lo (the
#   host's interfaces are not visible); CAP_NET_ADMIN inside it.
# --capability: CAP_BPF and CAP_PERFMON are not in nspawn's default set.
# --system-call-filter=bpf: nspawn's seccomp filter refuses bpf(2) with
#   EPERM otherwise, even with the capabilities.
# --tmpfs=/sys/fs/bpf: a mount point for the guest's own bpffs (nspawn's
#   /sys is read-only and systemd does not mount the bpffs in a container).
# SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1: cgroup2 in the guest (concurrency
#   rules attach sock_ops to the cgroup2 root) whatever the host uses.
# --register=no --keep-unit: no machined or scope on the host (works on a
#   host without systemd as PID 1, as CI containers are).
log "booting the guest (systemd-nspawn -b, machine $machine, limit ${ST_TIMEOUT}s)"
t0=$(date +%s)
console=$logs/console.log
SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 systemd-nspawn -q -D "$root" -M "$machine" -b \
	--private-network --register=no --keep-unit \
	--capability=CAP_BPF,CAP_PERFMON --system-call-filter=bpf --tmpfs=/sys/fs/bpf \
	--console=pipe </dev/null >"$console" 2>&1 &
nspawn_pid=$!
deadline=$((t0 + ST_TIMEOUT))
while kill -0 "$nspawn_pid" 2>/dev/null; do
	if (($(date +%s) > deadline)); then
		log "FAIL: the guest did not finish within ${ST_TIMEOUT}s"
		break
	fi
	sleep 1
done
if ! kill -0 "$nspawn_pid" 2>/dev/null; then
	wait "$nspawn_pid" || log "systemd-nspawn exited with $?"
	nspawn_pid=
fi
t1=$(date +%s)

# ------------------------------------------------------------------ results
cp "$root/xlimit-test/out.log" "$logs/guest.log" 2>/dev/null || : >"$logs/guest.log"
journalctl -D "$root/var/log/journal" --no-pager -o short-precise >"$logs/journal.log" 2>/dev/null || true
status=$(cat "$root/xlimit-test/status" 2>/dev/null || echo none)
grep -E '^(=== RUN|\s*--- (PASS|FAIL|SKIP)|PASS|FAIL|ok|panic:|\s+guest_test.go:)' "$logs/guest.log" >&2 || true
log "guest log: $logs/guest.log; guest journal: $logs/journal.log; console: $console"
log "wall time $((t1 - t0))s (boot, test, power-off)"
case $status in
0)
	log "PASS"
	exit 0
	;;
none)
	log "FAIL: the guest did not report a result"
	tail -n 30 "$console" >&2 || true
	exit 2
	;;
*)
	log "FAIL: guest test exit status $status"
	exit 1
	;;
esac
