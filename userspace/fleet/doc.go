// Package fleet shares one rate budget among the hosts of a fleet
// (docs/fleet.md, "One budget for a fleet"). Every host reports its demand
// per fleet rule once per epoch; the budget is divided max-min fair by
// demand once per epoch, from the frozen reports of the previous epoch,
// inside the store (a Lua script in Redis), so every host reads the same
// allocation; each host holds its share under a lease and falls back to a
// safe share when the lease runs out. Host is pure: it reads no clock of
// its own and does no I/O; the daemon feeds it the time, the kernel's
// offered rates and the store's answers.
package fleet
