//go:build tools

// Package tools names the upstream command this module builds; it is never compiled.
package tools

import _ "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin"
