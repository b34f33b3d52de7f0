#!/usr/bin/env bash
# man.sh XLIMIT VERSION: prints the xlimit(8) man page, generated from
# `xlimit --help` and every command's `--help`, so it never disagrees with
# the binary it ships with.
set -euo pipefail
bin=$1 version=$2

# roff-escape a verbatim line: backslashes, and a leading . or ' that roff
# would take for a request.
esc() { sed -e 's/\\/\\e/g' -e "s/^\([.']\)/\\\\\&\1/"; }

top=$("$bin" --help 2>&1)
cmds=$(awk '/^Commands:/{on=1; next} on && /^  [a-z]/{print $1} on && /^$/{on=0}' <<<"$top")
[[ -n $cmds ]] || { echo "man.sh: no commands in '$bin --help'" >&2; exit 1; }

date=$(date -u -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}" +%Y-%m-%d)
cat <<EOF2
.TH XLIMIT 8 "$date" "xlimit $version" "System Administration"
.SH NAME
xlimit \- eBPF/XDP rate limiting for a host's ports
.SH SYNOPSIS
.B xlimit
.I COMMAND
.RI [ flags ]
.SH DESCRIPTION
This page is generated from the program's own
.B \-\-help
output.
.PP
.nf
EOF2
esc <<<"$top"
echo ".fi"
echo ".SH COMMANDS"
for c in $cmds; do
	echo ".SS \"xlimit $c\""
	echo ".nf"
	"$bin" "$c" --help 2>&1 | esc
	echo ".fi"
done
cat <<'EOF2'
.SH FILES
.TP
.I /etc/xlimit/rules.yaml
the rules (see /usr/share/doc/xlimit/config.md.gz); as installed it protects nothing
.TP
.I /var/lib/xlimit
last good rules and rules put through the API
.TP
.I /sys/fs/bpf/xlimit/IFACE
the pinned program, link and maps: protection outlives the daemon
.TP
.I /run/xlimit/api.sock
the local API (root only)
.SH SEE ALSO
.BR systemctl (1),
.BR journalctl (1);
/usr/share/doc/xlimit/operations.md.gz,
/usr/share/xlimit/prometheus/xlimit-alerts.yaml,
/usr/share/xlimit/grafana/xlimit-dashboard.json
EOF2
