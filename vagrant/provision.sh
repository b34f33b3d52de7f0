#!/usr/bin/env bash
# Installs Go and the packages the test suite needs, the same ones CI uses.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
GO_VERSION=1.26.8
if ! /usr/local/go/bin/go version 2>/dev/null | grep -q "go${GO_VERSION}"; then
	curl -fsSL "https://go.dev/dl/go${GO_VERSION}.linux-amd64.tar.gz" | tar -C /usr/local -xz
fi
echo 'export PATH=/usr/local/go/bin:$PATH' >/etc/profile.d/go.sh
cd /xlimit
PATH=/usr/local/go/bin:$PATH make deps
uname -r
