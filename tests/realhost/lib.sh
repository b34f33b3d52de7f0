# shellcheck shell=bash
# The real-host lab: one Debian 12 guest (build/box, vagrant/build-box.sh)
# under qemu, its virtio-net NIC on a multi-queue tap inside a network
# namespace of its own (xlrh-$$): the floods and clients run in that
# namespace, so no packet of the lab reaches the host's interfaces.
#
#   RH_ACCEL   tcg (default; docs/realhost.md says why not kvm here) or kvm
#   RH_SMP     guest CPUs (default 2), RH_MEM (default 1536M)
#   RH_QUEUES  virtio-net queue pairs on the device (default 4: 2 for the
#              guest's 2 CPUs, 2 more for XDP_TX, which wants one per CPU)
#   RH_COMBINED queue pairs the guest uses (ethtool -L, default 4: every
#               queue the tap feeds; with 2 of 4 in use, TCP flows the tap
#               hashes to an unused queue are lost without XDP)
set -euo pipefail
RH_ACCEL=${RH_ACCEL:-tcg}
RH_SMP=${RH_SMP:-2}
RH_MEM=${RH_MEM:-1536M}
RH_QUEUES=${RH_QUEUES:-4}
RH_COMBINED=${RH_COMBINED:-4}
rh_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rh_repo=$(cd "$rh_here/../.." && pwd)
rh_box=$rh_repo/build/box
RH_NS=${RH_NS:-xlrh$$}
RH_HOST_IP=10.77.0.1
RH_GUEST_IP=10.77.0.2
# The management NIC (ssh): a second virtio-net device on a tap of its own,
# so that a flood filling eth0's tap queue does not cut the control channel.
RH_MGMT_HOST_IP=10.78.0.1
RH_MGMT_IP=10.78.0.2
RH_WORK=${RH_WORK:-$(mktemp -d /tmp/xlrh.XXXXXX)}
rh_qpid=

rh_log() { printf '== realhost %s: %s\n' "$(date +%T)" "$*" >&2; }
rh_die() {
	printf 'realhost: %s\n' "$*" >&2
	exit 3
}

# rh_ns CMD...: run in the lab's namespace (the host side of the tap).
rh_ns() { ip netns exec "$RH_NS" "$@"; }

# rh_ssh CMD: run a shell command in the guest as root.
rh_ssh() {
	ip netns exec "$RH_NS" ssh -q -i "$rh_box/id_ed25519" -o StrictHostKeyChecking=no \
		-o UserKnownHostsFile=/dev/null -o ConnectTimeout=20 -o ServerAliveInterval=10 \
		-o ServerAliveCountMax=12 -o BatchMode=yes -o ControlMaster=auto \
		-o ControlPath="$RH_WORK/ssh.sock" -o ControlPersist=yes root@"$RH_MGMT_IP" "$@"
}

# rh_scp SRC... DST: copy files into the guest (DST is a guest path).
rh_scp() {
	local dst=${*: -1}
	ip netns exec "$RH_NS" scp -q -i "$rh_box/id_ed25519" -o StrictHostKeyChecking=no \
		-o UserKnownHostsFile=/dev/null -o BatchMode=yes "${@:1:$#-1}" root@"$RH_MGMT_IP":"$dst"
}

