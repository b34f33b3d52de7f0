//go:build linux

package maps

import (
	"net/netip"

	"github.com/xlimit/xlimit/tests/kit/corpus"
	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The crafted frames of TestFrames (and the seed corpus of FuzzXDP) are
// tests/kit/corpus, shared with the live end-to-end test
// (tests/malformed_test.go). These are the names the kernel tests use.

var srcA4, srcA6 = corpus.SrcA4, corpus.SrcA6

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func ports(lo, hi uint16) []dataplane.PortRange { return corpus.Ports(lo, hi) }

func baseSpec() *dataplane.Spec { return corpus.BaseSpec() }

func frameSpecsByName() map[string]*dataplane.Spec { return corpus.Specs() }

func udpTo(src netip.Addr, port uint16) frame.Spec { return corpus.UDPTo(src, port) }

func build(s frame.Spec) []byte { return frame.MustBuild(s) }

const (
	synFlags    = corpus.SynFlags
	synAckFlags = corpus.SynAckFlags
	ackFlags    = corpus.AckFlags
)

type ruleWant struct {
	name    string
	verdict dataplane.Verdict
	reason  dataplane.Reason
}

type frameCase struct {
	name   string
	spec   string   // key of frameSpecsByName
	pre    [][]byte // run first, at the same instant
	frame  []byte
	pass   bool
	reason dataplane.Reason // of the global slot
	rules  []ruleWant       // the rules whose counters change
}

// frameCases returns every crafted frame with its exact expected outcome.
func frameCases() []frameCase {
	var cs []frameCase
	for _, c := range corpus.Cases() {
		fc := frameCase{name: c.Name, spec: c.Spec, pre: c.Pre, frame: c.Frame, pass: c.Pass, reason: c.Reason}
		for _, r := range c.Rules {
			fc.rules = append(fc.rules, ruleWant{r.Name, r.Verdict, r.Reason})
		}
		cs = append(cs, fc)
	}
	return cs
}

func itoa(i int) string {
	if i < 0 {
		return "-" + itoa(-i)
	}
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}
