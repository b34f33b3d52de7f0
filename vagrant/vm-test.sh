#!/usr/bin/env bash
# make vm-test: the VM suite with Vagrant (vagrant-libvirt).
#
# 1. the box (vagrant/build-box.sh, build/box/xlimit.box) added to Vagrant;
# 2. libvirtd (and virtlogd) started in a network namespace of their own
#    (xlvm) unless one already runs: vagrant-libvirt's management network,
#    its bridge, dnsmasq and firewall rules then live in that namespace, not
#    on the host's interfaces; vagrant itself runs there too, so it reaches
#    the guest;
# 3. `vagrant up` (domain type qemu: TCG here, docs/realhost.md), the test
#    binaries built on the host (static; the guest has no Go) uploaded, the
#    tests run as root in the guest: the loader tier (native and generic
#    XDP), the kernel tier's verifier and frame tests, and the end-to-end
#    tests in VM_E2E_RUN against the real daemon;
# 4. `vagrant destroy`, the box's libvirt volume, and what step 2 started,
#    removed again.
# The guest's output: build/vm-test/results.log; exit status: the tests'.
# Knobs: VM_E2E_RUN, VM_MAPS_RUN (go test -run patterns), VM_KEEP=1 leaves
# the VM and libvirtd running (vagrant destroy -f and stop them yourself).
set -Eeuo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
out=$repo/build/vm-test
GO=${GO:-go}
NS=xlvm
VM_MAPS_RUN=${VM_MAPS_RUN:-'^(TestLoadVerifies|TestFrames|TestFailStatic|TestCookie.*)$'}
VM_E2E_RUN=${VM_E2E_RUN:-'^(TestFloodLimited|TestKillDaemonDuringFlood)$'}
log() { printf '== vm-test %s: %s\n' "$(date +%T)" "$*" >&2; }
die() {
	printf 'vm-test: %s\n' "$*" >&2
	exit 3
}
[[ $(id -u) == 0 ]] || die "needs root (libvirtd, a network namespace)"
for c in vagrant libvirtd virsh; do command -v $c >/dev/null || die "$c not found: install vagrant, vagrant-libvirt and libvirt-daemon-system"; done
vagrant plugin list 2>/dev/null | grep -q vagrant-libvirt || die "the vagrant-libvirt plugin is missing (Debian package vagrant-libvirt)"
mkdir -p "$out"
started=()
cleanup() {
	local rc=$?
	if [[ ${VM_KEEP:-0} != 1 ]]; then
		(cd "$here" && in_ns vagrant destroy -f >/dev/null 2>&1) || true
		for vol in $(virsh -c qemu:///system vol-list default 2>/dev/null | awk '/xlimit-bookworm-local/ {print $1}'); do
			virsh -c qemu:///system vol-delete --pool default "$vol" >/dev/null 2>&1 || true
		done
		virsh -c qemu:///system net-destroy vagrant-libvirt >/dev/null 2>&1 || true
		for p in "${started[@]}"; do kill "$p" 2>/dev/null || true; done
		for p in "${started[@]}"; do
			for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		done
		ip netns del "$NS" 2>/dev/null || true
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
in_ns() { if ip netns list | grep -qw "$NS"; then ip netns exec "$NS" "$@"; else "$@"; fi; }

# ------------------------------------------------------------ the box
[[ -f $repo/build/box/xlimit.box ]] || "$here/build-box.sh"
log "adding the box (build/box/xlimit.box)"
vagrant box add --force --name xlimit-bookworm-local "$repo/build/box/xlimit.box" >/dev/null
# A box added again must not be shadowed by an old copy in libvirt's pool.
for vol in $(virsh -c qemu:///system vol-list default 2>/dev/null | awk '/xlimit-bookworm-local/ {print $1}'); do
	virsh -c qemu:///system vol-delete --pool default "$vol" >/dev/null 2>&1 || true
done

# ------------------------------------------------------------ libvirtd
if ! virsh -c qemu:///system uri >/dev/null 2>&1; then
	log "starting virtlogd and libvirtd in network namespace $NS"
	ip netns add "$NS"
	ip netns exec "$NS" ip link set lo up
	ip netns exec "$NS" setsid virtlogd </dev/null >"$out/virtlogd.log" 2>&1 &
	started+=($!)
	ip netns exec "$NS" setsid libvirtd </dev/null >"$out/libvirtd.log" 2>&1 &
	started+=($!)
	for _ in $(seq 100); do virsh -c qemu:///system uri >/dev/null 2>&1 && break; sleep 0.2; done
	virsh -c qemu:///system uri >/dev/null 2>&1 || die "libvirtd did not start: $(tail -5 "$out/libvirtd.log")"
fi
virsh -c qemu:///system pool-info default >/dev/null 2>&1 || {
	virsh -c qemu:///system pool-define-as default dir --target /var/lib/libvirt/images >/dev/null
	virsh -c qemu:///system pool-build default >/dev/null 2>&1 || true
	virsh -c qemu:///system pool-start default >/dev/null
}

# ------------------------------------------------------------ the tests
log "building the test binaries (static)"
bin=$out/bin
rm -rf "$bin"
mkdir -p "$bin"
(
	cd "$repo"
	export CGO_ENABLED=0
	"$GO" test -c -o "$bin/maps.test" ./maps/
	"$GO" test -c -o "$bin/loader.test" ./loader/
	"$GO" test -c -o "$bin/tests.test" ./tests/
	"$GO" build -trimpath -tags xlimit_faults -o "$bin/xlimit" ./cmd/xlimit
) || die "building the test binaries failed"
cat >"$bin/run.sh" <<EOF
#!/bin/sh
# In the guest, as root.
cd /tmp/xlbin
echo "== guest: \$(uname -r), \$(nproc) CPUs, \$(ethtool -i eth0 | head -1)"
rc=0
# Each binary's whole output is kept (/tmp/xlbin/*.out); its exit status counts.
./loader.test -test.v >loader.out 2>&1 || rc=1
./maps.test -test.parallel 1 -test.run '$VM_MAPS_RUN' >maps.out 2>&1 || rc=1
XLIMIT_BIN=/tmp/xlbin/xlimit ./tests.test -test.v -test.run '$VM_E2E_RUN' >e2e.out 2>&1 || rc=1
grep -hE '^(--- |ok|FAIL|PASS)' loader.out maps.out
cat e2e.out
echo "== guest: status \$rc"
exit \$rc
EOF
chmod +x "$bin/run.sh"

log "vagrant up (libvirt, domain type ${XLIMIT_VM_DRIVER:-qemu})"
t0=$(date +%s)
cd "$here"
in_ns vagrant up --provider libvirt 2>&1 | tee "$out/up.log" | grep -E '^==> default: (Creating|Starting|Waiting|Machine booted|Rsyncing|Running provisioner)' >&2 ||
	die "vagrant up failed: $(tail -20 "$out/up.log")"
log "up in $(($(date +%s) - t0))s; uploading the test binaries"
in_ns vagrant upload "$bin" /tmp/xlbin >/dev/null
log "running the tests in the guest"
t1=$(date +%s)
set +e
in_ns vagrant ssh -c 'sudo sh /tmp/xlbin/run.sh' 2>&1 | tee "$out/results.log"
rc=${PIPESTATUS[0]}
set -e
log "tests: exit $rc in $(($(date +%s) - t1))s (boot and provisioning $((t1 - t0))s); output $out/results.log"
exit "$rc"
