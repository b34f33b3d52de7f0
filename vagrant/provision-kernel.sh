#!/usr/bin/env bash
# Installs the bookworm-backports kernel (the VM reboots into it next).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
echo "deb http://deb.debian.org/debian bookworm-backports main" >/etc/apt/sources.list.d/backports.list
apt-get update -qq
apt-get install -y -qq -t bookworm-backports linux-image-amd64
