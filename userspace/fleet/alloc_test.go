package fleet

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestAllocateMaxMin(t *testing.T) {
	cases := []struct {
		budget  float64
		demands []float64
		want    []float64
	}{
		// Two flooded, one idle: the idle host keeps the floor (1 % of an
		// equal share), the flooded ones split the rest.
		{3000, []float64{1e5, 1e5, 0}, []float64{1495, 1495, 10}},
		{3000, []float64{1e5, 1e5, 1e5}, []float64{1000, 1000, 1000}},
		// One below the fair share gets its demand, the others split.
		{3000, []float64{500, 1e4, 1e4}, []float64{500, 1250, 1250}},
		// Every demand met: the rest is split equally.
		{3000, []float64{500, 700, 300}, []float64{1000, 1200, 800}},
		{3000, []float64{7000}, []float64{3000}},
	}
	for _, c := range cases {
		a := Allocate(c.budget, c.demands)
		for i, d := range c.demands {
			if got := a.Share(d); math.Abs(got-c.want[i]) > 1e-9 {
				t.Errorf("Allocate(%v, %v): host %d gets %v, want %v", c.budget, c.demands, i, got, c.want[i])
			}
		}
	}
	if a := Allocate(100, nil); a.Hosts != 0 || !math.IsInf(a.Level, 1) {
		t.Errorf("no hosts: %+v", a)
	}
}

// The shares sum to the budget, and no host is below min(demand, fair)
// while another is above it: max-min fairness.
func TestAllocateSumsToBudget(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for range 2000 {
		n := 1 + rng.IntN(50)
		budget := 1 + rng.Float64()*1e5
		ds := make([]float64, n)
		for i := range ds {
			ds[i] = rng.ExpFloat64() * budget / float64(n) * 2
			if rng.IntN(5) == 0 {
				ds[i] = 0
			}
		}
		a := Allocate(budget, ds)
		sum, maxShare := 0.0, 0.0
		for _, d := range ds {
			s := a.Share(d)
			sum += s
			maxShare = math.Max(maxShare, s)
		}
		if math.Abs(sum-budget) > 1e-9*budget {
			t.Fatalf("Allocate(%v, %v): shares sum to %v", budget, ds, sum)
		}
		for _, d := range ds {
			s := a.Share(d)
			if s < math.Max(d, a.Floor)-1e-9*budget && s < maxShare-1e-9*budget {
				t.Fatalf("Allocate(%v, %v): a host needing %v gets %v while another gets %v", budget, ds, d, s, maxShare)
			}
		}
	}
}