# rh_up: the namespace, the guest booted on an overlay of the box's disk,
# ssh answering. Prints how long the boot took.
rh_up() {
	[[ -f $rh_box/rootfs.qcow2 ]] || rh_die "no $rh_box/rootfs.qcow2: run vagrant/build-box.sh"
	ip netns add "$RH_NS"
	rh_ns ip link set lo up
	qemu-img create -q -f qcow2 -F qcow2 -b "$rh_box/rootfs.qcow2" "$RH_WORK/disk.qcow2"
	local accel=$RH_ACCEL cpu=max
	[[ $accel == tcg ]] && accel=tcg,thread=multi
	[[ $RH_ACCEL == kvm ]] && cpu=host
	local vectors=$((2 * RH_QUEUES + 2))
	rh_log "booting the guest ($RH_ACCEL, $RH_SMP CPUs, $RH_MEM, virtio-net $RH_QUEUES queue pairs, $RH_COMBINED in use)"
	rh_t0=$(date +%s)
	# The tap: multi-queue (one fd per queue pair), no vhost (the host
	# kernel has no vhost-net), the guest's offloads off so that virtio_net
	# accepts a native XDP program (it refuses XDP while the host may hand
	# it GRO'd frames); rss=on: the device hashes each flow (Toeplitz,
	# the guest's key and indirection table) to a receive queue.
	setsid ip netns exec "$RH_NS" qemu-system-x86_64 -machine q35 -accel "$accel" -cpu "$cpu" \
		-smp "$RH_SMP" -m "$RH_MEM" -nographic -monitor none -serial "file:$RH_WORK/console.log" \
		-no-reboot -kernel "$rh_box/vmlinuz" -initrd "$rh_box/initrd.img" \
		-append "root=/dev/vda rw console=ttyS0 net.ifnames=0 xlnet=$RH_GUEST_IP/24,$RH_COMBINED xlmgmt=$RH_MGMT_IP/24 panic=-1 quiet" \
		-drive "file=$RH_WORK/disk.qcow2,if=virtio,format=qcow2,cache=unsafe" ${RH_EXTRA_DRIVES:-} \
		-netdev "tap,id=n0,ifname=xltap0,script=no,downscript=no,queues=$RH_QUEUES,vhost=off" \
		-device "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:02,mq=on,vectors=$vectors,rss=on,hash=on,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off" \
		-netdev "tap,id=n1,ifname=xlmgmt0,script=no,downscript=no,vhost=off" \
		-device "virtio-net-pci,netdev=n1,mac=52:54:00:78:00:02" \
		</dev/null >"$RH_WORK/qemu.out" 2>&1 &
	rh_qpid=$!
	echo "$rh_qpid" >"$RH_WORK/qemu.pid"
	for _ in $(seq 100); do rh_ns ip link show xltap0 >/dev/null 2>&1 && break; sleep 0.2; done
	rh_ns ip link show xltap0 >/dev/null 2>&1 || rh_die "qemu made no tap: $(cat "$RH_WORK/qemu.out")"
	rh_ns ip addr add "$RH_HOST_IP/24" dev xltap0
	rh_ns ip link set xltap0 up
	for _ in $(seq 50); do rh_ns ip link show xlmgmt0 >/dev/null 2>&1 && break; sleep 0.2; done
	rh_ns ip addr add "$RH_MGMT_HOST_IP/24" dev xlmgmt0
	rh_ns ip link set xlmgmt0 up
	local deadline=$(($(date +%s) + ${RH_BOOT_TIMEOUT:-600}))
	until rh_ssh true 2>/dev/null; do
		kill -0 "$rh_qpid" 2>/dev/null || rh_die "qemu exited: $(tail -c 2000 "$RH_WORK/console.log")"
		(($(date +%s) < deadline)) || rh_die "the guest did not answer ssh within ${RH_BOOT_TIMEOUT:-600}s"
		sleep 3
	done
	rh_boot_s=$(($(date +%s) - rh_t0))
	if [[ -n ${RH_EXTRA_DRIVES:-} ]]; then
		rh_ssh 'mkdir -p /xl && mount -o ro,noload /dev/vdb /xl'
	fi
	rh_log "guest up in ${rh_boot_s}s: $(rh_ssh 'uname -r; nproc' | tr '\n' ' ')"
}

# rh_down: the guest, its namespace and its overlay gone (idempotent).
rh_down() {
	[[ -z $rh_qpid && -f $RH_WORK/qemu.pid ]] && rh_qpid=$(cat "$RH_WORK/qemu.pid")
	if [[ -n $rh_qpid ]] && kill -0 "$rh_qpid" 2>/dev/null; then
		kill -TERM -- -"$rh_qpid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$rh_qpid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL -- -"$rh_qpid" 2>/dev/null || true
		wait "$rh_qpid" 2>/dev/null || true
	fi
	rh_qpid=
	ip netns pids "$RH_NS" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
	ip netns del "$RH_NS" 2>/dev/null || true
	[[ ${RH_KEEP:-0} == 1 ]] || rm -rf "$RH_WORK"
}
