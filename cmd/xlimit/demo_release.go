//go:build linux && !xlimit_demo

package main

import (
	"context"
	"errors"
	"io"
)

// The release build's `xlimit demo`: the demo runs on the test kit's lab
// (tests/kit/lab), which the release binary does not carry
// (TestReleaseDepsNoKit); demo_kit.go, built with the tag xlimit_demo, is
// the demo.

// errDemoNotBuilt is what `xlimit demo` answers in a release build.
var errDemoNotBuilt = errors.New("not in this build (the release binary carries no test kit); build it with `make build`")

func runDemo(context.Context, io.Writer, demoOptions) error { return errDemoNotBuilt }
