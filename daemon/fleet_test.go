//go:build linux

package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/fleet"
)

// TestFleetIdentityUnique: two hosts given one node name (cloned images,
// two daemons on one host, "localhost") are two members of the fleet, so
// that three flooded hosts web, web and db share a budget of 3000/s
// instead of each taking a third of it twice over (issue 41, M4: the
// caps summed to 4500/s). Each host's identity is the node name and an
// instance id kept in its state directory: the same after a restart.
func TestFleetIdentityUnique(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	names := []string{"web", "web", "db"}
	ids := make([]string, len(names))
	for i := range names {
		id, err := fleetIdentity(names[i], dirs[i])
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	if again, err := fleetIdentity("web", dirs[0]); err != nil || again != ids[0] {
		t.Fatalf("after a restart: identity %q (%v), want %q", again, err, ids[0])
	}

	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := fleet.NewMemStore(func() time.Time { return now }, fleet.DefaultInterval)
	rule := fleet.Rule{Name: "web", Key: "web", Budget: 3000, Burst: 300}
	hosts := make([]*fleet.Host, len(ids))
	for i, id := range ids {
		h, err := fleet.NewHost(id, fleet.Config{Guard: 75 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		h.SetRules([]fleet.Rule{rule})
		hosts[i] = h
	}
	for range 3000 { // 3 s in steps of 1 ms, every host flooded
		now = now.Add(time.Millisecond)
		for i, h := range hosts {
			if h.Due(now) {
				reps := h.Reports()
				ans, err := store.Exchange(context.Background(), ids[i], reps)
				if err != nil {
					t.Fatal(err)
				}
				if err := h.Apply(now, now, reps, ans); err != nil {
					t.Fatal(err)
				}
			}
			if now.UnixMilli()%50 == 0 {
				h.Observe("web", 10000, 50*time.Millisecond)
			}
		}
	}
	sum := 0.0
	for i, h := range hosts {
		c, _, _, _ := h.Cap("web", now)
		t.Logf("%s (%s): cap %.1f", names[i], ids[i], c)
		sum += c
	}
	if sum > 3000*1.05 {
		t.Fatalf("hosts web, web, db: the caps sum to %.0f/s, above the budget of 3000/s", sum)
	}
}
