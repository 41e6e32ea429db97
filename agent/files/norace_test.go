//go:build !race

package files_test

// raceEnabled is true with -race.
const raceEnabled = false
