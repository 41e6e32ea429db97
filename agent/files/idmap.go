package files

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// idMap is a user namespace's uid_map or gid_map (user_namespaces(7)):
// ranges of ids inside it. A process outside any user namespace maps
// every id.
type idMap [][2]uint64 // first id and count

// readIDMap reads /proc/self/uid_map or gid_map; a missing file (no user
// namespaces) maps every id.
func readIDMap(file string) idMap {
	f, err := os.Open("/proc/self/" + file)
	if err != nil {
		return idMap{{0, 1 << 32}}
	}
	defer f.Close()
	var m idMap
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 {
			continue
		}
		first, err1 := strconv.ParseUint(fields[0], 10, 32)
		count, err2 := strconv.ParseUint(fields[2], 10, 64)
		if err1 == nil && err2 == nil {
			m = append(m, [2]uint64{first, count})
		}
	}
	return m
}

// maps reports whether id is mapped.
func (m idMap) maps(id int) bool {
	for _, r := range m {
		if id >= 0 && uint64(id) >= r[0] && uint64(id) < r[0]+r[1] {
			return true
		}
	}
	return false
}
