//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/xlimit/xlimit/bench/gen"
	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// receiver is one thing on the server side that gets the flood.
type receiver interface {
	name() string
	// counters are the receiver's own counts so far.
	counters() (counts, error)
	// close removes the receiver (programs, rules, processes).
	close() error
}

// counts are a receiver's own counters.
type counts struct {
	dropped uint64
	// admitted is counted by the sink rule (limitSpec.sinkAdmitted).
	admitted    uint64
	hasAdmitted bool
}

// limitSpec is what a limiting receiver enforces on UDP to sinkPort.
type limitSpec struct {
	rate, burst float64 // packets/s and packets
	perSource   bool    // a bucket per source address instead of one for all
	// sinkAdmitted counts and drops what the limiter admits with an
	// nftables rule at netdev ingress right behind it, so that admitted
	// packets cost little and rates the UDP stack could not absorb can be
	// measured.
	sinkAdmitted bool
}

// Receiver kinds, in report order.
const (
	rcvDrop     = "XDP_DROP (reference)"
	rcvNone     = "no filter"
	rcvXlimit   = "xlimit"
	rcvNftLimit = "nft limit (netdev ingress)"
	rcvNftMeter = "nft meter (netdev ingress)"
	rcvHashlim  = "iptables-nft hashlimit (raw PREROUTING)"
	rcvHashlimL = "iptables-legacy hashlimit (raw PREROUTING)"
	rcvNoProg   = "no program, GRO on"
)

// newReceiver sets up the receiver of the given kind on the server veth.
// Every kind but xlimit and "no program" gets the one-instruction XDP_PASS
// program in front of it (XDP_DROP for the reference): a veth accepts
// redirected XDP frames only while its peer has NAPI on, which an XDP
// program (xlimit's own, too) or GRO switches on.
func (e *env) newReceiver(ctx context.Context, kind string, l limitSpec) (receiver, error) {
	switch kind {
	case rcvDrop, rcvNone:
		k := gen.ReceiverPass
		if kind == rcvDrop {
			k = gen.ReceiverDrop
		}
		det, err := e.attachReceiver(k)
		if err != nil {
			return nil, err
		}
		return &xdpReceiver{label: kind, detach: det}, nil
	case rcvNoProg:
		if err := e.lab.Server.SetGRO(e.lab.ServerIf, true); err != nil {
			return nil, err
		}
		return &xdpReceiver{label: kind, detach: func() error { return e.lab.Server.SetGRO(e.lab.ServerIf, false) }}, nil
	case rcvXlimit:
		return e.startXlimit(ctx, l)
	case rcvNftLimit, rcvNftMeter, rcvHashlim, rcvHashlimL:
		return e.startNetfilter(ctx, kind, l)
	}
	return nil, fmt.Errorf("unknown receiver %q", kind)
}

// xdpReceiver is a reference XDP program (drop or pass) on the server veth.
type xdpReceiver struct {
	label  string
	detach func() error
}

func (x *xdpReceiver) name() string              { return x.label }
func (x *xdpReceiver) counters() (counts, error) { return counts{}, nil }
func (x *xdpReceiver) close() error              { return x.detach() }

