package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/berth-sandbox/berth/internal/version"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print berth's version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprint(cmd.OutOrStdout(), versionLine())
		},
	}
}

// versionLine is what "berth version" and "berth --version" print:
// "berth VERSION GO_VERSION OS/ARCH" and a newline.
func versionLine() string {
	return fmt.Sprintf("berth %s %s %s/%s\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// buildVersion is berth's version (internal/version).
func buildVersion() string { return version.Get() }
