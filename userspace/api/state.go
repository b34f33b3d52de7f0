package api

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/xlimit/xlimit/userspace/durable"
)

// StateFile is the name, in the daemon's state directory, of the rules
// last put through the API.
const StateFile = "api.yaml"

// SaveRules keeps rules put through the API in stateDir/api.yaml (mode
// 0600; the directory is created 0700), durably: a crash leaves the old
// file or the new one.
func SaveRules(stateDir string, text []byte) error {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return fmt.Errorf("save API rules: %w", err)
	}
	if err := durable.WriteFile(filepath.Join(stateDir, StateFile), text, 0o600); err != nil {
		return fmt.Errorf("save API rules: %w", err)
	}
	return nil
}

// SavedRules returns the rules kept by SaveRules when they take precedence
// over the rules file at configPath: when they are newer than it, or it
// does not exist. It returns nil text (and no error) when there are none
// or the rules file is newer. The daemon calls it at startup.
func SavedRules(stateDir, configPath string) (text []byte, saved time.Time, err error) {
	path := filepath.Join(stateDir, StateFile)
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("read API rules: %w", err)
	}
	if cst, err := os.Stat(configPath); err == nil && !st.ModTime().After(cst.ModTime()) {
		return nil, time.Time{}, nil
	}
	text, err = os.ReadFile(path)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("read API rules: %w", err)
	}
	return text, st.ModTime(), nil
}

// ForgetRules removes the rules kept by SaveRules: the daemon calls it
// when the rules file takes over again (it was changed after them).
func ForgetRules(stateDir string) error {
	if err := os.Remove(filepath.Join(stateDir, StateFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("forget API rules: %w", err)
	}
	return nil
}
