//go:build !amd64

package launcher

import "errors"

// nativeBinary fails: the native launcher is built for amd64 only (native_amd64.go);
// elsewhere the agent binary is the launcher.
func nativeBinary() (string, error) {
	return "", errors.New("no native launcher for this architecture")
}
