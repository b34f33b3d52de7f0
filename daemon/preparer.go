//go:build linux

package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The documents that arrive while the daemon runs (the rules file changed
// or SIGHUP, PUT /v1/rules, the rules source) are prepared off the loop
// goroutine: parsing, validation, translation and a first compilation may
// take a large document's time, and the loop must keep its ticks and the
// watchdog's pings meanwhile. The preparer takes them one at a time, in
// their order of arrival, and hands each prepared document (or its error)
// to the loop, which commits it through applyDocument: the one path.

// job is a document waiting to be prepared.
type job struct {
	doc     document
	done    chan error    // the API's caller waits for the outcome; nil otherwise
	confirm time.Duration // FromAPIPending: the deadline of its confirmation
	// revertAt gets a FromAPIPending job's deadline once applied.
	revertAt chan time.Time
}

// prepResult is a job prepared: p, or the error that refused it.
type prepResult struct {
	job
	p   *prepared
	err error
}

// preparer is the queue of jobs and the goroutine that works it.
type preparer struct {
	mu    sync.Mutex
	queue []job
	wake  chan struct{} // one pending wake-up
	out   chan prepResult
}

func newPreparer() *preparer {
	return &preparer{wake: make(chan struct{}, 1), out: make(chan prepResult)}
}

// submit queues a document; it never blocks (the loop submits too).
func (q *preparer) submit(j job) {
	q.mu.Lock()
	q.queue = append(q.queue, j)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *preparer) next() (job, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) == 0 {
		return job{}, false
	}
	j := q.queue[0]
	q.queue = q.queue[1:]
	return j, true
}

// run prepares jobs until ctx ends; the jobs left then get no answer but
// their callers' (the API's) wait ends with the loop.
func (q *preparer) run(ctx context.Context, prepare func(document) (*prepared, error)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
		}
		for {
			j, ok := q.next()
			if !ok {
				break
			}
			p, err := prepare(j.doc)
			select {
			case q.out <- prepResult{job: j, p: p, err: err}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// untilDone runs f on its own goroutine and returns its result, or
// ctx's error as soon as ctx ends (f is then left to finish alone).
func untilDone[T any](ctx context.Context, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, fmt.Errorf("stopped: %w", context.Cause(ctx))
	}
}
