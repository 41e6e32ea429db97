package files

import "testing"

func TestIDMap(t *testing.T) {
	m := idMap{{0, 65536}, {100000, 10}}
	for id, want := range map[int]bool{0: true, 65535: true, 65536: false, 100000: true, 100009: true, 100010: false, -1: false} {
		if got := m.maps(id); got != want {
			t.Errorf("maps(%d) = %v, want %v", id, got, want)
		}
	}
	if host := readIDMap("uid_map"); !host.maps(0) {
		t.Errorf("this process's uid_map %v does not map 0", host)
	}
}
