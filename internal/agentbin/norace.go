//go:build !race

package agentbin

// RaceEnabled is true when built with -race.
const RaceEnabled = false