// xlimitReceiver is the real daemon, `xlimit run`, in the server namespace
// with the run's private bpffs.
type xlimitReceiver struct {
	e      *env
	cmd    *exec.Cmd
	log    syncBuffer
	exited chan struct{}
	tables *maps.Tables
	slot   int
	sink   bool
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func xlimitRules(l limitSpec) string {
	if l.perSource {
		return fmt.Sprintf(`source_table_size: 131072
rules:
  - name: bench
    protocol: udp
    ports: [%d]
    rate: 100000000
    burst: 100000000
    per_source: {rate: %g, burst: %g}
`, sinkPort, l.rate, l.burst)
	}
	return fmt.Sprintf(`rules:
  - name: bench
    protocol: udp
    ports: [%d]
    rate: %g
    burst: %g
`, sinkPort, l.rate, l.burst)
}

func (e *env) startXlimit(ctx context.Context, l limitSpec) (_ *xlimitReceiver, err error) {
	x := &xlimitReceiver{e: e, exited: make(chan struct{}), sink: l.sinkAdmitted}
	rules := filepath.Join(e.dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(xlimitRules(l)), 0o600); err != nil {
		return nil, err
	}
	// Every path that is not the lab's own goes through flags: nothing is
	// written outside the run's directory and private bpffs.
	x.cmd = e.lab.Server.Command(context.Background(), e.xlimitBin, "run",
		"--config", rules, "--iface", e.lab.ServerIf, "--xdp-mode", "native",
		"--bpffs", e.bpffs, "--state-dir", filepath.Join(e.dir, "state"),
		"--metrics-addr", "", "--api-socket", "", "--detach-on-exit", "--log-level", "info")
	x.cmd.Stdout, x.cmd.Stderr = &x.log, &x.log
	// Dies with the bench, whatever happens to it (main runs on the main
	// thread, which never exits before the process).
	x.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := x.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start xlimit: %w", err)
	}
	go func() {
		_ = x.cmd.Wait()
		close(x.exited)
	}()
	defer func() {
		if err != nil {
			err = errors.Join(err, x.close())
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(x.log.String(), "msg=enforcing") {
		select {
		case <-x.exited:
			return nil, fmt.Errorf("xlimit exited before enforcing:\n%s", x.log.String())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("xlimit did not enforce within 20 s:\n%s", x.log.String())
		}
	}
	if x.tables, err = maps.OpenPinned(loader.PinDir(e.bpffs, e.lab.ServerIf), true); err != nil {
		return nil, err
	}
	plan, err := x.tables.ReadPlan()
	if err != nil {
		return nil, err
	}
	if x.slot = plan.Slot("bench"); x.slot < 0 {
		return nil, fmt.Errorf("xlimit: rule bench not in the plan")
	}
	if x.sink {
		if err := e.nftApply(ctx, "", true); err != nil {
			return nil, err
		}
	}
	return x, nil
}

func (x *xlimitReceiver) name() string { return rcvXlimit }

func (x *xlimitReceiver) counters() (counts, error) {
	c, err := x.tables.Counters(x.slot)
	if err != nil {
		return counts{}, err
	}
	out := counts{dropped: c.Packets[dataplane.VerdictDrop]}
	if x.sink {
		_, admitted, err := x.e.nftCounters()
		if err != nil {
			return out, err
		}
		out.admitted, out.hasAdmitted = admitted, true
	}
	return out, nil
}

func (x *xlimitReceiver) close() error {
	var errs []error
	if x.tables != nil {
		errs = append(errs, x.tables.Close())
		x.tables = nil
	}
	select {
	case <-x.exited:
	default:
		_ = x.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-x.exited:
		case <-time.After(10 * time.Second):
			_ = x.cmd.Process.Kill()
			<-x.exited
		}
	}
	if x.sink {
		if _, err := x.e.serverRun(context.Background(), "", "nft", "flush", "ruleset"); err != nil {
			errs = append(errs, err)
		}
	}
	// --detach-on-exit detached it; a killed daemon leaves pins behind.
	if _, err := os.Stat(loader.PinDir(x.e.bpffs, x.e.lab.ServerIf)); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := x.e.lab.Server.Command(ctx, x.e.xlimitBin, "detach", "--iface", x.e.lab.ServerIf, "--bpffs", x.e.bpffs).CombinedOutput()
		if err != nil {
			errs = append(errs, fmt.Errorf("xlimit detach: %v: %s", err, out))
		}
	}
	return errors.Join(errs...)
}

// netfilterReceiver is an nftables or iptables rule in the server
// namespace (only there: the lab's namespaces are this run's own), behind
// the XDP_PASS program.
type netfilterReceiver struct {
	e      *env
	kind   string
	sink   bool
	detach func() error
}

