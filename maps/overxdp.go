//go:build linux

package maps

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"
)

// loadOverXDP loads the program named prog of spec, a TC object's
// (syncookie_tc.c, resptime_tc.c), with the XDP object's maps in place of
// its own, so that the programs share rules, buckets and counters; every
// map of spec but its global data must be one of the XDP object's. what
// names the program in errors; fakeClock as Options.FakeClock. loadErr, if
// not nil, may turn an error of the load itself into the caller's own
// (nil: the default wrapping).
func (o *Objects) loadOverXDP(spec *ebpf.CollectionSpec, prog, what string, fakeClock bool, loadErr func(error) error) (*ebpf.Program, error) {
	if fakeClock {
		if err := spec.Variables[xdpVarXlCfgFakeClock].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("set fake clock: %w", err)
		}
	}
	// The per-source table's sets and its filter's lines, as the XDP
	// object's (loadSpec).
	if v, ok := spec.Variables[xdpVarXlCfgSrcSets]; ok {
		if err := v.Set(uint32(o.SourceSets())); err != nil {
			return nil, fmt.Errorf("set the per-source table's sets: %w", err)
		}
	}
	if err := setSrcFilter(spec, o.SourceSets()); err != nil {
		return nil, err
	}
	repl := map[string]*ebpf.Map{}
	mv := reflect.ValueOf(&o.objs.xdpMaps).Elem()
	for i := range mv.NumField() {
		name := mv.Type().Field(i).Tag.Get("ebpf")
		if _, ok := spec.Maps[name]; ok && name != "" {
			repl[name] = mv.Field(i).Interface().(*ebpf.Map)
		}
	}
	for name := range spec.Maps {
		if _, ok := repl[name]; !ok && name[0] != '.' {
			return nil, fmt.Errorf("load %s program: map %s is not the XDP object's", what, name)
		}
	}
	// A struct { Prog *ebpf.Program `ebpf:"<prog>"` } for LoadAndAssign,
	// which loads that program and the maps it uses, and nothing else.
	objs := reflect.New(reflect.StructOf([]reflect.StructField{{
		Name: "Prog", Type: reflect.TypeOf((*ebpf.Program)(nil)), Tag: reflect.StructTag(`ebpf:"` + prog + `"`),
	}}))
	if err := spec.LoadAndAssign(objs.Interface(), &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		if loadErr != nil {
			if e := loadErr(err); e != nil {
				return nil, e
			}
		}
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load %s program: %+v", what, ve)
		}
		return nil, fmt.Errorf("load %s program: %w", what, err)
	}
	return objs.Elem().Field(0).Interface().(*ebpf.Program), nil
}
