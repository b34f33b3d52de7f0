package fleet

import (
	"math"
	"slices"
)

// FloorFraction is the part of an equal share that every reporting host
// gets at least, whatever its demand: an idle host can take its first
// packets without waiting an epoch, and 1 % of the budget at most is
// reserved for it (the rest goes to the hosts that need it).
const FloorFraction = 0.01

// Alloc is one epoch's division of a budget among the hosts that reported
// a demand in the epoch before: host i gets Share(d_i) where d_i is the
// demand it reported. It is computed once per epoch by the store.
type Alloc struct {
	Budget float64 // the budget divided
	Level  float64 // the water level: no share above it (+Inf: every demand is met)
	Extra  float64 // what every host gets on top when every demand is met
	Floor  float64 // the demand a host counts with at least
	Hosts  int     // hosts that reported
}

// Allocate divides budget max-min fair among demands: the hosts that need
// less than an equal share of what is left get what they need (at least
// the floor), the others split the rest equally; when every demand is met,
// the rest is split equally among all. The result's shares sum to budget
// exactly (up to rounding) whenever there is at least one host.
//
// The Lua script of the Redis store (redis.go) does the same operations in
// the same order, so both give the same doubles (tested).
func Allocate(budget float64, demands []float64) Alloc {
	n := len(demands)
	a := Alloc{Budget: budget, Level: math.Inf(1), Hosts: n}
	if n == 0 {
		return a
	}
	a.Floor = budget * FloorFraction / float64(n)
	ds := make([]float64, n)
	for i, d := range demands {
		ds[i] = math.Max(d, a.Floor)
		if math.IsNaN(d) {
			ds[i] = a.Floor
		}
	}
	slices.Sort(ds)
	rem := budget
	for i, d := range ds {
		fair := rem / float64(n-i)
		if d > fair {
			a.Level = fair
			return a
		}
		rem -= d
	}
	a.Extra = rem / float64(n)
	return a
}

// Share is the share of a host that reported demand.
func (a Alloc) Share(demand float64) float64 {
	d := demand
	if math.IsNaN(d) || d < a.Floor {
		d = a.Floor
	}
	return math.Min(d, a.Level) + a.Extra
}
