package cycle

func B() int { return c }

func C() int { return A() }
