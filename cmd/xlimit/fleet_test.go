//go:build linux

package main

import (
	"strings"
	"testing"

	"github.com/xlimit/xlimit/userspace/api"
)

func TestPrintFleet(t *testing.T) {
	var b strings.Builder
	printFleet(&b, nil)
	if b.Len() != 0 {
		t.Fatalf("without --fleet: %q", b.String())
	}
	printFleet(&b, &api.FleetStatus{Node: "fe-1", Store: "unix:///run/redis.sock", Up: false, Rules: []api.FleetRuleStatus{
		{Rule: "web", Key: "front", Share: 1000, Demand: 4500, State: "store_lost", Hosts: 3}}})
	out := b.String()
	for _, want := range []string{"fleet: node fe-1, store unix:///run/redis.sock (DOWN)", "web", "key front", "share    1000.0/s", "demand    4500.0/s", "store_lost", "hosts 3"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}
