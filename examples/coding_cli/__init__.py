"""Example: a real coding-agent CLI (Codex) run against the gateway, its calls recorded (see README.md)."""
