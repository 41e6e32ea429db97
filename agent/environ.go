package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
	"github.com/berth-sandbox/berth/internal/textsafe"
)

// defaultPath is the PATH a process gets when the image and the sandbox
// set none: the one Docker and containerd use for Linux containers.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// passwdFile is the image's user database.
const passwdFile = "/etc/passwd"

// maxPasswdBytes bounds how much of /etc/passwd is read.
const maxPasswdBytes = 4 << 20

// loginEnv returns base with the workload user's login environment, as
// docker's runtime and login(1) give it: HOME from /etc/passwd (or "/"
// when the user has no entry, as docker does) unless base's HOME was set
// on purpose (Config.KeepHome); USER, LOGNAME and SHELL from its entry
// unless base sets them; PATH the usual default unless base sets it.
// /etc/passwd is looked up at every start (passwdCache: read again
// whenever it changed), so a user added in the sandbox counts at once.
func (s *Server) loginEnv(base []string, uid uint32) []string {
	env := make([]string, 0, len(base)+5)
	has := make(map[string]bool, len(base))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" && !s.cfg.KeepHome {
			continue // runc's default for the agent's own user
		}
		has[k] = true
		env = append(env, kv)
	}
	add := func(k, v string) {
		if !has[k] {
			env = append(env, k+"="+v)
			has[k] = true
		}
	}
	u, err := lookupUID(passwdFile, uid)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("cannot read the workload user's entry", "file", passwdFile, "err", err)
	}
	if u == nil {
		add("HOME", "/")
	} else {
		add("HOME", u.home)
		add("USER", u.name)
		add("LOGNAME", u.name)
		add("SHELL", u.shell)
	}
	add("PATH", defaultPath)
	return env
}

// passwdEntry is the part of a passwd(5) line a login environment needs.
type passwdEntry struct {
	name, home, shell string
	uid, gid          uint32
}

// lookupUID returns the first entry of the passwd(5) file at path whose
// uid is uid, or nil. A missing home is "/", a missing shell /bin/sh
// (login(1)).
func lookupUID(path string, uid uint32) (*passwdEntry, error) {
	want := strconv.FormatUint(uint64(uid), 10)
	return passwds.lookup(path, "uid "+want, func(fields [][]byte) bool { return string(fields[2]) == want })
}

// lookupName is lookupUID for the entry named name.
func lookupName(path, name string) (*passwdEntry, error) {
	return passwds.lookup(path, "name "+name, func(fields [][]byte) bool { return string(fields[0]) == name })
}

// passwds keeps the agent's recent passwd(5) answers (passwdCache).
var passwds passwdCache

// passwdCache keeps the answers lookupPasswd gave from one passwd file as
// long as the file is the same: same device, inode, size, modification
// and change times (nanoseconds) at lstat(2). Every exec looks up its
// user's entry (loginEnv); reading and scanning the file each time was
// most of that (issue 23). A user added, removed or changed in the sandbox
// changes the file's times (or its inode, when the file is replaced), and
// counts at the next exec as before. A file changed within passwdSettle is
// read at every lookup.
type passwdCache struct {
	mu      sync.Mutex
	path    string
	stamp   fileStamp
	answers map[string]*passwdEntry // by lookup key; nil: no such entry
}

// fileStamp is what tells one version of a file from another.
type fileStamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

