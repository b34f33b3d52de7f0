package fleet

// Exchanges returns the counts of answered and failed exchanges (for the
// tests: the daemon reads the fleet through Cap, Status and Up).
func (h *Host) Exchanges() (answered, failed uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls, h.errs
}
