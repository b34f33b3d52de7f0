package control

import "time"

// Clock tells the time. The daemon reads it once per tick and hands the
// result to the laws; tests use a FakeClock.
type Clock interface {
	Now() time.Time
}

// RealClock is the system clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }
