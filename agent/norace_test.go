//go:build !race

package agent_test

// raceEnabled is true when the tests run with -race.
const raceEnabled = false
