#!/usr/bin/env bash
# make real-host: issue 27's scenarios on a real NIC driver.
#
#   tests/realhost/run.sh [SCENARIO...]     (default: 0 1 2 3 4 5)
#
# One Debian 12 guest (vagrant/build-box.sh's image, Linux 6.12) under qemu
# (TCG here: docs/realhost.md), its virtio-net NIC with 4 queue pairs on a
# multi-queue tap in a network namespace of its own; floods (trafgen) and
# clients (vegeta through tests/realhost/cmd/load, wrk, curl) run in that
# namespace, on the host side of the tap, with no XDP there. The guest runs
# nginx (Debian's package; its default page, and /work proxied to the app),
# the app (cmd/app: net/http with a bounded worker pool) and xlimit (this
# checkout's build, native XDP on virtio_net).
#
# Scenarios: 0 the driver (native XDP, RSS over the queues, XDP_TX cookies
# to a peer without XDP); 1 UDP flood vs a 1000/s and a 10 000/s rule, and
# nftables' limit; 2 spoofed SYN flood with syn_cookies: auto vs the kernel
# alone; 3 overload of nginx -> app, new connection per request; 4 the same
# with keep-alive; 5 the .deb under systemd: kill -9 and upgrade under a
# flood, 100 ms samples.
#
# Writes the raw output of every run to bench/results/realhost/<date>/ and
# the tables to bench/results/<date>-real-host.md. Not part of make test or
# CI: about 25-35 minutes under TCG on 2 shared CPUs (the report says).
set -Eeuo pipefail
trap 'printf "realhost: failed (exit %s) at %s:%s: %s\n" "$?" "${BASH_SOURCE[0]}" "$LINENO" "$BASH_COMMAND" >&2' ERR
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"
[[ $(id -u) == 0 ]] || rh_die "needs root (netns, tap, qemu)"
for c in qemu-system-x86_64:qemu-system-x86 trafgen:netsniff-ng wrk:wrk curl:curl mke2fs:e2fsprogs python3:python3; do
	command -v "${c%%:*}" >/dev/null || rh_die "${c%%:*} not found: install the Debian package ${c#*:}"
done
GO=${GO:-go}
scenarios=${*:-0 1 2 3 4 5}
date=${RH_DATE:-$(date +%F)}
commit=$(git -C "$rh_repo" rev-parse --short HEAD)
dirty=$(git -C "$rh_repo" diff --quiet HEAD -- . ':!bench/results' 2>/dev/null || echo "+dirty")
raw=$rh_repo/bench/results/realhost/$date
# Each run's tables: $raw/report-sLIST.md; tests/realhost/report.sh puts
# the runs of a day together into bench/results/<date>-real-host.md.
report=${RH_REPORT:-$raw/report-s$(tr -d ' ' <<<"$scenarios").md}
mkdir -p "$raw"
payload=$RH_WORK/payload
mkdir -p "$payload"
rh_flood_pid=

