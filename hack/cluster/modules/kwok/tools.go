//go:build tools

// Pins kwok, which keeps the scale benchmark's fake Nodes Ready and runs their pods' lifecycle
// without a kubelet.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
