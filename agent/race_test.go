//go:build race

package agent_test

// raceEnabled is true when the tests run with -race; the agent binary is
// then built with -race too, so its own data races fail the tests.
const raceEnabled = true
