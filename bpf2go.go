// Package xlimit is an eBPF/XDP rate limiter that protects a Linux host's
// ports at the NIC. The XDP program in bpf/ admits or drops each packet
// against token buckets in kernel maps; the daemon in cmd/xlimit loads it,
// pins it and steers its rates.
//
// The go:generate lines below compile bpf/ into maps/, and the benchmark's
// traffic generator (bench/gen/xlgen.c) into bench/gen/, and the tests'
// counting XDP program (tests/kit/xdpcount) into its directory, with bpf2go. Run
// them through `make generate`, which pins the compiler (BPF2GO_CC,
// BPF2GO_STRIP, BPF2GO_CFLAGS); the generated objects are committed, so
// building xlimit needs no clang.
package xlimit

//go:generate go tool bpf2go -output-dir maps -go-package maps -tags linux -target bpfel -type xl_rule -type xl_limit -type xl_globals -type xl_prefix -type xl_lpm4_key -type xl_lpm6_key -type xl_bucket_state -type xl_counters -type xl_bucket -type xl_cache -type xl_source_key -type xl_src_way -type xl_src_set -type xl_src_ext -type xl_src_ext_set -type xl_src_credit -type xl_verdict -type xl_reason -type xl_proto -type xl_rule_flag -type xl_global_flag -type xl_prefix_flag -type xl_frag_key -type xl_frag -type xl_host_key -type xl_host_addr -type xl_reset_outcome -type xl_answer -type xl_host_kind -type xl_flow_key -type xl_flow -type xl_resp_hist -type xl_confirm_wait xdp bpf/xlimit.c -- -I bpf/include
//go:generate go tool bpf2go -output-dir maps -go-package maps -tags linux -target bpfel syncookie bpf/syncookie_tc.c -- -I bpf/include
//go:generate go tool bpf2go -output-dir maps -go-package maps -tags linux -target bpfel resptime bpf/resptime_tc.c -- -I bpf/include
//go:generate go tool bpf2go -output-dir maps -go-package maps -tags linux -target bpfel dispatcher bpf/dispatcher.c -- -I bpf/include
//go:generate go tool bpf2go -output-dir tests/kit/xdpcount -go-package xdpcount -tags linux -target bpfel xdpcount tests/kit/xdpcount/xdpcount.c -- -I bpf/include
//go:generate go tool bpf2go -output-dir bench/gen -go-package gen -tags linux -target bpfel xlgen bench/gen/xlgen.c -- -I bpf/include
