package fleet

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Store is where the hosts of a fleet meet: one Exchange per host and
// epoch records the host's demands in the current epoch of each key and
// returns the allocation of that epoch, computed once from the previous
// epoch's demands (frozen: no host writes there any more).
type Store interface {
	Exchange(ctx context.Context, node string, reports []Report) (Answer, error)
}

// memServers numbers MemStores: each is a server of its own (Answer.Server).
var memServers atomic.Uint64

// keyEpoch is a key's epoch state: the script's string PREFIX:KEY:e.
type keyEpoch struct {
	seq        int64
	T          int64 // ms, the current epoch's length
	start, end int64 // ms, store time
	hold       int64 // ms: the latest lease end of the earlier epochs
	next       int64 // ms: the shortest interval asked in this epoch
	alloc      Alloc
	demands    map[int64]map[string]float64 // epoch → node → demand
	expires    int64                        // ms: the record's TTL
}

// MemStore is a Store in memory with the semantics of the Redis store
// (its script, step by step), on a clock of its own: the simulation's
// and the tests'. It counts the Redis commands the script would run.
type MemStore struct {
	mu       sync.Mutex
	now      func() time.Time
	interval time.Duration
	keys     map[string]*keyEpoch
	server   string
	claims   map[string]memClaim
	// Commands counts the Redis commands the script would have run;
	// Calls the exchanges.
	Commands, Calls uint64
}

// NewMemStore returns an empty MemStore on now; interval is the epoch of
// reports that name none.
func NewMemStore(now func() time.Time, interval time.Duration) *MemStore {
	return &MemStore{now: now, interval: interval, keys: map[string]*keyEpoch{}, server: fmt.Sprintf("mem-%d", memServers.Add(1))}
}

// windowMS is Window(T) in whole ms, rounded up, as the script has it:
// the store's promise covers every host's lease.
func windowMS(T int64) int64 { return (3*T + 3) / 4 }

// Exchange implements Store.
func (m *MemStore) Exchange(_ context.Context, node string, reports []Report) (Answer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now().UnixMilli()
	m.Calls++
	m.Commands++ // TIME
	ans := Answer{NowMS: now, Server: m.server, Rules: make([]RuleAnswer, len(reports))}
	for i, rep := range reports {
		T := rep.Interval.Milliseconds()
		if T <= 0 {
			T = m.interval.Milliseconds()
		}
		k := m.keys[rep.Key]
		m.Commands++ // GET
		if k != nil && now >= k.expires {
			k = nil
		}
		changed := false
		switch {
		case k == nil:
			// A new key, or one the store lost: its first epoch, cold.
			k = &keyEpoch{seq: 1, T: T, start: now, end: now + T, hold: now, next: T, demands: map[int64]map[string]float64{}}
			m.keys[rep.Key] = k
			changed = true
			k.alloc = m.allocate(k, k.seq-1, rep.Budget)
		case now < k.start:
			// The clock stepped back before the epoch's start: the
			// epoch starts again now, and the leases of the earlier
			// epochs, granted before the step, end within an epoch and
			// a window of now.
			k.start, k.end = now, now+k.T
			k.hold = min(k.hold, now+k.T+windowMS(k.T))
			changed = true
		case now >= k.end:
			k.hold = max(k.hold, k.end+windowMS(k.T))
			skip := (now - k.end) / k.next
			k.seq, k.start, k.T = k.seq+1, k.end+skip*k.next, k.next
			k.end, k.next = k.start+k.T, T
			changed = true
			k.alloc = m.allocate(k, k.seq-1, rep.Budget)
			m.Commands++ // DEL the hash of three epochs ago
		}
		if T < k.next {
			k.next = T
			changed = true
		}
		if k.demands[k.seq] == nil {
			k.demands[k.seq] = map[string]float64{}
		}
		k.demands[k.seq][node] = rep.Demand
		m.Commands++ // HSET
		if changed {
			k.expires = now + max(60000, 20*k.T)
			m.Commands += 2 // SET the record, PEXPIRE the hash
			for e := range k.demands {
				if e < k.seq-2 {
					delete(k.demands, e)
				}
			}
		}
		var d float64
		in := false
		if rep.Last == 0 || rep.Last == k.seq-1 {
			d, in = k.demands[k.seq-1][node]
			m.Commands++ // HGET
		}
		if !in && (rep.Last == 0 || rep.Last == k.seq-2) {
			d, in = k.demands[k.seq-2][node]
			m.Commands++
		}
		ra := RuleAnswer{Alloc: k.alloc, In: in, Demand: d, Seq: k.seq, IntervalMS: k.T, EndMS: k.end, HoldMS: k.hold}
		if k.alloc.Hosts == 0 {
			ra.Reporting = len(k.demands[k.seq])
			m.Commands++ // HLEN
		}
		ans.Rules[i] = ra
	}
	return ans, nil
}

// allocate divides budget by the demands of epochs e and e-1 of k, the
// latest of each host (two HGETALL).
func (m *MemStore) allocate(k *keyEpoch, e int64, budget float64) Alloc {
	m.Commands += 2
	ds := make([]float64, 0, len(k.demands[e]))
	for _, d := range k.demands[e] {
		ds = append(ds, d)
	}
	for n, d := range k.demands[e-1] {
		if _, ok := k.demands[e][n]; !ok {
			ds = append(ds, d)
		}
	}
	if math.IsNaN(budget) {
		budget = 0
	}
	return Allocate(budget, ds)
}

type memClaim struct {
	nonce   string
	expires int64 // ms
}

// Claim implements Claimer.
func (m *MemStore) Claim(_ context.Context, id, nonce string, ttl time.Duration) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now().UnixMilli()
	if m.claims == nil {
		m.claims = map[string]memClaim{}
	}
	prev := ""
	if c, ok := m.claims[id]; ok && now < c.expires {
		prev = c.nonce
	}
	m.claims[id] = memClaim{nonce, now + ttl.Milliseconds()}
	return prev, nil
}
