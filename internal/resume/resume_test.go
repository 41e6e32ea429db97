package resume

import (
	"context"
	"testing"

	"google.golang.org/grpc/metadata"
)

// TestValues: the header's value is a boolean in any of ParseBool's
// spellings; anything else, or the header twice, is an error and never
// counts as "do not resume" nor silently as "resume".
func TestValues(t *testing.T) {
	for _, tc := range []struct {
		values  []string
		refused bool
		bad     bool
	}{
		{nil, false, false},
		{[]string{"true"}, true, false},
		{[]string{"1"}, true, false},
		{[]string{"TRUE"}, true, false},
		{[]string{"false"}, false, false},
		{[]string{"0"}, false, false},
		{[]string{"yes"}, false, true},
		{[]string{""}, false, true},
		{[]string{"true", "true"}, false, true},
	} {
		md := metadata.MD{}
		for _, v := range tc.values {
			md.Append(Header, v)
		}
		ctx := metadata.NewIncomingContext(context.Background(), md)
		if err := Check(ctx); (err != nil) != tc.bad {
			t.Errorf("Check(%q) = %v, want error %v", tc.values, err, tc.bad)
		}
		if got := Refused(ctx); got != tc.refused {
			t.Errorf("Refused(%q) = %v, want %v", tc.values, got, tc.refused)
		}
		kept := metadata.NewIncomingContext(Keep(ctx), metadata.MD{})
		if got := Refused(kept); got != tc.refused {
			t.Errorf("Refused(Keep(%q)) = %v, want %v", tc.values, got, tc.refused)
		}
	}
}
