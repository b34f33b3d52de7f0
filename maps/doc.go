// Package maps is the only door, besides loader, to the kernel objects of
// xlimit's XDP program: it embeds the object that bpf2go compiled from bpf/
// and gives typed, validated access to every map, in the domain types of
// userspace/dataplane.
package maps
