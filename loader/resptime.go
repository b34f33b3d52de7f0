//go:build linux

package loader

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// respTimePin is the pin of the TCX link that attaches the response
// timer (bpf/resptime_tc.c) to the interface's egress, beside the XDP link.
const respTimePin = "resptime_link"

// requestsPin is the pin of the TCX link that attaches the request
// refusal (bpf/request_tc.h, in the response timer's object) to the
// interface's ingress.
const requestsPin = "requests_link"

// ErrRespTimeKernel says why a kernel cannot run rules with signal
// response_time: its responses are timed by a TC egress program attached
// through a TCX link, which Linux has since 6.6.
var ErrRespTimeKernel = errors.New("signal response_time needs TCX (BPF links for tc egress, Linux 6.6 or newer), which this kernel lacks")

// respTimer is the response timer, loaded over the XDP object's maps and
// attached to the interface's egress through a pinned TCX link. A kernel
// without TCX is told by ErrRespTimeKernel.
func (a *Attachment) respTimer() *tcxProgram {
	return &tcxProgram{
		pin:  filepath.Join(a.Dir, respTimePin),
		at:   ebpf.AttachTCXEgress,
		load: func() (tcProgram, error) { return a.objs.LoadRespProgram(false) },
		attachErr: func(err error) error {
			if errors.Is(err, ebpf.ErrNotSupported) {
				return fmt.Errorf("%w (%v)", ErrRespTimeKernel, err)
			}
			return fmt.Errorf("attach the response timer to %s egress: %w", a.Iface, err)
		},
	}
}

// requestRefusal is the refusal of requests over their rule's cap on
// requests in flight, loaded over the XDP object's maps and attached to
// the interface's ingress through a pinned TCX link, beside the response
// timer: the XDP program marks the requests to refuse, this program
// resets their connections both ways.
func (a *Attachment) requestRefusal() *tcxProgram {
	return &tcxProgram{
		pin:  filepath.Join(a.Dir, requestsPin),
		at:   ebpf.AttachTCXIngress,
		load: func() (tcProgram, error) { return a.objs.LoadRequestProgram(false) },
		attachErr: func(err error) error {
			if errors.Is(err, ebpf.ErrNotSupported) {
				return fmt.Errorf("%w (%v)", ErrRespTimeKernel, err)
			}
			return fmt.Errorf("attach the request refusal to %s ingress: %w", a.Iface, err)
		},
	}
}
