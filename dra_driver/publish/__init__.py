"""Publishing the node's ResourceSlices and keeping them right against the API server."""
