"""Checks of the built docs site in a real browser (run by `make site`, after `make docs`)."""
