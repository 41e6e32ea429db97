//go:build race

package files_test

// raceEnabled is true with -race: the agent binary is then built with -race.
const raceEnabled = true
