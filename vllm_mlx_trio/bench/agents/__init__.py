"""``bench agents``: multi-turn sessions shaped like Claude Code's, Codex's and OpenCode's."""
