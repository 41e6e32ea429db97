package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/e2e"
)

// TestBridgeDropsSpoofedSources sends real frames from a sandbox's side of
// a veth pair on berth's bridge, with berth's ruleset loaded, and checks
// that the bridge table's prerouting chain drops an IPv4 packet and an ARP
// request whose source address is not the port's own (another sandbox's,
// 10.89.0.3), while the same packets with the port's address (10.89.0.2)
// reach the host. The host side is a network namespace of the test's own,
// so the machine's rules and links are never touched.
//
// Order makes the verdict without waiting: the sending thread is pinned to
// one CPU, so the forged frame and the honest one sent after it pass the
// veth, the bridge and the host's stack in order (one backlog queue); the
// first datagram or ARP reply to arrive must be the honest one's.
func TestBridgeDropsSpoofedSources(t *testing.T) {
	e2e.NeedRoot(t, "network namespaces")
	for _, tool := range []string{"nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			e2e.Missing(t, tool+" not installed (scripts/deps.sh installs nftables and util-linux)")
		}
	}
	dir := t.TempDir()
	host, sb := filepath.Join(dir, "host"), filepath.Join(dir, "sb")
	for _, ns := range []string{host, sb} {
		if err := createNetNS(ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { removeNetNS(ns) })
	}

	r := testRuleset()
	a := testAttachment(t, "sb-a", "10.89.0.2", "vbt-a", 0, "0.0.0.0/0")
	b := testAttachment(t, "sb-b", "10.89.0.3", "vbt-b", 0, "0.0.0.0/0")
	own, other := a.Addr, b.Addr

	// The host: the bridge with the gateway address, a's veth on it, the
	// peer moved into the sandbox's namespace as eth0.
	var bridgeMAC net.HardwareAddr
	err := inNetNS(host, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: r.bridge}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("bridge: %w", err)
		}
		if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: netipNet(netip.PrefixFrom(r.gateway, r.subnet.Bits()))}); err != nil {
			return err
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a.Veth, MasterIndex: br.Index}, PeerName: "eth0"}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("veth: %w", err)
		}
		peer, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		f, err := os.Open(sb)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := netlink.LinkSetNsFd(peer, int(f.Fd())); err != nil {
			return err
		}
		for _, l := range []netlink.Link{br, veth} {
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		l, err := netlink.LinkByName(r.bridge)
		if err != nil {
			return err
		}
		bridgeMAC = l.Attrs().HardwareAddr
		return nil
	})
	if err != nil {
		t.Fatalf("host side: %v", err)
	}
	var eth0 *net.Interface
	err = inNetNS(sb, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		eth0, err = net.InterfaceByName("eth0")
		return err
	})
	if err != nil {
		t.Fatalf("sandbox side: %v", err)
	}

	cmd := exec.Command("nsenter", "--net="+host, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(r.define([]*attachment{a, b}, nil))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}

	// What reaches the host: datagrams on the resolver's UDP port (the
	// inet input chain accepts them from any sandbox).
	var listener net.PacketConn
	if err := inNetNS(host, func() (err error) {
		listener, err = net.ListenPacket("udp4", netip.AddrPortFrom(r.gateway, r.dnsUDP).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer listener.Close()

	t.Run("ipv4", func(t *testing.T) {
		frame := func(src netip.Addr, payload string) []byte {
			return ethernet(bridgeMAC, eth0.HardwareAddr, unix.ETH_P_IP, udp4(src, r.gateway, 40999, r.dnsUDP, []byte(payload)))
		}
		if err := sendInOrder(sb, eth0.Index, unix.ETH_P_IP, frame(other, "forged"), frame(own, "honest")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		listener.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := listener.ReadFrom(buf)
		if err != nil {
			t.Fatalf("the honest datagram did not arrive: %v", err)
		}
		if got := string(buf[:n]); got != "honest" {
			t.Errorf("first datagram at the host = %q from %v, want \"honest\" from %v: a packet with another sandbox's source address passed the bridge", got, from, own)
		}
	})

	t.Run("arp", func(t *testing.T) {
		var replies int
		if err := inNetNS(sb, func() (err error) {
			replies, err = packetSocket(eth0.Index, unix.ETH_P_ARP)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(replies)
		frame := func(src netip.Addr) []byte {
			return ethernet(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, eth0.HardwareAddr, unix.ETH_P_ARP, arpRequest(eth0.HardwareAddr, src, r.gateway))
		}
		if err := sendInOrder(sb, eth0.Index, unix.ETH_P_ARP, frame(other), frame(own)); err != nil {
			t.Fatal(err)
		}
		got, err := firstARPReply(replies, 5*time.Second)
		if err != nil {
			t.Fatalf("no ARP reply to the honest request: %v", err)
		}
		if got != own {
			t.Errorf("first ARP reply from the host is for %v, want %v: an ARP request claiming another sandbox's address passed the bridge", got, own)
		}
	})
}

// inNetNS runs fn on a thread of its own in the network namespace pinned
// at path. The thread is never unlocked, so Go ends it with the goroutine;
// sockets fn opens stay in that namespace.
func inNetNS(path string, fn func() error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// packetSocket opens an AF_PACKET socket for ethertype proto bound to the
// interface of index ifindex.
func packetSocket(ifindex int, proto uint16) (int, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(proto)))
	if err != nil {
		return -1, fmt.Errorf("packet socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind packet socket: %w", err)
	}
	return fd, nil
}

// sendInOrder sends frames out of the interface in the namespace at ns,
// one after the other from one thread pinned to one CPU (see
// TestBridgeDropsSpoofedSources).
func sendInOrder(ns string, ifindex int, proto uint16, frames ...[]byte) error {
	return inNetNS(ns, func() error {
		var cpus unix.CPUSet
		if err := unix.SchedGetaffinity(0, &cpus); err != nil {
			return err
		}
		for c := 0; c < len(cpus)*64; c++ {
			if cpus.IsSet(c) {
				cpus.Zero()
				cpus.Set(c)
				break
			}
		}
		if err := unix.SchedSetaffinity(0, &cpus); err != nil {
			return err
		}
		fd, err := packetSocket(ifindex, proto)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for _, f := range frames {
			if err := unix.Sendto(fd, f, 0, &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: ifindex}); err != nil {
				return fmt.Errorf("send: %w", err)
			}
		}
		return nil
	})
}

// firstARPReply reads fd until an incoming ARP reply arrives and returns
// the address it answers for (its target protocol address).
func firstARPReply(fd int, within time.Duration) (netip.Addr, error) {
	tv := unix.NsecToTimeval(within.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return netip.Addr{}, err
	}
	deadline := time.Now().Add(within)
	buf := make([]byte, 128)
	for time.Now().Before(deadline) {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return netip.Addr{}, err
		}
		ll, _ := from.(*unix.SockaddrLinklayer)
		// Ethernet header (14) then ARP: op at 6, target IP at 24.
		if ll == nil || ll.Pkttype == unix.PACKET_OUTGOING || n < 14+28 || binary.BigEndian.Uint16(buf[14+6:]) != 2 {
			continue
		}
		return netip.AddrFrom4([4]byte(buf[14+24 : 14+28])), nil
	}
	return netip.Addr{}, errors.New("timed out")
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func ethernet(dst, src net.HardwareAddr, proto uint16, payload []byte) []byte {
	f := make([]byte, 14, 14+len(payload))
	copy(f, dst)
	copy(f[6:], src)
	binary.BigEndian.PutUint16(f[12:], proto)
	return append(f, payload...)
}

// udp4 is an IPv4 packet (RFC 791) carrying a UDP datagram without a
// checksum (RFC 768 allows 0 over IPv4).
func udp4(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	p := make([]byte, 28, 28+len(payload))
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(28+len(payload)))
	p[8] = 64
	p[9] = unix.IPPROTO_UDP
	s, d := src.As4(), dst.As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(p[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(p[10:], ^uint16(sum))
	binary.BigEndian.PutUint16(p[20:], sport)
	binary.BigEndian.PutUint16(p[22:], dport)
	binary.BigEndian.PutUint16(p[24:], uint16(8+len(payload)))
	return append(p, payload...)
}

// arpRequest is an ARP request (RFC 826) from mac claiming address src,
// asking for dst.
func arpRequest(mac net.HardwareAddr, src, dst netip.Addr) []byte {
	p := make([]byte, 28)
	binary.BigEndian.PutUint16(p[0:], 1) // Ethernet
	binary.BigEndian.PutUint16(p[2:], unix.ETH_P_IP)
	p[4], p[5] = 6, 4
	binary.BigEndian.PutUint16(p[6:], 1) // request
	copy(p[8:], mac)
	s, d := src.As4(), dst.As4()
	copy(p[14:], s[:])
	copy(p[24:], d[:])
	return p
}
