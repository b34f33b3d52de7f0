package lab

import "fmt"

// Recreate deletes the veth pair and creates it again with the same
// names, MACs and addresses (a VF reset, a rebuilt bond: the server's
// interface goes away and comes back with a new index). queues is the
// pair's queue count (0: 1). Sockets bound to the lab's addresses keep
// working; whatever was attached to the old interface is gone.
func (l *Lab) Recreate(queues int) error {
	if queues == 0 {
		queues = 1
	}
	hc, err := handleAt(l.Client)
	if err != nil {
		return err
	}
	defer hc.Close()
	lk, err := hc.LinkByName(l.ClientIf)
	if err != nil {
		return fmt.Errorf("recreate: find %s: %w", l.ClientIf, err)
	}
	if err := hc.LinkDel(lk); err != nil { // deletes the server's end too
		return fmt.Errorf("recreate: delete %s: %w", l.ClientIf, err)
	}
	if err := l.setup(queues); err != nil {
		return fmt.Errorf("recreate: %w", err)
	}
	return nil
}
