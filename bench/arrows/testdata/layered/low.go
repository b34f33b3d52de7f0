package layered

func low() int { return 1 }
