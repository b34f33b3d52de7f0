#!/usr/bin/env bash
# Builds the Debian 12 guest that `make vm-test` (Vagrant, vagrant-libvirt)
# and `make real-host` (qemu directly) boot: no box can be downloaded here,
# so it is made from Debian packages with mmdebstrap, like
# packaging/system-test's guest.
#
#   vagrant/build-box.sh            writes build/box/ (cached by package list)
#
# Output in build/box/:
#   rootfs.qcow2     the whole disk: one ext4 filesystem, no partition table
#                    (the kernel is booted directly, root=/dev/vda)
#   vmlinuz, initrd.img   the guest's kernel (Debian 12's 6.12 cloud kernel:
#                    virtio-net, native XDP, bpf_sk_assign_tcp_reqsk of 6.9)
#                    and its initramfs-tools initrd, copied out of the root
#   xlimit.box       the libvirt box (metadata.json, Vagrantfile, box.img)
#   id_ed25519       the key root and vagrant accept (a fresh one per build;
#                    the box also accepts Vagrant's well-known insecure key,
#                    which vagrant replaces on first boot)
# Knobs: BOX_KERNEL (a linux-image package; default the newest 6.12 cloud
# kernel in the apt index), BOX_SIZE (default 6G).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
out=$repo/build/box
BOX_SIZE=${BOX_SIZE:-6G}
log() { printf '== build-box: %s\n' "$*" >&2; }
die() {
	printf 'build-box: %s\n' "$*" >&2
	exit 3
}
[[ $(id -u) == 0 ]] || die "needs root (mmdebstrap, mke2fs -d of a root-owned tree)"
for c in mmdebstrap:mmdebstrap qemu-img:qemu-utils mke2fs:e2fsprogs ssh-keygen:openssh-client; do
	command -v "${c%%:*}" >/dev/null || die "${c%%:*} not found: install the Debian package ${c#*:}"
done
kernel=${BOX_KERNEL:-$(apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$' | cut -d' ' -f1 | sort -V | tail -1)}
[[ -n $kernel ]] || die "no linux-image-6.12.*-cloud-amd64-unsigned in the apt index (apt-get update)"
# What the guest runs: systemd, the servers of the real-host scenarios
# (nginx, the app is copied in per run), nftables for the comparison,
# ethtool for the queues, ssh and rsync for Vagrant.
packages=$kernel,initramfs-tools,systemd,systemd-sysv,dbus,udev,kmod,iproute2,procps,ethtool,nftables,nginx-light,openssh-server,sudo,rsync,curl,ca-certificates,netbase,less
sources=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[[ -n $sources ]] || sources=$(grep -h '^deb ' /etc/apt/sources.list 2>/dev/null || true)
[[ -n $sources ]] || die "no apt sources on this host for mmdebstrap"
key=$(printf '%s\n%s\n%s\n%s\n' "$packages" "$sources" "$(sha256sum "$0" | cut -c1-16)" "$(cd "$here/guest" && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum)" | sha256sum | cut -c1-12)
mkdir -p "$out"
exec 8>"$out/.lock"
flock 8
if [[ -f $out/.built-$key && -f $out/rootfs.qcow2 ]]; then
	log "up to date: $out (key $key)"
	exit 0
fi
rm -f "$out"/.built-*
t0=$(date +%s)
work=$(mktemp -d "$out/work.XXXXXX")
trap 'rm -rf "$work"' EXIT
[[ -f $out/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C xlimit-box -f "$out/id_ed25519"
insecure=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub 2>/dev/null | head -1 || true)
{
	cat "$out/id_ed25519.pub"
	[[ -n $insecure ]] && cat "$insecure"
} >"$work/authorized_keys"
printf '%s\n' "$sources" >"$work/sources"
log "mmdebstrap bookworm ($kernel and $(tr ',' '\n' <<<"$packages" | wc -l) packages)"
mmdebstrap --quiet --variant=minbase --include="$packages" \
	--aptopt='Acquire::Check-Valid-Until "false"' \
	--customize-hook='echo xlimit-guest >"$1/etc/hostname"' \
	--customize-hook='printf "127.0.0.1 localhost\n127.0.1.1 xlimit-guest\n" >"$1/etc/hosts"' \
	--customize-hook='echo "/dev/vda / ext4 rw,relatime 0 1" >"$1/etc/fstab"' \
	--customize-hook="mkdir -p \"\$1/root/.ssh\" && cp $work/authorized_keys \"\$1/root/.ssh/authorized_keys\" && chmod 700 \"\$1/root/.ssh\"" \
	--customize-hook='chroot "$1" useradd -m -s /bin/bash vagrant' \
	--customize-hook="mkdir -p \"\$1/home/vagrant/.ssh\" && cp $work/authorized_keys \"\$1/home/vagrant/.ssh/authorized_keys\" && chroot \"\$1\" chown -R vagrant:vagrant /home/vagrant/.ssh && chmod 700 \"\$1/home/vagrant/.ssh\"" \
	--customize-hook='echo "vagrant ALL=(ALL) NOPASSWD: ALL" >"$1/etc/sudoers.d/vagrant" && chmod 440 "$1/etc/sudoers.d/vagrant"' \
	--customize-hook='printf "root:xlimit\nvagrant:vagrant\n" | chroot "$1" chpasswd' \
	--customize-hook="cp -a $here/guest/. \"\$1/\"" \
	--customize-hook='chroot "$1" systemctl enable systemd-networkd ssh xlimit-net.service' \
	--customize-hook='chroot "$1" systemctl disable nginx apt-daily.timer apt-daily-upgrade.timer e2scrub_reap.service 2>/dev/null || true' \
	--customize-hook='rm -f "$1"/etc/ssh/ssh_host_*' \
	--customize-hook='chroot "$1" ssh-keygen -A' \
	--customize-hook="cp \"\$1\"/boot/vmlinuz-* $work/vmlinuz && cp \"\$1\"/boot/initrd.img-* $work/initrd.img" \
	bookworm "$work/rootfs" "$work/sources" || die "mmdebstrap failed"
log "ext4 image ($BOX_SIZE)"
truncate -s "$BOX_SIZE" "$work/rootfs.raw"
mke2fs -q -t ext4 -L xlimit-root -d "$work/rootfs" "$work/rootfs.raw" || die "mke2fs -d failed"
qemu-img convert -O qcow2 "$work/rootfs.raw" "$work/box.img"
rm -f "$work/rootfs.raw"
rm -rf "$work/rootfs"
# The libvirt box: the disk, its metadata and a Vagrantfile that boots the
# kernel directly (the disk has no boot loader).
cat >"$work/metadata.json" <<JSON
{"provider": "libvirt", "format": "qcow2", "virtual_size": ${BOX_SIZE%G}}
JSON
cat >"$work/Vagrantfile" <<'RUBY'
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |lv|
    lv.driver = "qemu"          # TCG where /dev/kvm cannot run a stock kernel
    lv.disk_bus = "virtio"
  end
end
RUBY
tar -C "$work" -cf "$work/xlimit.box" metadata.json Vagrantfile box.img
mv "$work/box.img" "$out/rootfs.qcow2"
mv "$work/vmlinuz" "$work/initrd.img" "$work/xlimit.box" "$out/"
touch "$out/.built-$key"
log "built in $(($(date +%s) - t0))s: $out ($(du -sh "$out/rootfs.qcow2" | cut -f1) disk)"
