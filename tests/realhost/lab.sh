#!/usr/bin/env bash
# A lab guest that stays up between commands (for working on the scenarios):
#   tests/realhost/lab.sh up | down | ssh CMD... | ns CMD...
# State in /tmp/xlrh-lab; namespace xlrh-lab. `down` removes everything.
RH_NS=xlrh-lab
RH_WORK=/tmp/xlrh-lab
RH_KEEP=0
mkdir -p "$RH_WORK"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
case ${1:-} in
up) rh_up ;;
down) rh_down ;;
ssh) shift; rh_ssh "$@" ;;
scp) shift; rh_scp "$@" ;;
ns) shift; rh_ns "$@" ;;
*) echo "usage: lab.sh up|down|ssh CMD|scp SRC DST|ns CMD" >&2; exit 2 ;;
esac
