package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestCredentialFlags(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte("from-file\n"), 0o600)
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		options int    // client options made
		wantErr string // substring; "" for none
	}{
		{"nothing", nil, nil, 0, ""},
		{"env token", map[string]string{"BERTH_TOKEN": "t"}, nil, 1, ""},
		{"token file beats env token", map[string]string{"BERTH_TOKEN": "t"}, []string{"--token-file", tokenFile}, 1, ""},
		{"token and token file", nil, []string{"--token", "t", "--token-file", tokenFile}, 0, "not both"},
		{"empty token file", nil, []string{"--token-file", os.DevNull}, 0, "is empty"},
		{"missing token file", nil, []string{"--token-file", filepath.Join(dir, "none")}, 0, "--token-file"},
		{"insecure", nil, []string{"--insecure"}, 1, ""},
		{"insecure and TLS", nil, []string{"--insecure", "--tls-ca", "ca.crt"}, 0, "does not go with"},
		{"missing CA", nil, []string{"--tls-ca", filepath.Join(dir, "none")}, 0, "TLS CA file"},
		{"cert without key", map[string]string{"BERTH_TLS_CERT": "c.crt"}, nil, 0, "both its certificate and its key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f credentialFlags
			fs := pflag.NewFlagSet("berth", pflag.ContinueOnError)
			f.register(fs, func(k string) string { return tc.env[k] })
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			opts, err := f.options()
			if tc.wantErr == "" && (err != nil || len(opts) != tc.options) {
				t.Errorf("options() = %d options, %v; want %d, no error", len(opts), err, tc.options)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("options() error = %v; want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// The token from the environment is not a flag default: --help would print
// it.
func TestHelpHidesEnvToken(t *testing.T) {
	t.Setenv("BERTH_TOKEN", "s3cret-token-value")
	var out bytes.Buffer
	run(context.Background(), []string{"--help"}, &out, &out)
	if strings.Contains(out.String(), "s3cret") {
		t.Errorf("berth --help shows $BERTH_TOKEN:\n%s", out.String())
	}
}
