package layered

type part struct{ n int }

func (p part) get() int { return p.n + low() }
