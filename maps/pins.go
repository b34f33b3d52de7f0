package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// pin is a map to open from a pin directory, and where it goes.
type pin struct {
	name string
	dst  **ebpf.Map
	// optional: absent in the pins of an earlier xlimit, which did not
	// have the map; *dst stays nil then.
	optional bool
}

// openPins opens each of pins from dir into its destination. On an error
// it closes what it opened and sets the destinations back to nil.
func openPins(dir string, opts *ebpf.LoadPinOptions, pins ...pin) error {
	for i, p := range pins {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, p.name), opts)
		if err != nil && (!p.optional || !errors.Is(err, os.ErrNotExist)) {
			for _, q := range pins[:i] {
				if *q.dst != nil {
					(*q.dst).Close()
					*q.dst = nil
				}
			}
			return fmt.Errorf("open pinned map %s: %w", p.name, err)
		}
		*p.dst = m
	}
	return nil
}

// pinned reports whether dir holds the pin name: a feature's maps are
// opened only when its first map is there.
func pinned(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return !errors.Is(err, os.ErrNotExist)
}

// closeMaps closes the maps that are not nil.
func closeMaps(ms ...*ebpf.Map) error {
	var errs []error
	for _, m := range ms {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}
