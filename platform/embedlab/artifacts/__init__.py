"""Artifacts: content-addressed files built once and found on every node (published to object
storage by hash, fetched and verified where a node lacks them)."""
