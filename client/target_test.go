package client

import "testing"

func TestGRPCTarget(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "unix:///run/berth/berthd.sock", want: "unix:///run/berth/berthd.sock"},
		{in: "unix:/run/berth/berthd.sock", want: "unix:/run/berth/berthd.sock"},
		{in: "/run/berth/berthd.sock", want: "unix:///run/berth/berthd.sock"},
		{in: "localhost:7443", want: "localhost:7443"},
		{in: "10.0.0.1:7443", want: "10.0.0.1:7443"},
		{in: "dns:///berth.internal:7443", want: "dns:///berth.internal:7443"},
		{in: "", wantErr: true},
		{in: "unix:", wantErr: true},
		{in: "unix://", wantErr: true},
	}
	for _, tt := range tests {
		got, err := grpcTarget(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("grpcTarget(%q) = %q, %v, want %q (error %v)", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
