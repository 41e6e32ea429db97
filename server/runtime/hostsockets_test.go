package runtime

import "testing"

func TestGoferOf(t *testing.T) {
	const id = "sb-zja4r5spdu"
	for _, tt := range []struct {
		cmd  []string
		want bool
	}{
		{[]string{"runsc-gofer", "--root=/run/containerd/runc/ns", "gofer", "--bundle", "/state/io.containerd.runtime.v2.task/ns/" + id, "--spec-fd=4"}, true},
		{[]string{"/usr/bin/runsc-gofer", "gofer", "--bundle=/state/ns/" + id}, true},
		{[]string{"runsc-gofer", "gofer", "--bundle", "/state/ns/sb-other"}, false},
		{[]string{"runsc-gofer", "gofer", "--bundle", "/state/ns/" + id + "x"}, false},
		{[]string{"runsc-sandbox", "boot", "--bundle=/state/ns/" + id}, false},
		{[]string{"runsc-gofer", "gofer", "--bundle"}, false},
		{nil, false},
	} {
		if got := goferOf(tt.cmd, id); got != tt.want {
			t.Errorf("goferOf(%q) = %v, want %v", tt.cmd, got, tt.want)
		}
	}
}
