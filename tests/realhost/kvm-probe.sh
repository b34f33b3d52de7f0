#!/usr/bin/env bash
# Why a stock guest kernel prints nothing under -accel kvm on these machines.
#
#   tests/realhost/kvm-probe.sh [VMLINUZ] [SECONDS]
#
# Boots VMLINUZ (default: the host's Debian /boot/vmlinuz-*) under qemu
# -accel kvm for SECONDS (default 30) and samples, through QMP, KVM's own
# per-vCPU counters (query-stats: debugfs is closed by lockdown here) and the
# guest's RIP. Prints what the host's KVM is, how many instructions KVM had
# to emulate per second, and a verdict: "emulated" when the guest runs in
# KVM's instruction emulator (kvm_pvm with a kernel that is not a PVM
# guest), "runs" when the kernel reached its console.
set -euo pipefail
vmlinuz=${1:-$(ls /boot/vmlinuz-* | sort -V | tail -1)}
secs=${2:-30}
tmp=$(mktemp -d)
qpid=
cleanup() {
	[[ -n $qpid ]] && kill -- -"$qpid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
echo "host: $(uname -r); CPU flags: $(grep -m1 -o -w -E 'vmx|svm' /proc/cpuinfo || echo 'no vmx/svm'), $(grep -m1 -o -w hypervisor /proc/cpuinfo || true)"
echo "kvm: $(ls -d /sys/module/kvm_* 2>/dev/null | xargs -n1 basename | tr '\n' ' ')"
for p in /sys/module/kvm_pvm/parameters/{pvm_native,pvm_emul_batch}; do [[ -r $p ]] && echo "  $p=$(cat "$p")"; done
grep -qw nested_pvm=1 /proc/cmdline && echo "  host command line: nested_pvm=1"
if [[ -r /proc/config.gz ]]; then echo "  host kernel: $(zcat /proc/config.gz | grep -E '^CONFIG_(PVM_GUEST|KVM_PVM|KVM_INTEL|KVM_AMD)=' | tr '\n' ' ')"; fi
echo "guest kernel: $vmlinuz"
setsid qemu-system-x86_64 -machine q35 -accel kvm -cpu host -m 512 -smp 1 -nographic \
	-monitor none -qmp "unix:$tmp/qmp,server,nowait" -serial "file:$tmp/console" -nic none -no-reboot \
	-kernel "$vmlinuz" -append "console=ttyS0 earlyprintk=serial,ttyS0 loglevel=8 panic=-1" </dev/null >"$tmp/qemu.out" 2>&1 &
qpid=$!
for _ in $(seq 50); do [[ -S $tmp/qmp ]] && break; sleep 0.1; done
python3 - "$tmp/qmp" "$secs" "$tmp/console" <<'PY'
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile('rw'); f.readline()
def cmd(c, **a):
    f.write(json.dumps({"execute": c, "arguments": a} if a else {"execute": c}) + "\n"); f.flush()
    while True:
        r = json.loads(f.readline())
        if 'return' in r or 'error' in r:
            return r
cmd("qmp_capabilities")
t0 = time.time(); last = None; secs = float(sys.argv[2]); rate = 0
while time.time() - t0 < secs:
    ret = cmd("query-stats", target="vcpu").get('return') or []
    if not ret:
        time.sleep(0.5)
        continue
    st = {x['name']: x['value'] for x in ret[0]['stats']}
    regs = cmd("human-monitor-command", **{"command-line": "info registers"})['return']
    rip = ([l for l in regs.splitlines() if l.startswith('RIP')] or ['RIP=?'])[0].split()[0]
    now = time.time()
    if last:
        rate = (st['insn_emulation'] - last[1]) / (now - last[0])
    print(f"t={now - t0:5.1f}s {rip} insn_emulation={st['insn_emulation']} exits={st['exits']} emulated/s={rate:,.0f}", flush=True)
    last = (now, st['insn_emulation'])
    time.sleep(5)
con = open(sys.argv[3], 'rb').read().decode('latin1')
booted = 'Linux version' in con
print("console: " + ("the kernel printed 'Linux version'" if booted else f"no kernel line ({len(con)} bytes: firmware and the setup code only)"))
if booted:
    print("verdict: runs")
elif rate > 1000:
    print(f"verdict: emulated: KVM executes the guest instruction by instruction in its emulator (~{rate:,.0f}/s; TCG does hundreds of millions), so decompressing the kernel alone takes hours")
else:
    print("verdict: stalled (no emulation progress)")
PY
