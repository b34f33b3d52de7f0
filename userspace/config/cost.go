// The cost of parsing a document: a count of its YAML tokens, taken before
// the YAML parser builds its tree.

package config

import "fmt"

// MaxDocumentNodes bounds the YAML nodes of a rules document, as counted
// by countNodes before the document is parsed. The YAML parser's tree
// costs about 200 bytes of heap a node, whatever the node's bytes (two
// bytes of flow-style YAML make a node): the byte limit alone let a
// document of a few MiB take more than a daemon's memory (issue 41, M2).
// 300 000 holds the largest valid document, both prefix tables full
// (2 × 65 536 prefixes at two counted tokens each) and 64 rules, and keeps
// the parser's tree under about 60 MiB.
const MaxDocumentNodes = 300_000

// checkNodes is the error for a document of more than MaxDocumentNodes
// counted nodes, or nil.
func checkNodes(file string, data []byte) error {
	if n := countNodes(data, MaxDocumentNodes); n.over(MaxDocumentNodes) {
		line := 1
		for _, c := range data[:n.at] {
			if c == '\n' {
				line++
			}
		}
		return joinErrors([]*Error{{File: file, Line: line, Problem: fmt.Sprintf(
			"document too large to parse: more than %d YAML nodes (counted up to here); a rules document holds at most %d",
			MaxDocumentNodes, MaxDocumentNodes)}})
	}
	return nil
}

// nodeCount is countNodes' answer: the count, and the offset where it
// passed the limit.
type nodeCount struct {
	n  int
	at int
}

func (c nodeCount) over(limit int) bool { return c.n > limit }

// countNodes counts the tokens of data that can each start at most two
// YAML nodes, so that the parser's tree has at most about twice as many
// nodes as counted, whatever the document (a plain document of lists of
// prefixes counts about two tokens a node). It counts: each start of a
// plain word or of a quoted string, each flow indicator '[', '{' and ',',
// each ':' and '-' followed by a space, a line end, a flow indicator or
// the end (a mapping value or a sequence entry, possibly empty), and each
// '?' twice (an explicit key and its value, both possibly empty). Comments
// count nothing. It stops once the count passes limit.
func countNodes(data []byte, limit int) nodeCount {
	n := 0
	word := false // inside a plain word
	for i := 0; i < len(data) && n <= limit; i++ {
		c := data[i]
		switch c {
		case ' ', '\t', '\r', '\n':
			word = false
		case '#':
			if word {
				continue
			}
			for i < len(data) && data[i] != '\n' {
				i++
			}
		case '\'', '"':
			if word {
				continue
			}
			n++
			for i++; i < len(data); i++ {
				if c == '"' && data[i] == '\\' {
					i++
				} else if data[i] == c {
					break
				}
			}
		case '[', '{', ',':
			n++
			word = false
		case ']', '}':
			word = false
		case ':', '-', '?':
			if i+1 == len(data) || separator(data[i+1]) {
				n++
				if c == '?' {
					n++
				}
				word = false
				continue
			}
			if !word {
				n++
				word = true
			}
		default:
			if !word {
				n++
				word = true
			}
		}
		if n > limit {
			return nodeCount{n, i}
		}
	}
	return nodeCount{n, len(data)}
}

func separator(c byte) bool {
	switch c {
	case ' ', '\t', '\r', '\n', ',', '[', ']', '{', '}':
		return true
	}
	return false
}
