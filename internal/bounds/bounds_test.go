package bounds

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// field returns the BadRequest field err blames, failing unless err is
// INVALID_ARGUMENT.
func field(t *testing.T, err error) string {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("err = %v, want INVALID_ARGUMENT", err)
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) == 1 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	t.Fatalf("err = %v has no BadRequest field violation", err)
	return ""
}

func TestAddMul(t *testing.T) {
	for _, tc := range []struct {
		a, b   uint64
		sum    uint64
		sumOK  bool
		prod   uint64
		prodOK bool
	}{
		{1, 2, 3, true, 2, true},
		{math.MaxUint64, 1, 0, false, math.MaxUint64, true},
		{math.MaxUint64, math.MaxUint64, math.MaxUint64 - 1, false, 1, false},
		{1 << 32, 1 << 32, 1 << 33, true, 0, false},
	} {
		if got, ok := Add(tc.a, tc.b); ok != tc.sumOK || ok && got != tc.sum {
			t.Errorf("Add(%d, %d) = %d, %v, want %d, %v", tc.a, tc.b, got, ok, tc.sum, tc.sumOK)
		}
		if got, ok := Mul(tc.a, tc.b); ok != tc.prodOK || ok && got != tc.prod {
			t.Errorf("Mul(%d, %d) = %d, %v, want %d, %v", tc.a, tc.b, got, ok, tc.prod, tc.prodOK)
		}
	}
}

func TestUint(t *testing.T) {
	if err := Uint("f", 5, 5, 10, "bytes", ""); err != nil {
		t.Errorf("Uint(5 in 5..10) = %v, want nil", err)
	}
	if err := Uint("f", math.MaxUint64, 5, 0, "bytes", ""); err != nil {
		t.Errorf("Uint(max, no cap) = %v, want nil", err)
	}
	for _, v := range []uint64{4, 11, math.MaxUint64} {
		err := Uint("resources.x", v, 5, 10, "bytes", "why")
		if got := field(t, err); got != "resources.x" {
			t.Errorf("Uint(%d) blames %q, want resources.x", v, got)
		}
	}
}

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		d       *durationpb.Duration
		want    time.Duration
		wantErr string
	}{
		{nil, 0, ""},
		{&durationpb.Duration{}, 0, ""},
		{durationpb.New(time.Second), time.Second, ""},
		{durationpb.New(24 * time.Hour), 24 * time.Hour, ""},
		{durationpb.New(-time.Second), 0, "negative"},
		{durationpb.New(time.Millisecond), 0, "below the minimum of 1s"},
		{durationpb.New(25 * time.Hour), 0, "exceeds the maximum of 24h0m0s"},
		{&durationpb.Duration{Seconds: math.MaxInt64}, 0, "not a valid duration"},
		{&durationpb.Duration{Seconds: 1, Nanos: -1}, 0, "not a valid duration"},
	} {
		got, err := Duration("process.timeout", tc.d, time.Second, 24*time.Hour)
		if tc.wantErr == "" {
			if err != nil || got != tc.want {
				t.Errorf("Duration(%v) = %v, %v, want %v", tc.d, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("Duration(%v) = %v, %v, want an error saying %q", tc.d, got, err, tc.wantErr)
			continue
		}
		if f := field(t, err); f != "process.timeout" {
			t.Errorf("Duration(%v) blames %q, want process.timeout", tc.d, f)
		}
	}
}

func TestString(t *testing.T) {
	text := Text{MaxBytes: 8, NoNUL: true}
	for _, tc := range []struct {
		s       string
		wantErr string
	}{
		{"", ""},
		{"héllo", ""},
		{"123456789", "is 9 bytes; the limit is 8"},
		{"ab\xffc", "not valid UTF-8 (at byte offset 2)"},
		{"a\x00b", "NUL byte at offset 1"},
	} {
		err := text.String("argv[0]", tc.s)
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("String(%q) = %v, want nil", tc.s, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("String(%q) = %v, want an error saying %q", tc.s, err, tc.wantErr)
			continue
		}
		if f := field(t, err); f != "argv[0]" {
			t.Errorf("String(%q) blames %q, want argv[0]", tc.s, f)
		}
	}
	if err := (Text{MaxBytes: 8}).String("f", "a\x00b"); err != nil {
		t.Errorf("String with NUL allowed = %v, want nil", err)
	}
}
