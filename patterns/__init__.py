"""shutdown-patterns: one copyable module per lifecycle pattern."""
