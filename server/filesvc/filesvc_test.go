package filesvc

import (
	"strings"
	"testing"

	berthstatus "github.com/berth-sandbox/berth/server/status"
	"github.com/berth-sandbox/berth/server/validate"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	"github.com/berth-sandbox/berth/internal/rpcstatus"
)

func TestLocation(t *testing.T) {
	tests := []struct {
		prefix, text string
		raw          []byte
		want         string
		wantField    string
	}{
		{text: "/a b/🚢", want: "/a b/🚢"},
		{raw: []byte("/caf\xe9"), want: "/caf\xe9"},
		{wantField: "path"},
		{text: "relative", wantField: "path"},
		{raw: []byte("rel"), wantField: "path_bytes"},
		{raw: []byte("/a\x00b"), wantField: "path_bytes"},
		{prefix: "header.", text: "x", wantField: "header.path"},
		{prefix: "to_", raw: []byte("x"), wantField: "to_path_bytes"},
		{text: "/" + strings.Repeat("p", validate.MaxPathBytes-1), want: "/" + strings.Repeat("p", validate.MaxPathBytes-1)},
		{text: "/" + strings.Repeat("p", validate.MaxPathBytes), wantField: "path"},
		{raw: []byte("/" + strings.Repeat("p", 1<<20)), wantField: "path_bytes"},
	}
	for _, tt := range tests {
		got, err := location(tt.prefix, tt.text, tt.raw)
		if tt.wantField == "" {
			if err != nil || string(got) != tt.want {
				t.Errorf("location(%q, %q, %q) = %q, %v, want %q", tt.prefix, tt.text, tt.raw, got, err, tt.want)
			}
			continue
		}
		if rpcstatus.Reason(berthstatus.Of(err)) != rpcstatus.ReasonInvalidArgument {
			t.Errorf("location(%q, %q, %q) = %q, %v, want INVALID_ARGUMENT", tt.prefix, tt.text, tt.raw, got, err)
			continue
		}
		var field string
		for _, d := range status.Convert(berthstatus.Of(err)).Details() {
			if br, ok := d.(*errdetails.BadRequest); ok {
				field = br.GetFieldViolations()[0].GetField()
			}
		}
		if field != tt.wantField {
			t.Errorf("location(%q, %q, %q) blames %q, want %q", tt.prefix, tt.text, tt.raw, field, tt.wantField)
		}
	}
}
