// Command holdmem allocates the MiB it is given, writes pseudo-random
// bytes to every one of them (so that every page is resident and no page
// is zero or alike), creates the file named by its own path with ".ready"
// added, and sleeps until it is killed: a
// sandbox with that much memory touched, for the bench of a gVisor
// checkpoint.
package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"
)

func main() {
	mib, err := strconv.Atoi(os.Args[len(os.Args)-1])
	if len(os.Args) != 2 || err != nil || mib <= 0 {
		fmt.Fprintln(os.Stderr, "usage: holdmem MiB")
		os.Exit(2)
	}
	buf := make([]byte, mib<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(buf); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			buf[i+j] = byte(v >> (8 * j))
		}
	}
	if err := os.WriteFile(os.Args[0]+".ready", nil, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		time.Sleep(time.Hour)
		_ = buf[r.IntN(len(buf))]
	}
}
