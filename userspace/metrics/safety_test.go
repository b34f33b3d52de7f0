package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSafety(t *testing.T) {
	s := NewSafety(func() map[string]bool { return map[string]bool{"eth0": true, "eth1": false} })
	s.Revert("failure")
	s.Revert("success")
	s.Revert("failure")
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	want := `
# HELP xlimit_interface_attached 1 when the XDP program is attached to this configured interface, 0 when it is not (the interface was deleted and is not back): its traffic is then unprotected.
# TYPE xlimit_interface_attached gauge
xlimit_interface_attached{iface="eth0"} 1
xlimit_interface_attached{iface="eth1"} 0
# HELP xlimit_rules_reverts_total Attempts to revert rules applied with a confirmation deadline (xlimit apply --confirm) to the previous rules because no confirmation came, counted once over, by result (success, failure: retried).
# TYPE xlimit_rules_reverts_total counter
xlimit_rules_reverts_total{result="failure"} 2
xlimit_rules_reverts_total{result="success"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
