package cycle

// A uses b.go's B, which uses A back: one cycle of two files.
func A() int { return B() + 1 }
