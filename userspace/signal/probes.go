package signal

import (
	"fmt"
	"sync"

	"github.com/xlimit/xlimit/userspace/config"
)

// Probes runs a prober per rule steered by `signal: probe`. It is safe for
// concurrent use.
type Probes struct {
	mu sync.Mutex
	by map[string]*Prober
}

// Configure starts probers for new or changed probe rules and stops the
// others; unchanged ones keep running. want maps a rule to its probe.
func (p *Probes) Configure(want map[string]config.Probe) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.by == nil {
		p.by = map[string]*Prober{}
	}
	for name, pr := range p.by {
		if spec, ok := want[name]; !ok || spec != pr.Spec() {
			pr.Close()
			delete(p.by, name)
		}
	}
	for name, spec := range want {
		if _, ok := p.by[name]; ok {
			continue
		}
		pr, err := StartProber(spec)
		if err != nil {
			return fmt.Errorf("probe for rule %s: %w", name, err)
		}
		p.by[name] = pr
	}
	return nil
}

// Get returns the rule's prober, or nil.
func (p *Probes) Get(rule string) *Prober {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.by[rule]
}

// Close stops every prober.
func (p *Probes) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, pr := range p.by {
		pr.Close()
		delete(p.by, name)
	}
}
