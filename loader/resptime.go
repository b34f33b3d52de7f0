//go:build linux

package loader

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/xlimit/xlimit/maps"
)

// respTimePin is the pin of the TCX link that attaches the response
// timer (bpf/resptime_tc.c) to the interface's egress, beside the XDP link.
const respTimePin = "resptime_link"

// ErrRespTimeKernel says why a kernel cannot run rules with signal
// response_time: its responses are timed by a TC egress program attached
// through a TCX link, which Linux has since 6.6.
var ErrRespTimeKernel = errors.New("signal response_time needs TCX (BPF links for tc egress, Linux 6.6 or newer), which this kernel lacks")

// attachRespTime loads the response timer over the XDP object's maps and
// attaches it to the interface's egress through the pinned TCX link
// (tcxLink: adopted and updated in place after a restart).
func (a *Attachment) attachRespTime() error {
	prog, err := a.objs.LoadRespProgram(false)
	if err != nil {
		return err
	}
	if err := a.linkRespTime(prog); err != nil {
		prog.Close()
		return err
	}
	return nil
}

// relinkRespTime attaches the loaded response timer again, to the
// interface's current index (it was re-created, and its TCX links went
// with it), as relinkCookies does for the ACK check: the program stays
// loaded and is not verified again.
func (a *Attachment) relinkRespTime() error {
	if a.respTime != nil {
		_ = a.respTime.Close() // detached with the old interface
		a.respTime = nil
	}
	if a.respProg == nil {
		return a.attachRespTime()
	}
	return a.linkRespTime(a.respProg)
}

// linkRespTime attaches prog at TC egress; it leaves prog open on failure.
func (a *Attachment) linkRespTime(prog *maps.RespProgram) error {
	l, err := tcxLink(filepath.Join(a.Dir, respTimePin), a.Ifindex, prog.Program(), ebpf.AttachTCXEgress)
	if errors.Is(err, ebpf.ErrNotSupported) {
		return fmt.Errorf("%w (%v)", ErrRespTimeKernel, err)
	}
	if err != nil {
		return fmt.Errorf("attach the response timer to %s egress: %w", a.Iface, err)
	}
	a.respProg, a.respTime = prog, l
	return nil
}

func (a *Attachment) closeRespTime() error {
	var errs []error
	if a.respTime != nil {
		errs = append(errs, a.respTime.Close())
		a.respTime = nil
	}
	if a.respProg != nil {
		errs = append(errs, a.respProg.Close())
		a.respProg = nil
	}
	return errors.Join(errs...)
}
