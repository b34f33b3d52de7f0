package daemon

import (
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/fleet"
)

// fleetRule is what the fleet sharing needs of a rule with a fleet
// section (translate.go's part of it).
func fleetRule(r *config.Rule) fleet.Rule {
	f := r.Fleet
	return fleet.Rule{Name: r.Name, Key: f.Key, Budget: f.Rate, Burst: f.Burst, SafeRate: f.SafeRate}
}
