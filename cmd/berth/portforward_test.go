package main

import "testing"

func TestParsePortSpec(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    portSpec
		wantErr bool
	}{
		{in: "8080", want: portSpec{local: 8080, remote: 8080}},
		{in: "9000:80", want: portSpec{local: 9000, remote: 80}},
		{in: ":5432", want: portSpec{local: 0, remote: 5432}},
		{in: "0:22", want: portSpec{local: 0, remote: 22}},
		{in: "0", wantErr: true},
		{in: "65536", wantErr: true},
		{in: "80:", wantErr: true},
		{in: "x:80", wantErr: true},
		{in: "1:2:3", wantErr: true},
		{in: "", wantErr: true},
	} {
		got, err := parsePortSpec(tc.in)
		if (err != nil) != tc.wantErr || (!tc.wantErr && got != tc.want) {
			t.Errorf("parsePortSpec(%q) = %+v, %v; want %+v (error: %v)", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}
