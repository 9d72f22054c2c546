"""The CLI-agent step runner."""
