//go:build tools

// Package tools names the upstream command this module builds; it is never compiled.
package tools

import _ "go.etcd.io/etcd/server/v3"