cleanup() {
	local rc=$?
	flood_stop
	# The guest's serial console (a panic reboots it: panic=-1) stays with the run.
	[[ -f $RH_WORK/console.log ]] && cp "$RH_WORK/console.log" "$raw/console.log"
	rh_down
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------ the payload
rh_log "building xlimit (commit $commit$dirty), the app, the sampler, the load client, two .debs"
(
	cd "$rh_repo"
	make -s build-release >/dev/null
	cp bin/release/xlimit "$payload/xlimit"
	cd "$here"
	CGO_ENABLED=0 "$GO" build -trimpath -o "$payload/" ./cmd/app ./cmd/sampler
	CGO_ENABLED=0 "$GO" build -trimpath -o "$RH_WORK/load" ./cmd/load
)
if [[ " $scenarios " == *" 5 "* ]]; then
	# Two packages of this checkout with versions one above the other: the
	# upgrade of scenario 5 is a real dpkg upgrade (prerm, postinst restart).
	base=$(cd "$rh_repo" && packaging/version.sh)
	for v in 1 2; do
		(cd "$rh_repo" && make -s deb PKG_VERSION="$base.rh$v" DIST="$RH_WORK/dist" >/dev/null 2>&1) ||
			rh_die "make deb failed"
	done
	cp "$RH_WORK"/dist/xlimit_*.rh1_amd64.deb "$payload/xlimit-old.deb"
	cp "$RH_WORK"/dist/xlimit_*.rh2_amd64.deb "$payload/xlimit-new.deb"
fi
cp "$here/guest.sh" "$here/nginx-site.conf" "$payload/"

mke2fs -q -t ext4 -d "$payload" "$RH_WORK/payload.img" 256M
RH_EXTRA_DRIVES="-drive file=$RH_WORK/payload.img,if=virtio,format=raw,readonly=on"

# --------------------------------------------------------------- helpers
g() { rh_ssh sh /xl/guest.sh "$@"; }

# flood_start TRAFGEN_CONFIG GAP: trafgen from the lab namespace into the
# tap, one packet every GAP (e.g. 25us), in its own process group.
flood_start() {
	flood_stop
	local pace=()
	case ${2:-} in
	*pps) pace=(-b "$2") ;;
	?*) pace=(-t "$2") ;;
	esac
	setsid ip netns exec "$RH_NS" trafgen -q -o xltap0 -i "$1" "${pace[@]}" -n 0 --cpus 1 \
		>"$RH_WORK/trafgen.out" 2>&1 </dev/null &
	rh_flood_pid=$!
	sleep 1
	kill -0 "$rh_flood_pid" 2>/dev/null || rh_die "trafgen exited: $(cat "$RH_WORK/trafgen.out")"
}
# flood_stop: the flood gone, and checked gone (no trafgen in the lab's
# namespace, the tap's transmit counter still).
flood_stop() {
	if [[ -n $rh_flood_pid ]]; then
		kill -TERM -- -"$rh_flood_pid" 2>/dev/null || true
		wait "$rh_flood_pid" 2>/dev/null || true
		rh_flood_pid=
	fi
	ip netns pids "$RH_NS" 2>/dev/null | while read -r p; do
		[[ $(cat "/proc/$p/comm" 2>/dev/null) == trafgen ]] && kill -KILL "$p" 2>/dev/null
	done || true
}
tap_tx() { rh_ns cat /sys/class/net/xltap0/statistics/tx_packets; }
check_quiet() { # no flood left: the tap sends < 50 packets/s
	local a b
	sleep 1
	a=$(tap_tx)
	sleep 1
	b=$(tap_tx)
	(((b - a) < 50)) || rh_die "a flood is still running: $((b - a)) packets/s into the tap"
}

# load ARGS: vegeta from the lab namespace; prints its JSON summary.
load() { rh_ns "$RH_WORK/load" "$@"; }

# py: the small computations of the tables.
py() { python3 -c "$@"; }

md() { printf '%s\n' "$*" >>"$raw/report.md.part"; }

# ------------------------------------------------------------------ boot
: >"$raw/report.md.part"
t_all=$(date +%s)
rh_up
g setup 2 20ms | tee "$raw/setup.log"
rh_ssh 'uname -a; nproc; ethtool -l eth0; ethtool -x eth0 | head -8; nginx -v 2>&1' >>"$raw/setup.log" 2>&1
kernel=$(rh_ssh uname -r)
durations=()

# Every scenario: a function sN that appends its table to the report.
source "$here/scenarios.sh"

for s in $scenarios; do
	t0=$(date +%s)
	rh_log "scenario $s"
	"s$s"
	flood_stop
	g xl-stop >/dev/null 2>&1 || true
	g nft-clear >/dev/null 2>&1 || true
	durations+=("$s=$(($(date +%s) - t0))")
	rh_log "scenario $s done in $(($(date +%s) - t0))s"
done
t_total=$(($(date +%s) - t_all))

# ---------------------------------------------------------------- report
{
	echo "# Real host: issue 27's scenarios on virtio-net ($date)"
	echo
	echo "Written by \`make real-host\` (tests/realhost/run.sh $scenarios) at commit $commit$dirty."
	echo "Guest: Debian 12, Linux $kernel, $RH_SMP vCPUs, $RH_MEM, qemu **$RH_ACCEL** (KVM here runs a"
	echo "stock kernel in its instruction emulator: docs/realhost.md), virtio-net with $RH_QUEUES queue pairs"
	echo "($RH_COMBINED combined in use, rss=on), native XDP. Host: $(nproc) CPUs shared with other work,"
	echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg). Under TCG absolute speeds mean nothing;"
	echo "ratios within one run and functional results do. Raw output: bench/results/realhost/$date/."
	echo
	echo "Wall time: boot ${rh_boot_s}s; $(printf 'scenario %s s, ' "${durations[@]}" | sed 's/=/: /g; s/, $//'); total ${t_total}s."
	echo
	cat "$raw/report.md.part"
} >"$report"
rm -f "$raw/report.md.part"
rh_log "report: $report"
