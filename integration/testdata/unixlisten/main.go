// Command unixlisten listens on a unix socket at the path it is given and
// accepts connections until it is killed: a workload holding a socket
// bound on the sandbox's file system (under gVisor with --host-uds=all, a
// host-backed one, which runsc cannot checkpoint).
package main

import (
	"fmt"
	"net"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: unixlisten PATH")
		os.Exit(2)
	}
	l, err := net.Listen("unix", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		c.Close()
	}
}
