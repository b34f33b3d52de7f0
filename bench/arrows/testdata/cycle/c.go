package cycle

// c is used by b.go and uses nothing: off the cycle.
var c = 2
