#!/usr/bin/env bash
# The box has what the tests need (vagrant/build-box.sh); Go is not needed:
# make vm-test builds the test binaries on the host (static) and uploads them.
set -euo pipefail
uname -r
ip -br link
ethtool -i eth0 | head -1
