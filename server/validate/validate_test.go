package validate

import (
	"math"
	"strings"
	"testing"
	"time"

	berthv1 "github.com/berth-sandbox/berth/proto/berth/v1"
	"github.com/berth-sandbox/berth/server/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestValidateProcess: every size, duration and string of a process spec
// is bounded before anything starts, with the field named.
func TestValidateProcess(t *testing.T) {
	long := strings.Repeat("a", maxArgBytes+1)
	for _, tc := range []struct {
		name  string
		spec  *berthv1.ProcessSpec
		field string
	}{
		{"plain", &berthv1.ProcessSpec{Argv: []string{"ls", "-l"}, Env: map[string]string{"A": "b=c\n"}, Cwd: "/tmp", Timeout: durationpb.New(time.Minute)}, ""},
		{"zero timeout is the default", &berthv1.ProcessSpec{ShellCommand: "true", Timeout: &durationpb.Duration{}}, ""},
		{"negative timeout", &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: durationpb.New(-time.Second)}, "process.timeout"},
		{"timeout below the floor", &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: durationpb.New(time.Millisecond)}, "process.timeout"},
		{"timeout above the cap", &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: durationpb.New(25 * time.Hour)}, "process.timeout"},
		{"invalid timeout", &berthv1.ProcessSpec{Argv: []string{"true"}, Timeout: &durationpb.Duration{Seconds: math.MaxInt64}}, "process.timeout"},
		{"long argument", &berthv1.ProcessSpec{Argv: []string{"echo", long}}, "process.argv[1]"},
		{"NUL in argument is the agent's to refuse", &berthv1.ProcessSpec{Argv: []string{"echo", "a\x00b"}}, ""},
		{"bad UTF-8 in argument", &berthv1.ProcessSpec{Argv: []string{"echo", "a\xffb"}}, "process.argv[1]"},
		{"too many arguments", &berthv1.ProcessSpec{Argv: make([]string, maxArgvEntries+1)}, "process.argv"},
		{"long shell command", &berthv1.ProcessSpec{ShellCommand: long}, "process.shell_command"},
		{"bad UTF-8 in shell command", &berthv1.ProcessSpec{ShellCommand: "echo \xc3"}, "process.shell_command"},
		{"long cwd", &berthv1.ProcessSpec{Argv: []string{"true"}, Cwd: "/" + strings.Repeat("d", MaxPathBytes)}, "process.cwd"},
		{"bad UTF-8 in cwd", &berthv1.ProcessSpec{Argv: []string{"true"}, Cwd: "/\xff"}, "process.cwd"},
		{"long env value", &berthv1.ProcessSpec{Argv: []string{"true"}, Env: map[string]string{"A": long}}, "process.env[A]"},
		{"bad UTF-8 env key", &berthv1.ProcessSpec{Argv: []string{"true"}, Env: map[string]string{"\xff": "v"}}, "process.env"},
		{"bad UTF-8 in env value", &berthv1.ProcessSpec{Argv: []string{"true"}, Env: map[string]string{"A": "\xc3("}}, "process.env[A]"},
		{"all strings together too long", &berthv1.ProcessSpec{Argv: []string{"true"}, Env: func() map[string]string {
			m := map[string]string{}
			for i := range 10 {
				m[strings.Repeat("K", i+1)] = long[:maxArgBytes-20]
			}
			return m
		}()}, "process.env"},
		{"long user", &berthv1.ProcessSpec{Argv: []string{"true"}, User: strings.Repeat("u", 300)}, "process.user"},
	} {
		err := Process("process", tc.spec)
		if got := status.InvalidField(err); got != tc.field {
			t.Errorf("%s: Process = %v; want INVALID_ARGUMENT naming %q", tc.name, err, tc.field)
		}
	}
}
