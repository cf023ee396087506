//go:build tools

// Package tools names the upstream command this module builds; it is never compiled.
package tools

import _ "k8s.io/kubernetes/test/e2e/dra/test-driver"
