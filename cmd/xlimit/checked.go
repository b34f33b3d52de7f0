package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/xlimit/xlimit/userspace/config"
)

// checkedText reads file, checks it as `xlimit check` does, and returns
// the text that was checked: read again after the check through the same
// bounded reader, and refused when it changed meanwhile, so that what
// apply or push sends is what was checked. done names the action for the
// errors ("applied", "pushed").
func checkedText(ctx context.Context, e *env, file, done string) ([]byte, error) {
	text, err := config.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if err := cmdCheck(ctx, e, []string{file}); err != nil {
		if errors.Is(err, errUsage) {
			return nil, fmt.Errorf("check %s: %w", file, err)
		}
		return nil, fmt.Errorf("not %s: %w", done, err)
	}
	if again, err := config.ReadFile(file); err != nil || !bytes.Equal(again, text) {
		return nil, fmt.Errorf("not %s: %s changed while it was checked", done, file)
	}
	return text, nil
}
