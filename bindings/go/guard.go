package moe

/*
#include "shim.h"
*/
import "C"

import "sync"

// guard serialises the calls on one context and everything made from it: the library allows one
// thread at a time per context (docs/abi.md, "Threads"), and finalizers run on their own goroutine.
type guard struct {
	mu sync.Mutex
	// hookErr is what a Go communicator hook of this context reported during the call in progress
	// (calls are serialised by mu, and hooks run inside them); callOn attaches it to the call's error.
	hookErr error
}

// callOn runs f on the C handle *p under g's lock and turns its status into an error; a closed
// handle (*p == nil) fails with StatusInvalidArgument naming what.
func callOn[P any](g *guard, p **P, what string, f func(*P) C.int32_t) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if *p == nil {
		return goError(StatusInvalidArgument, "%s: used after Close", what)
	}
	g.hookErr = nil
	err := callC(func() C.int32_t { return f(*p) })
	if cause := g.hookErr; cause != nil {
		g.hookErr = nil
		if e, ok := err.(*Error); ok && e.Status == StatusCallback {
			e.Message += " (Go hook: " + cause.Error() + ")"
			e.Cause = cause
		}
	}
	return err
}

// closeOn runs destroy on *p once, under g's lock, and clears it: Close stays idempotent.
func closeOn[P any](g *guard, p **P, destroy func(*P)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if *p != nil {
		destroy(*p)
		*p = nil
	}
}
