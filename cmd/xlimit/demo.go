//go:build linux

package main

import (
	"context"
	"fmt"
)

func cmdDemo(_ context.Context, e *env, args []string) error {
	return fmt.Errorf("demo: not built yet")
}
