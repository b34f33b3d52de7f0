//go:build linux

package zzproto

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xlimit/xlimit/bench/gen"
	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/tests/kit/corpus"
	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

func load(t *testing.T, rule dataplane.RuleSpec) *maps.Objects {
	o, err := maps.Load(maps.Options{SourceTableSize: 131072})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := dataplane.Compile(&dataplane.Spec{Rules: []dataplane.RuleSpec{rule}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Tables().Apply(plan); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestProto(t *testing.T) {
	coll, err := ebpf.LoadCollection("proto.o")
	if err != nil {
		t.Fatalf("%+v", err)
	}
	defer coll.Close()
	bare, _ := gen.NewReceiver(gen.ReceiverDrop)
	ps := dataplane.RuleSpec{Name: "random", Protocol: "udp", Ports: corpus.Ports(9000, 9000), Rate: 1e8, Burst: 1e8,
		PerSource: &dataplane.PerSourceSpec{Rate: 1, Burst: 2, PrefixV4: 32, PrefixV6: 128}}
	xps := load(t, ps)
	defer xps.Close()
	ps.PerSource = nil
	xrule := load(t, ps)
	defer xrule.Close()
	progs := []struct {
		name string
		p    *ebpf.Program
	}{{"xdp_drop", bare}, {"xlimit rule only", xrule.Program()}, {"xlimit per_source (LRU)", xps.Program()},
		{"proto16", coll.Programs["proto16"]}, {"proto32", coll.Programs["proto32"]}, {"proto64", coll.Programs["proto64"]}}
	f := frame.MustBuild(corpus.UDPTo(netip.MustParseAddr("100.64.0.1"), 9000))
	const n = 2000000
	for _, src := range []string{"100.64.0.0/16", "100.64.0.0/12"} {
		var sp []*gen.Spoofer
		for _, p := range progs {
			s, err := gen.NewSpoofer(p.p, netip.MustParsePrefix(src))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, _, err := s.Run(f, 8<<16); err != nil {
				t.Fatal(err)
			}
			sp = append(sp, s)
		}
		res := make([][]float64, len(progs))
		rets := make([]map[uint32]int, len(progs))
		for r := 0; r < 5; r++ {
			for i, s := range sp {
				ret, d, err := s.Run(f, n)
				if err != nil {
					t.Fatal(err)
				}
				if rets[i] == nil {
					rets[i] = map[uint32]int{}
				}
				rets[i][ret]++
				res[i] = append(res[i], float64(d.Nanoseconds()))
			}
		}
		fmt.Printf("sources %s, %d packets a run, 5 rounds alternated, median (min-max) ns per packet:\n", src, n)
		for i, p := range progs {
			v := slices.Clone(res[i])
			slices.Sort(v)
			fmt.Printf("  %-26s %6.1f (%.1f-%.1f)  last verdicts %v\n", p.name, v[2], v[0], v[4], rets[i])
		}
	}
}
