// Package signal reads the inputs of xlimit's control loop (docs/design.md §5.5,
// §5.6) without changing the protected service:
//
//   - [Diag]: narrow NETLINK_SOCK_DIAG requests, filtered in the kernel by
//     TCP state and local port, for the accept queues of a port's LISTEN
//     sockets ([Diag.AcceptQueue]) and its SYN_RECV and ESTABLISHED counts
//     ([Diag.Connections]). Linux only.
//   - [NetStat]: the kernel's cumulative error counters of one network
//     namespace (TcpExt ListenOverflows and ListenDrops, Tcp PassiveOpens and
//     OutRsts, Udp RcvbufErrors). Linux only.
//   - [CPU]: host CPU usage from /proc/stat over a sliding window of at least
//     250 ms, plus [ReadCPUPressure] (PSI, where the kernel has it) and
//     [ReadLoadAvg] as secondary signals.
//   - [Littles]: Little's law, W = L / λ, turning a queue depth and an
//     arrival rate into a waiting time.
//
// Every reader is bounded in time and reports errors instead of panicking;
// a reader that fails leaves it to the control loop to keep the last value
// and mark the signal stale (control.Signals).
//
// # Cost
//
// Measured on the development VM (2 vCPUs, Linux 6.18, TCP established hash
// of 262144 buckets, listening hash of 16384; host busy), with 2000
// established sockets on other ports in the namespace (BenchmarkAcceptQueue
// and the others in this package):
//
//   - AcceptQueue, one port, IPv4 + IPv6 (two requests): about 31 µs.
//   - Connections, one port: about 520 µs, nearly all of it the kernel
//     walking every bucket of the shared established hash twice (one per
//     family); about 330 µs with no sockets at all. Read it less often than
//     every tick on big hosts.
//   - A full dump without filter (every TCP socket, both families): about
//     1.3 ms with this package's parser, 5.4 ms and 18k allocations with
//     netlink.SocketDiagTCPInfo.
//   - NetStat.Read: about 50 µs, mostly the kernel formatting
//     /proc/net/netstat; CPU.Sample: about 55 µs (procfs parses all of
//     /proc/stat, which grows with the number of CPUs and IRQs).
//
// # Network namespaces
//
// A netlink socket belongs to the network namespace of the thread that
// created it, and a /proc/<pid>/net file to the namespace of the task its
// path names when it is opened; both stay bound to that namespace for their
// whole life, whichever thread uses them afterwards. The daemon therefore
// opens its [Diag] and [NetStat] once at startup in its own namespace (from
// any goroutine: all its threads share the process's namespace). To observe
// another namespace, open them from a goroutine locked to a thread switched
// into it (lab.NS.Do in tests), then use them from anywhere.
//
// /proc/net is a symbolic link to self/net, and /proc/self/net shows the
// namespace of the thread-group leader (the process's main thread), not of
// the thread that reads it. [OpenNetStat] therefore opens
// /proc/thread-self/net/..., which is the calling thread's namespace.
package signal
