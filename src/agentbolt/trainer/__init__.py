"""The training loop (imports the algorithms; training side only)."""
