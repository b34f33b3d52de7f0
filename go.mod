module github.com/xlimit/xlimit

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0
	github.com/vishvananda/netns v0.0.5
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/sys v0.50.0
)

require golang.org/x/sync v0.24.0 // indirect

tool github.com/cilium/ebpf/cmd/bpf2go
