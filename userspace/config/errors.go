package config

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Error is one problem found in a rules file. Its text has the form
//
//	FILE:LINE: FIELD: PROBLEM
//
// where FIELD is a path into the document such as "rules[2].ports[1]",
// "rules[0].adaptive.min_rate" or "allow[3]". A problem that concerns the
// file as a whole (it is empty, it is not valid YAML and the parser did not
// say where) has Line 0 and is printed as "FILE: PROBLEM". Column is kept
// for tools; it is not part of the text.
type Error struct {
	File    string
	Line    int
	Column  int
	Field   string
	Problem string
}

func (e *Error) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Field == "" {
		return loc + ": " + e.Problem
	}
	return loc + ": " + e.Field + ": " + e.Problem
}

// Errors returns every *Error contained in err, in order. Parse returns the
// errors.Join of all problems it found; Errors takes that apart again. It
// also looks through errors wrapped with %w. It returns nil for nil.
func Errors(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) {
		case nil:
		case *Error:
			out = append(out, x)
		case interface{ Unwrap() []error }:
			for _, inner := range x.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		}
	}
	walk(err)
	return out
}

// joinErrors sorts errs by position and joins them into one error, or
// returns nil when there are none.
func joinErrors(errs []*Error) error {
	if len(errs) == 0 {
		return nil
	}
	sortErrors(errs)
	list := make([]error, len(errs))
	for i, e := range errs {
		list[i] = e
	}
	return errors.Join(list...)
}

func sortErrors(errs []*Error) {
	slices.SortStableFunc(errs, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
}
