//go:build linux

// Package xdpcount serves the end-to-end tests of sharing an interface: it
// holds a tiny XDP program (xdpcount.c) that counts the frames it sees and
// passes them all, as an object file that xdp-loader loads through libxdp's
// dispatcher, and reads its pinned counter. No part of xlimit's product
// uses it.
package xdpcount

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// MapName is the counter's map, pinned by name in the directory given to
// `xdp-loader load -p DIR`.
const MapName = "xdpcount_pkts"

// WriteObject writes the program's object file into dir and returns its path.
func WriteObject(dir string) (string, error) {
	p := filepath.Join(dir, "xdpcount.o")
	if err := os.WriteFile(p, _XdpcountBytes, 0o600); err != nil {
		return "", fmt.Errorf("write xdpcount object: %w", err)
	}
	return p, nil
}

// Spec is the program's collection spec (program "xdpcount", map
// MapName), for tests that load it themselves.
func Spec() (*ebpf.CollectionSpec, error) {
	return loadXdpcount()
}

// Count is the number of frames the program has seen, from the counter
// pinned in pinDir.
func Count(pinDir string) (uint64, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, MapName), nil)
	if err != nil {
		return 0, fmt.Errorf("open xdpcount counter: %w", err)
	}
	defer m.Close()
	var per []uint64
	if err := m.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("read xdpcount counter: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}
