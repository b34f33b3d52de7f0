//go:build linux

package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// libxdp's multi-program dispatcher (bpf/dispatcher.c; xdp-tools'
// lib/libxdp/protocol.org), version 2.
const (
	DispatcherName    = "xdp_dispatcher" // the program's name, which identifies it
	DispatcherMagic   = 236
	DispatcherVersion = 2
	// DispatcherRetval is what an empty slot returns; its bit is in every
	// slot's chain actions.
	DispatcherRetval = 31
	DispatcherSlots  = 10
	// DispatcherConfigSize is the size of struct xdp_dispatcher_config,
	// the value of the dispatcher's one map.
	DispatcherConfigSize = 4 + 3*4*DispatcherSlots
)

// DispatcherConfig is struct xdp_dispatcher_config (bpf/dispatcher.c).
type DispatcherConfig = dispatcherXdpDispatcherConfig

// Extension makes Load load the XDP program as an freplace program
// (BPF_PROG_TYPE_EXT) that takes the place of the function Func of the
// program Target: a slot (prog0..prog9) of a libxdp dispatcher.
type Extension struct {
	Target *ebpf.Program
	Func   string
}

// LoadDispatcher loads a dispatcher that runs conf.NumProgsEnabled slots
// with conf's chain actions; it is not attached anywhere. conf's magic and
// version are set here.
func LoadDispatcher(conf DispatcherConfig) (*ebpf.Program, error) {
	spec, err := loadDispatcher()
	if err != nil {
		return nil, fmt.Errorf("load dispatcher spec: %w", err)
	}
	conf.Magic, conf.DispatcherVersion = DispatcherMagic, DispatcherVersion
	if err := spec.Variables["conf"].Set(conf); err != nil {
		return nil, fmt.Errorf("set dispatcher config: %w", err)
	}
	var objs dispatcherObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("load dispatcher: %w", err)
	}
	// The program keeps its .rodata map; this process's handle goes.
	return objs.XdpDispatcher, nil
}

// ErrNotDispatcher says that a program is not a libxdp dispatcher.
var ErrNotDispatcher = errors.New("not a libxdp dispatcher")

// ReadDispatcherConfig reads the configuration of prog if it is a libxdp
// dispatcher of version 2, and fails with ErrNotDispatcher if it is not
// one at all.
func ReadDispatcherConfig(prog *ebpf.Program) (DispatcherConfig, error) {
	var conf DispatcherConfig
	info, err := prog.Info()
	if err != nil {
		return conf, fmt.Errorf("read program info: %w", err)
	}
	ids, _ := info.MapIDs()
	if info.Name != DispatcherName || len(ids) != 1 {
		return conf, ErrNotDispatcher
	}
	m, err := ebpf.NewMapFromID(ids[0])
	if err != nil {
		return conf, fmt.Errorf("open dispatcher config map: %w", err)
	}
	defer m.Close()
	if m.KeySize() != 4 || m.MaxEntries() != 1 || m.ValueSize() < 2 {
		return conf, ErrNotDispatcher
	}
	buf := make([]byte, m.ValueSize())
	if err := m.Lookup(uint32(0), &buf); err != nil {
		return conf, fmt.Errorf("read dispatcher config: %w", err)
	}
	if buf[0] != DispatcherMagic {
		return conf, fmt.Errorf("dispatcher %s without magic (libxdp's version 1): %w", info.Name, errors.ErrUnsupported)
	}
	if buf[1] != DispatcherVersion || len(buf) != DispatcherConfigSize {
		return conf, fmt.Errorf("libxdp dispatcher version %d (config of %d bytes), xlimit speaks version %d: %w", buf[1], len(buf), DispatcherVersion, errors.ErrUnsupported)
	}
	if err := m.Lookup(uint32(0), &conf); err != nil {
		return conf, fmt.Errorf("read dispatcher config: %w", err)
	}
	return conf, nil
}
