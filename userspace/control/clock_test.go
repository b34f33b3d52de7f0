package control

import (
	"testing"
	"time"
)

func TestFakeClock(t *testing.T) {
	var c Clock = NewFakeClock(t0)
	fake := c.(*FakeClock)
	for _, s := range []struct {
		step func() time.Time
		want time.Time
	}{
		{c.Now, t0},
		{func() time.Time { return fake.Advance(1500 * time.Millisecond) }, t0.Add(1500 * time.Millisecond)},
		{c.Now, t0.Add(1500 * time.Millisecond)},
		{func() time.Time { return fake.Advance(-time.Second) }, t0.Add(500 * time.Millisecond)},
		{func() time.Time { fake.Set(t0.Add(time.Hour)); return c.Now() }, t0.Add(time.Hour)},
	} {
		if got := s.step(); !got.Equal(s.want) {
			t.Errorf("got %v, want %v", got, s.want)
		}
	}
	var _ Clock = RealClock{}
}
