package signal

import (
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// ResponseQuantile is the quantile of a tick's response times that the
// response_time signal reads: the lower quartile, not the median.
//
// The kernel stamps a request at its first byte and keeps no flow or
// source with the histogram, so a client that sends half a request and
// the rest seconds later, or a long poll, is a response of seconds
// whatever the service does. With a fraction f of a tick's responses such
// stalls (slower than anything the service does), the q-quantile reads
// the service's own q/(1−f) quantile: the median is held up by stalls as
// soon as they are half of the responses (a few clients on a quiet
// service), the lower quartile only when they pass three quarters, and up
// to half it still reads no more than the service's median. Overload
// queues every request, so the whole distribution, its lower quartile
// with it, moves: a real slowdown of everyone (or of more than three
// quarters of the responses) is still read (docs/control.md).
const ResponseQuantile = 0.25

// TickResponseTime is the response_time signal's reading of one tick: the
// ResponseQuantile of the responses counted since the previous tick (d,
// the kernel histogram's increase over the tick, summed over interfaces).
func TickResponseTime(d *dataplane.RespHist) time.Duration {
	return d.Quantile(ResponseQuantile)
}
