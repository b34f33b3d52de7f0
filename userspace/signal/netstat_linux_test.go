//go:build linux

package signal

import (
	"testing"
)

func TestOpenNetStatHost(t *testing.T) {
	n, err := OpenNetStat()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
		if err := n.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if _, err := n.Read(); err == nil {
			t.Error("Read after Close succeeded")
		}
	}()
	a, err := n.Read()
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.Read()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.Sub(a); !ok {
		t.Errorf("counters went backwards: %+v then %+v", a, b)
	}
	t.Logf("host counters: %+v", b)
}

func BenchmarkNetStatRead(b *testing.B) {
	n, err := OpenNetStat()
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	for b.Loop() {
		if _, err := n.Read(); err != nil {
			b.Fatal(err)
		}
	}
}
