package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/berth-sandbox/berth/client"
)

// credentialFlags say how berth proves who it is to berthd. On berthd's
// unix socket nothing is needed (berthd reads the caller's uid); on TCP,
// berth uses TLS and a bearer token or a client certificate.
type credentialFlags struct {
	token, tokenFile       string
	tlsCA, tlsCert, tlsKey string
	tlsServerName          string
	insecure               bool
	// envToken is $BERTH_TOKEN, used when --token is not given; it is not
	// the flag's default, which --help would print.
	envToken string
}

// register adds the flags to fs, their defaults from the environment
// (BERTH_TOKEN, BERTH_TOKEN_FILE, BERTH_TLS_CA, BERTH_TLS_CERT,
// BERTH_TLS_KEY).
func (f *credentialFlags) register(fs *pflag.FlagSet, getenv func(string) string) {
	f.envToken = getenv("BERTH_TOKEN")
	fs.StringVar(&f.token, "token", "", "bearer token sent to berthd (visible in ps: prefer $BERTH_TOKEN or --token-file); default $BERTH_TOKEN")
	fs.StringVar(&f.tokenFile, "token-file", getenv("BERTH_TOKEN_FILE"), "file holding the bearer token; $BERTH_TOKEN_FILE sets the default")
	fs.StringVar(&f.tlsCA, "tls-ca", getenv("BERTH_TLS_CA"), "PEM CA bundle to verify berthd's certificate with (default: the system's roots); $BERTH_TLS_CA sets the default")
	fs.StringVar(&f.tlsCert, "tls-cert", getenv("BERTH_TLS_CERT"), "PEM client certificate (mTLS; its common name is the principal); $BERTH_TLS_CERT sets the default")
	fs.StringVar(&f.tlsKey, "tls-key", getenv("BERTH_TLS_KEY"), "PEM key of --tls-cert; $BERTH_TLS_KEY sets the default")
	fs.StringVar(&f.tlsServerName, "tls-server-name", "", "name to verify berthd's certificate against, when --addr's host is not in it")
	fs.BoolVar(&f.insecure, "insecure", false, "talk to a TCP berthd without TLS (berthd --insecure-tcp): the token and all data cross the network in plaintext")
}

// options turns the flags into client options.
func (f *credentialFlags) options() ([]client.Option, error) {
	var opts []client.Option
	token := f.token
	if token == "" && f.tokenFile == "" {
		token = f.envToken
	}
	if f.tokenFile != "" {
		if token != "" {
			return nil, fmt.Errorf("give a token either with --token ($BERTH_TOKEN) or --token-file ($BERTH_TOKEN_FILE), not both")
		}
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		if token = strings.TrimSpace(string(b)); token == "" {
			return nil, fmt.Errorf("--token-file %s is empty", f.tokenFile)
		}
	}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	switch {
	case f.insecure && (f.tlsCA != "" || f.tlsCert != "" || f.tlsKey != "" || f.tlsServerName != ""):
		return nil, fmt.Errorf("--insecure turns TLS off: it does not go with --tls-ca, --tls-cert, --tls-key or --tls-server-name")
	case f.insecure:
		opts = append(opts, client.WithInsecure())
	case f.tlsCA != "" || f.tlsCert != "" || f.tlsKey != "" || f.tlsServerName != "":
		cfg, err := client.TLSConfigFromFiles(f.tlsCA, f.tlsCert, f.tlsKey)
		if err != nil {
			return nil, err
		}
		cfg.ServerName = f.tlsServerName
		opts = append(opts, client.WithTLS(cfg))
	}
	return opts, nil
}
