// Reading a rules document: the size limit every origin shares, the file, and Load.

package config

import (
	"fmt"
	"io"
	"os"
)

// MaxDocumentBytes is the largest rules document xlimit reads, whatever
// its origin (a file, the API, the rules source): 16 MiB holds the
// largest valid document (every prefix table full) several times over,
// and refuses one that would take the daemon's memory or time.
const MaxDocumentBytes = 16 << 20

// checkSize is the error for a document over MaxDocumentBytes, or nil.
func checkSize(file string, n int64) error {
	if n <= MaxDocumentBytes {
		return nil
	}
	return joinErrors([]*Error{{File: file, Problem: fmt.Sprintf("document of %d bytes: more than the limit of %d bytes (%d MiB) of a rules document", n, MaxDocumentBytes, MaxDocumentBytes>>20)}})
}

// ReadFile reads a rules file of at most MaxDocumentBytes; a larger one is
// refused before it is read whole.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read rules file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxDocumentBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read rules file: %w", err)
	}
	if err := checkSize(path, int64(len(data))); err != nil {
		if fi, serr := f.Stat(); serr == nil && fi.Mode().IsRegular() {
			return nil, checkSize(path, fi.Size())
		}
		return nil, err
	}
	return data, nil
}

// Load reads the rules file at path (ReadFile) and parses it with Parse.
func Load(path string) (*Config, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}
