//go:build !gubernator

package main

import "errors"

// gubernatorBuilt: this program was built without -tags gubernator; it
// runs Gubernator's contenders through a build with it (see
// gubernator_contenders.go).
const gubernatorBuilt = false

// buildGubernator is not reached: a run that selects a Gubernator
// contender runs a build with -tags gubernator instead.
func buildGubernator(gubernatorOpts, setup) (acquirer, error) {
	return nil, errors.New("gubernator: this program was built without -tags gubernator")
}