func stampOf(st *unix.Stat_t) fileStamp {
	return fileStamp{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// lookup is lookupPasswd(path, match), whose answer is key's, from the
// cache when path is unchanged since the cached answer was read.
func (c *passwdCache) lookup(path, key string, match func(fields [][]byte) bool) (*passwdEntry, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		c.mu.Lock()
		e, ok := c.answers[key]
		ok = ok && c.path == path && c.stamp == stampOf(&st)
		c.mu.Unlock()
		if ok {
			return e, nil
		}
	}
	e, stamp, err := lookupPasswd(path, match)
	if err != nil {
		return e, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(time.Unix(stamp.ctime.Unix())) < passwdSettle {
		// Changed a moment ago: a change within the file system's
		// timestamp granularity may follow and leave the same stamp.
		c.path, c.answers = "", nil
		return e, nil
	}
	if c.path != path || c.stamp != stamp {
		c.path, c.stamp, c.answers = path, stamp, make(map[string]*passwdEntry)
	}
	c.answers[key] = e
	return e, nil
}

// passwdSettle is how long a passwd file must have been unchanged (its
// change time) for its answers to be kept: file times may be as coarse
// as the kernel's tick, and a second change within one tick, of the same
// size, would leave the stamp as it was (as git treats "racily clean"
// index entries).
var passwdSettle = time.Second

// lookupPasswd returns the first entry of the passwd(5) file at path that
// match accepts, or nil, and the stamp of the file it read.
func lookupPasswd(path string, match func(fields [][]byte) bool) (*passwdEntry, fileStamp, error) {
	// O_NOFOLLOW: the file is the sandbox's, and the agent is root.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fileStamp{}, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fileStamp{}, errors.New(path + " is not a regular file")
	}
	stamp := stampOf(&st)
	sc := bufio.NewScanner(io.LimitReader(f, maxPasswdBytes))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		fields := bytes.Split(line, []byte(":"))
		if len(fields) < 7 || !match(fields) {
			continue
		}
		uid, err1 := strconv.ParseUint(string(fields[2]), 10, 32)
		gid, err2 := strconv.ParseUint(string(fields[3]), 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		e := &passwdEntry{name: string(fields[0]), home: string(fields[5]), shell: string(fields[6]), uid: uint32(uid), gid: uint32(gid)}
		if e.home == "" {
			e.home = "/"
		}
		if e.shell == "" {
			e.shell = "/bin/sh"
		}
		return e, stamp, nil
	}
	return nil, stamp, sc.Err()
}

// nameHost makes hostsFile (/etc/hosts) resolve host, the sandbox's
// hostname, as docker
// does for its containers: when no line names it, one is appended that
// maps it to 127.0.1.1 (the address Debian gives a host name without a
// permanent address; loopback, since a sandbox has no network of its own
// by default). A missing file is created with the usual localhost lines.
// A symlink is not followed (the file is the sandbox's; the agent is
// root). Failures are logged: a read-only root file system cannot be
// helped.
func nameHost(log *slog.Logger, hostsFile, host string) {
	if host == "" {
		return
	}
	f, err := os.OpenFile(hostsFile, os.O_RDWR|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o644)
	if err != nil {
		log.Warn("cannot name the hostname in "+hostsFile, "err", err)
		return
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		log.Warn(hostsFile + " is not a regular file; the hostname is not added")
		return
	}
	content, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		log.Warn("cannot read "+hostsFile, "err", err)
		return
	}
	var add string
	if len(content) == 0 {
		add = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	}
	for line := range strings.Lines(string(content)) {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		for _, name := range fields[min(1, len(fields)):] {
			if strings.EqualFold(name, host) {
				return
			}
		}
	}
	if len(content) > 0 && content[len(content)-1] != '\n' {
		add = "\n"
	}
	add += "127.0.1.1\t" + host + "\n"
	if _, err := f.WriteString(add); err != nil {
		log.Warn("cannot add the hostname to "+hostsFile, "err", err)
	}
}

// resolveUser resolves process.user: "uid" or "uid:gid" (numbers; the gid
// defaults to the uid's group in the passwd(5) file at path, else to the
// uid), or "name" or "name:gid" with name from that file. 4294967295 is
// (uid_t)-1, which setuid(2) cannot take.
func resolveUser(path, v string) (uid, gid uint32, err error) {
	bad := func(why string) error {
		return rpcstatus.InvalidArgument("process.user", fmt.Sprintf("%s: %s", textsafe.Quote(v), why))
	}
	name, group, hasGroup := strings.Cut(v, ":")
	num := func(s string) (uint32, bool) {
		n, err := strconv.ParseUint(s, 10, 32)
		return uint32(n), err == nil && n != 1<<32-1
	}
	if hasGroup {
		g, ok := num(group)
		if !ok {
			return 0, 0, bad("the group must be a number from 0 to 4294967294")
		}
		gid = g
	}
	if n, ok := num(name); ok {
		uid = n
		if !hasGroup {
			gid = n
			if e, _ := lookupUID(path, n); e != nil {
				gid = e.gid
			}
		}
		return uid, gid, nil
	}
	if name == "" || strings.ContainsAny(name, "\x00/") {
		return 0, 0, bad(`want "uid", "uid:gid" or a user name of the sandbox's /etc/passwd`)
	}
	e, err := lookupName(path, name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, 0, bad("cannot read the sandbox's /etc/passwd: " + err.Error())
	}
	if e == nil {
		return 0, 0, bad("no such user in the sandbox's /etc/passwd")
	}
	if !hasGroup {
		gid = e.gid
	}
	return e.uid, gid, nil
}