// serverRun runs a command in the server namespace and returns its output.
func (e *env) serverRun(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// At the highest priority: counters are read during the flood, whose
	// threads keep every CPU busy, and a starved command stretches the
	// moment it describes over seconds.
	cmd := exec.CommandContext(ctx, "nice", append([]string{"-n", "-20", "nsenter", "--net=" + e.lab.Server.Path, "--", name}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (e *env) startNetfilter(ctx context.Context, kind string, l limitSpec) (_ *netfilterReceiver, err error) {
	det, err := e.attachReceiver(gen.ReceiverPass)
	if err != nil {
		return nil, err
	}
	n := &netfilterReceiver{e: e, kind: kind, sink: l.sinkAdmitted, detach: det}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.close())
		}
	}()
	rate, burst := int64(l.rate), max(int64(l.burst), 1)
	switch kind {
	case rcvNftLimit, rcvNftMeter:
		match := fmt.Sprintf("limit rate over %d/second burst %d packets", rate, burst)
		if kind == rcvNftMeter {
			match = fmt.Sprintf("meter xlbench_m size 131072 { ip saddr %s }", match)
		}
		if err := e.nftApply(ctx, fmt.Sprintf("udp dport %d %s counter name \"dropped\" drop", sinkPort, match), l.sinkAdmitted); err != nil {
			return nil, err
		}
	case rcvHashlim, rcvHashlimL:
		if l.sinkAdmitted {
			return nil, fmt.Errorf("%s: no sink rule after iptables", kind)
		}
		if _, err := e.serverRun(ctx, "", iptablesCmd(kind), "-t", "raw", "-A", "PREROUTING",
			"-p", "udp", "--dport", strconv.Itoa(sinkPort),
			"-m", "hashlimit", "--hashlimit-name", "xlbench", "--hashlimit-mode", "srcip",
			"--hashlimit-above", fmt.Sprintf("%d/sec", rate), "--hashlimit-burst", strconv.FormatInt(burst, 10),
			"--hashlimit-htable-size", "65536", "--hashlimit-htable-max", "131072",
			"-j", "DROP"); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (n *netfilterReceiver) name() string { return n.kind }

func (n *netfilterReceiver) counters() (counts, error) {
	ctx := context.Background()
	if n.kind == rcvHashlim || n.kind == rcvHashlimL {
		out, err := n.e.serverRun(ctx, "", iptablesCmd(n.kind), "-t", "raw", "-nvxL", "PREROUTING")
		if err != nil {
			return counts{}, err
		}
		for _, line := range strings.Split(out, "\n") {
			fs := strings.Fields(line)
			if len(fs) > 3 && fs[2] == "DROP" {
				v, err := strconv.ParseUint(fs[0], 10, 64)
				return counts{dropped: v}, err
			}
		}
		return counts{}, fmt.Errorf("no DROP rule in:\n%s", out)
	}
	dropped, admitted, err := n.e.nftCounters()
	return counts{dropped: dropped, admitted: admitted, hasAdmitted: n.sink}, err
}

// nftApply creates the table netdev xlbench in the server namespace with
// one chain at ingress of the server veth holding rule (if not empty) and,
// with sink, last the sink rule that counts and drops what reaches it.
func (e *env) nftApply(ctx context.Context, rule string, sink bool) error {
	if sink {
		rule += fmt.Sprintf("\n\t\tudp dport %d counter name \"admitted\" drop", sinkPort)
	}
	ruleset := fmt.Sprintf(`table netdev xlbench {
	counter dropped {
	}
	counter admitted {
	}
	chain ingress {
		type filter hook ingress device "%s" priority 0; policy accept;
		%s
	}
}
`, e.lab.ServerIf, rule)
	_, err := e.serverRun(ctx, ruleset, "nft", "-f", "-")
	return err
}

// nftCounters reads the named counters dropped and admitted of table
// netdev xlbench. Named counters are listed without the table's sets: a
// meter's set holds an element per source, and listing it would take
// seconds.
func (e *env) nftCounters() (dropped, admitted uint64, err error) {
	out, err := e.serverRun(context.Background(), "", "nft", "-j", "-t", "list", "counters", "table", "netdev", "xlbench")
	if err != nil {
		return 0, 0, err
	}
	var doc struct {
		Nftables []struct {
			Counter *struct {
				Name    string `json:"name"`
				Packets uint64 `json:"packets"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return 0, 0, fmt.Errorf("parse nft -j: %w", err)
	}
	found := 0
	for _, it := range doc.Nftables {
		switch c := it.Counter; {
		case c == nil:
		case c.Name == "dropped":
			dropped, found = c.Packets, found+1
		case c.Name == "admitted":
			admitted, found = c.Packets, found+1
		}
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("nft: counters missing in:\n%s", out)
	}
	return dropped, admitted, nil
}

// close removes the rules: the whole ruleset of the server namespace,
// which this run created and which holds nothing else.
func (n *netfilterReceiver) close() error {
	ctx := context.Background()
	var errs []error
	if n.kind == rcvHashlim || n.kind == rcvHashlimL {
		if _, err := n.e.serverRun(ctx, "", iptablesCmd(n.kind), "-t", "raw", "-F", "PREROUTING"); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := n.e.serverRun(ctx, "", "nft", "flush", "ruleset"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(append(errs, n.detach())...)
}

// iptablesCmd is the iptables variant of a hashlimit receiver.
func iptablesCmd(kind string) string {
	if kind == rcvHashlimL {
		return "iptables-legacy"
	}
	return "iptables-nft"
}
