// Package durable writes the files the daemon keeps across restarts (the
// last good rules, the rules put through the API, the rules source's
// snapshot and its metadata) so that a crash or a power cut leaves either
// the old file or the new one, whole.
package durable

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile writes data to path durably: into a temporary file in the same
// directory, fsynced, renamed over path, then the directory fsynced so the
// rename itself survives a power cut. The directory must exist.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	name := tmp.Name()
	_, werr := tmp.Write(data)
	err = errors.Join(werr, tmp.Chmod(perm), tmp.Sync(), tmp.Close())
	if err == nil {
		err = os.Rename(name, path)
	}
	if err != nil {
		os.Remove(name)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
