//go:build linux && xlimit_demo

package main

// `xlimit demo`: xlimit's main job on a built-in default, in namespaces of
// its own. It runs on the test kit's lab (tests/kit/lab), so only builds
// with the tag xlimit_demo (make build, make build-test) carry it; the
// release builds (make build-release, make deb, make image) run
// demo_release.go's runDemo instead.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/daemon"
	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

const demoRules = `# The demo's rules: a UDP service limited to %[1]d packets/s, new TCP
# connections to the web port limited to 200/s, and the web port's packets
# otherwise free.
rules:
  - name: udp-service
    protocol: udp
    ports: [%[2]d]
    rate: %[1]d
  - name: web-syn
    protocol: tcp
    ports: [%[3]d]
    syn_only: true
    rate: 200
`

// runDemo builds two network namespaces joined by a veth pair, starts a UDP
// and a TCP service in one, attaches xlimit to its veth, floods the UDP
// service from the other while a client keeps using the TCP service,
// prints live figures to w, then removes everything it created. It needs
// root and touches nothing it did not create.
func runDemo(ctx context.Context, w io.Writer, o demoOptions) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("demo needs root: it creates network namespaces and attaches XDP")
	}
	dur, rate, offered, ipv6 := o.Duration, o.Rate, o.Offered, o.IPv6
	const udpPort, tcpPort = 9000, 8080
	fmt.Fprintln(w, "xlimit demo: creating two network namespaces joined by a veth pair ...")
	l, err := lab.New(lab.Options{Prefix: "xldemo"})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, l.Close()) }()

	dir, err := os.MkdirTemp("", "xlimit-demo")
	if err != nil {
		return fmt.Errorf("create demo directory: %w", err)
	}
	defer os.RemoveAll(dir)
	bpffs := filepath.Join(dir, "bpffs")
	if err := loader.EnsureBPFFS(bpffs); err != nil {
		return err
	}
	defer func() {
		if uerr := unix.Unmount(bpffs, unix.MNT_DETACH); uerr != nil {
			err = errors.Join(err, fmt.Errorf("unmount demo bpffs: %w", uerr))
		}
	}()

	server := l.ServerIP4
	if ipv6 {
		server = l.ServerIP6
	}
	udp, err := lab.ListenUDPCounter(l.Server, netip.AddrPortFrom(server, udpPort))
	if err != nil {
		return err
	}
	defer udp.Close()
	web, err := lab.ListenTCPEcho(l.Server, netip.AddrPortFrom(server, tcpPort))
	if err != nil {
		return err
	}
	defer web.Close()

	rulesText := fmt.Sprintf(demoRules, rate, udpPort, tcpPort)
	cfg, err := config.Parse("demo.yaml", []byte(rulesText))
	if err != nil {
		return fmt.Errorf("demo rules: %w", err)
	}
	plan, err := dataplane.Compile(daemon.Translate(cfg).Dataplane, nil)
	if err != nil {
		return err
	}
	var a *loader.Attachment
	if err := l.Server.Do(func() error {
		var err error
		a, err = loader.Attach(l.ServerIf, loader.Options{BPFFS: bpffs})
		return err
	}); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, a.Close(), loader.Detach(bpffs, l.ServerIf))
	}()
	if err := a.Tables().Apply(plan); err != nil {
		return err
	}
	fmt.Fprintf(w, "server %s (namespace %s), client %s (namespace %s)\n", server, l.Server.Name, l.ClientIP4, l.Client.Name)
	fmt.Fprintf(w, "xlimit attached to %s in %s mode with these rules:\n\n%s\n", l.ServerIf, a.Mode, rulesText)
	fmt.Fprintf(w, "flooding udp/%d for %v while a client opens a TCP connection to :%d every 50 ms ...\n\n", udpPort, dur, tcpPort)

	ctx, cancel := context.WithTimeout(ctx, dur+10*time.Second)
	defer cancel()
	spec := l.ClientFlood(ipv6)
	spec.Proto, spec.DstPort, spec.PayloadLen, spec.Rate, spec.Duration = lab.ProtoUDP, udpPort, 64, offered, dur
	floodDone := make(chan lab.FloodResult, 1)
	floodErr := make(chan error, 1)
	go func() {
		res, err := lab.Flood(ctx, spec)
		floodDone <- res
		floodErr <- err
	}()
	probeDone := make(chan lab.ProbeResult, 1)
	pctx, pcancel := context.WithTimeout(ctx, dur)
	defer pcancel()
	go func() {
		res, _ := lab.TCPProbe(pctx, l.Client, web.Addr(), 0, 50*time.Millisecond, time.Second)
		probeDone <- res
	}()

	t := a.Tables()
	slot := plan.Slot("udp-service")
	prev, err := t.AllCounters()
	if err != nil {
		return err
	}
	prevRx := udp.Count()
	fmt.Fprintf(w, "%5s  %12s  %12s  %12s  %14s\n", "time", "xdp pass/s", "xdp drop/s", "udp rx/s", "web accepted")
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var res lab.FloodResult
	for i := 1; ; i++ {
		done := false
		select {
		case <-tick.C:
		case res = <-floodDone:
			done = true
		case <-ctx.Done():
			return ctx.Err()
		}
		cur, err := t.AllCounters()
		if err != nil {
			return err
		}
		d := cur[slot].Sub(prev[slot])
		rx := udp.Count()
		if !done {
			fmt.Fprintf(w, "%4ds  %12d  %12d  %12d  %14d\n", i, d.Packets[dataplane.VerdictPass], d.Packets[dataplane.VerdictDrop], rx-prevRx, web.Accepted())
		}
		prev, prevRx = cur, rx
		if done {
			break
		}
	}
	if err := <-floodErr; err != nil {
		return err
	}
	probe := <-probeDone
	udp.Settle(200*time.Millisecond, 2*time.Second)
	total, _ := t.Counters(slot)
	fmt.Fprintf(w, "\nflood: %d packets in %v (%.0f packets/s offered)\n", res.Sent, res.Elapsed.Round(time.Millisecond), res.PPS())
	fmt.Fprintf(w, "xdp:   %d passed, %d dropped before the kernel's stack saw them\n", total.Packets[dataplane.VerdictPass], total.Packets[dataplane.VerdictDrop])
	fmt.Fprintf(w, "udp service received %d packets: its %d-packet burst and then %.0f/s (limit %d/s)\n",
		udp.Count(), rate, (float64(udp.Count())-float64(rate))/res.Elapsed.Seconds(), rate)
	fmt.Fprintf(w, "web service: %d of %d connections succeeded, p99 %v\n", probe.Successes, probe.Attempts, probe.LatencyPercentile(0.99).Round(time.Microsecond))
	fmt.Fprintln(w, "\ncleaning up: detaching, removing the namespaces ...")
	return nil
}
