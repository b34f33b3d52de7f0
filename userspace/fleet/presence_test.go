package fleet

import (
	"context"
	"testing"
	"time"
)

// TestPresenceDetectsASecondReporter: two daemons reporting as one fleet
// member (a state directory cloned with an image) are detected by both,
// within two checks; members of their own are not (issue 41, M4).
func TestPresenceDetectsASecondReporter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := NewMemStore(func() time.Time { return now }, DefaultInterval)
	ctx := context.Background()
	a, b, c := NewPresence("web/1"), NewPresence("web/1"), NewPresence("web/2")
	for range 2 {
		for _, p := range []*Presence{a, b, c} {
			if _, err := p.Check(ctx, store, 3*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		now = now.Add(time.Second)
	}
	if a.Others() == 0 || b.Others() == 0 || c.Others() != 0 {
		t.Fatalf("second reporters seen: web/1 %d and %d (want > 0), web/2 %d (want 0)", a.Others(), b.Others(), c.Others())
	}
	// One reporter again (b stopped): once its claim expires, a sees none.
	seen := a.Others()
	now = now.Add(4 * time.Second)
	for range 3 {
		if other, err := a.Check(ctx, store, 3*time.Second); err != nil || other {
			t.Fatalf("after the second reporter stopped: other %v, err %v", other, err)
		}
		now = now.Add(time.Second)
	}
	if a.Others() != seen {
		t.Fatalf("counted %d, want %d", a.Others(), seen)
	}
}

// TestHostBudgetMismatch: a host whose rule carries another budget than
// the one the store divides (a typo on one host) counts it and shows the
// store's budget (issue 41, M4).
func TestHostBudgetMismatch(t *testing.T) {
	l := newFleetLab(t, webRule, "a")
	typo := webRule
	typo.Budget = 30000
	l.add("b", typo)
	l.offered["a"], l.offered["b"] = 10000, 10000
	l.run(2 * time.Second)
	ma, mb := l.hosts["a"].BudgetMismatches(), l.hosts["b"].BudgetMismatches()
	if ma == 0 && mb == 0 {
		t.Fatalf("budgets 3000 and 30000 under one key: no mismatch counted")
	}
	for _, n := range []string{"a", "b"} {
		if st := l.state(n); st.StoreBudget != 3000 && st.StoreBudget != 30000 {
			t.Fatalf("%s: the store's budget %v", n, st.StoreBudget)
		}
	}
	one := newFleetLab(t, webRule, "a", "b")
	one.offered["a"] = 10000
	one.run(2 * time.Second)
	if n := one.hosts["a"].BudgetMismatches() + one.hosts["b"].BudgetMismatches(); n != 0 {
		t.Fatalf("one budget: %d mismatches counted", n)
	}
}
