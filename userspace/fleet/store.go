package fleet

import (
	"context"
	"sync"
	"time"
)

// Store is where the hosts of a fleet meet: one Exchange per host and
// epoch records the host's demands in the current epoch and returns the
// allocation of the current epoch, computed once from the previous
// epoch's demands (frozen: no host writes there any more).
type Store interface {
	Exchange(ctx context.Context, node string, reports []Report) (Answer, error)
}

// MemStore is a Store in memory with the semantics of the Redis store
// (its script, step by step), on a clock of its own: the simulation's
// and the tests'. It counts the Redis commands the script would run.
type MemStore struct {
	mu       sync.Mutex
	now      func() time.Time
	interval time.Duration
	epoch    int64
	demands  map[string]map[int64]map[string]float64 // key → epoch → node → demand
	allocs   map[string]map[int64]Alloc
	// Commands counts the Redis commands the script would have run;
	// Calls the exchanges.
	Commands, Calls uint64
}

// NewMemStore returns an empty MemStore on now with epoch interval.
func NewMemStore(now func() time.Time, interval time.Duration) *MemStore {
	return &MemStore{now: now, interval: interval, demands: map[string]map[int64]map[string]float64{}, allocs: map[string]map[int64]Alloc{}}
}

// Exchange implements Store.
func (m *MemStore) Exchange(_ context.Context, node string, reports []Report) (Answer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	nowMS := m.now().UnixMilli()
	e := nowMS / m.interval.Milliseconds()
	m.Calls++
	m.Commands += 2 // TIME, GET epoch
	if e < m.epoch {
		e = m.epoch
	} else if e > m.epoch {
		m.epoch = e
		m.Commands++ // SET epoch
	}
	ans := Answer{NowMS: nowMS, Epoch: e, Rules: make([]RuleAnswer, len(reports))}
	for i, rep := range reports {
		byEpoch := m.demands[rep.Key]
		if byEpoch == nil {
			byEpoch = map[int64]map[string]float64{}
			m.demands[rep.Key] = byEpoch
			m.allocs[rep.Key] = map[int64]Alloc{}
		}
		if byEpoch[e] == nil {
			byEpoch[e] = map[string]float64{}
		}
		byEpoch[e][node] = rep.Demand
		m.Commands += 2 // HSET, GET alloc
		a, ok := m.allocs[rep.Key][e]
		if !ok {
			m.Commands++ // PEXPIRE
			prev := byEpoch[e-1]
			ds := make([]float64, 0, len(prev))
			for _, d := range prev {
				ds = append(ds, d)
			}
			a = Allocate(rep.Budget, ds)
			m.allocs[rep.Key][e] = a
			m.Commands += 2 // HGETALL, SET alloc
			// Keys expire after three epochs.
			delete(byEpoch, e-3)
			delete(m.allocs[rep.Key], e-3)
		}
		d, in := byEpoch[e-1][node]
		m.Commands++ // HGET
		ans.Rules[i] = RuleAnswer{Alloc: a, In: in, Demand: d}
		if a.Hosts == 0 {
			ans.Rules[i].Reporting = len(byEpoch[e])
			m.Commands++ // HLEN
		}
	}
	return ans, nil
}
