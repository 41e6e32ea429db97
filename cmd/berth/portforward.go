package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/client"
)

func newPortForwardCmd(g *globals) *cobra.Command {
	var address string
	cmd := &cobra.Command{
		Use:   "port-forward SANDBOX [LOCAL:]REMOTE...",
		Short: "Forward local ports to ports inside a sandbox",
		Long: `Listen on local ports and forward each accepted connection to
127.0.0.1:REMOTE inside SANDBOX, as one PortForward stream on berth's one
connection to berthd (like kubectl port-forward). It works in every network
mode: the sandbox's agent dials the port.

REMOTE alone listens on the same local port; LOCAL:REMOTE on LOCAL; :REMOTE
on a free local port. Each listener prints "Forwarding from ADDR -> REMOTE"
on stdout once it listens. A connection to a port nothing listens on in the
sandbox is closed and reported on stderr (PORT_CLOSED); other connections go
on. Half-closes pass through both ways. berth port-forward runs until
interrupted (SIGINT, SIGTERM), then exits 0.`,
		Example: `  berth port-forward sb-1 8080            # localhost:8080 -> 8080 in sb-1
  berth port-forward sb-1 9000:80 :5432   # localhost:9000 -> 80, a free port -> 5432`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			specs := make([]portSpec, 0, len(args)-1)
			for _, a := range args[1:] {
				s, err := parsePortSpec(a)
				if err != nil {
					return err
				}
				specs = append(specs, s)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return g.withClient(cmd, func(_ context.Context, c *client.Client) error {
				return portForward(ctx, cmd, c, args[0], address, specs)
			})
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "local address to listen on")
	return cmd
}

// portSpec is one [LOCAL:]REMOTE argument; local 0 picks a free port.
type portSpec struct {
	local, remote uint16
}

func parsePortSpec(s string) (portSpec, error) {
	localText, remoteText, hasLocal := strings.Cut(s, ":")
	if !hasLocal {
		remoteText = localText
	}
	remote, err := strconv.ParseUint(remoteText, 10, 16)
	if err != nil || remote == 0 {
		return portSpec{}, fmt.Errorf("port %q: REMOTE must be a port from 1 to 65535", s)
	}
	spec := portSpec{local: uint16(remote), remote: uint16(remote)}
	if hasLocal {
		spec.local = 0
		if localText != "" {
			local, err := strconv.ParseUint(localText, 10, 16)
			if err != nil {
				return portSpec{}, fmt.Errorf("port %q: LOCAL must be a port from 0 to 65535", s)
			}
			spec.local = uint16(local)
		}
	}
	return spec, nil
}

// portForward checks that the sandbox exists, listens for every spec and
// serves until ctx ends.
func portForward(ctx context.Context, cmd *cobra.Command, c *client.Client, sandboxID, address string, specs []portSpec) error {
	if _, err := c.GetSandbox(ctx, sandboxID); err != nil {
		return err
	}
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for _, s := range specs {
		l, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(int(s.local))))
		if err != nil {
			return fmt.Errorf("listen for port %d: %w", s.remote, err)
		}
		listeners = append(listeners, l)
		fmt.Fprintf(cmd.OutOrStdout(), "Forwarding from %s -> %d\n", l.Addr(), s.remote)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, l := range listeners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveForward(ctx, cmd, c, sandboxID, l, specs[i].remote, &wg)
		}()
	}
	<-ctx.Done()
	for _, l := range listeners {
		l.Close()
	}
	return nil
}

// serveForward accepts connections on l until it closes, forwarding each
// to remote in the sandbox; the connections' goroutines join wg.
func serveForward(ctx context.Context, cmd *cobra.Command, c *client.Client, sandboxID string, l net.Listener, remote uint16, wg *sync.WaitGroup) {
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				fmt.Fprintf(cmd.ErrOrStderr(), "berth: port-forward: accept on %s: %v\n", l.Addr(), err)
			}
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := forwardConn(ctx, c, sandboxID, remote, conn.(*net.TCPConn)); err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "berth: port-forward %s -> %d: %s\n", conn.RemoteAddr(), remote, describe(err))
			}
		}()
	}
}

// forwardConn carries one local connection as one PortForward stream,
// passing half-closes through both ways. A connection that fails in the
// sandbox is reset locally too.
func forwardConn(ctx context.Context, c *client.Client, sandboxID string, remote uint16, local *net.TCPConn) error {
	defer local.Close()
	pc, err := c.PortForward(ctx, sandboxID, remote)
	if err != nil {
		local.SetLinger(0)
		return err
	}
	defer pc.Close()
	up := make(chan error, 1)
	go func() {
		_, err := io.Copy(pc, local)
		if err == nil {
			err = pc.CloseWrite()
		}
		up <- err
	}()
	_, downErr := io.Copy(local, pc)
	if downErr != nil {
		local.SetLinger(0) // the local peer sees a reset, as the sandbox's did
		return downErr
	}
	local.CloseWrite()
	if err := <-up; err != nil && !errors.Is(err, io.ErrClosedPipe) {
		return err
	}
	return nil
}
