#!/bin/sh
# The guest's half of the real-host scenarios (copied to /xl/guest.sh on the
# payload disk): `sh /xl/guest.sh COMMAND ARGS`. Prints key=value lines or
# the raw output the host side parses.
set -eu
XL=/xl
cmd=$1
shift

xdp_rx() { # every receive queue's XDP packet count: "rxN=COUNT ..."
	printf 't=%s ' "$(date +%s%3N)"
	ethtool -S eth0 | awk '$1 ~ /^rx[0-9]+_xdp_packets:$/ {sub(/_xdp_packets:/, "", $1); printf "%s=%s ", $1, $2} END {print ""}'
}

xl_stop() {
	pkill -9 -x xlimit 2>/dev/null || true
	sleep 0.5
	"$XL/xlimit" detach --iface eth0 >/dev/null 2>&1 || true
	ip link set dev eth0 xdp off 2>/dev/null || true
}

case $cmd in
setup)
	mkdir -p /root/xl
	ip route replace default via 10.77.0.1
	cp "$XL/nginx-site.conf" /etc/nginx/sites-enabled/default
	systemctl restart nginx
	pkill -x app 2>/dev/null || true
	setsid "$XL/app" -listen 127.0.0.1:8081 -workers "${1:-2}" -work "${2:-20ms}" -queue-timeout 1s >/root/xl/app.log 2>&1 </dev/null &
	nft delete table inet xlrh 2>/dev/null || true
	sleep 1
	curl -s -o /dev/null -w 'page=%{http_code} ' http://127.0.0.1/
	curl -s -o /dev/null -w 'work=%{http_code}\n' http://127.0.0.1/work
	;;
xl-start) # RULES_FILE: the daemon from the payload, native XDP
	xl_stop
	cp "$1" /root/xl/rules.yaml
	setsid "$XL/xlimit" run --config /root/xl/rules.yaml --xdp-mode native >/root/xl/xlimit.log 2>&1 </dev/null &
	i=0
	until grep -q '"enforcing\|msg=enforcing' /root/xl/xlimit.log; do
		i=$((i + 1))
		[ $i -lt 240 ] || { echo "xlimit did not start:"; cat /root/xl/xlimit.log; exit 1; }
		sleep 0.5
	done
	grep -o 'mode=[a-z]*' /root/xl/xlimit.log | head -1
	ip -d link show eth0 | grep -o 'prog/xdp[a-z]* id [0-9]*'
	;;
xl-stop) xl_stop ;;
xl-status) "$XL/xlimit" status ;;
nft-limit) # RATE: nftables' limit on UDP port 9000 beside nothing else
	nft delete table inet xlrh 2>/dev/null || true
	nft -f - <<EOF
table inet xlrh {
	chain in {
		type filter hook input priority 0;
		udp dport 9000 limit rate $1/second accept
		udp dport 9000 counter drop
	}
}
EOF
	;;
nft-clear) nft delete table inet xlrh 2>/dev/null || true ;;
udp-measure) # DURATION_S INTERVAL: XDP's per-queue counts around a sampler run
	echo "xdp_before $(xdp_rx)"
	echo "t_before $(date +%s%3N)"
	"$XL/sampler" -port 9000 -interval "$2" -duration "${1}s"
	echo "t_after $(date +%s%3N)"
	echo "xdp_after $(xdp_rx)"
	;;
xdp-rx) xdp_rx ;;
app-stats) curl -s http://127.0.0.1:8081/stats ;;
ethtool-S) ethtool -S eth0 ;;
*)
	echo "guest.sh: unknown command $cmd" >&2
	exit 2
	;;
esac
