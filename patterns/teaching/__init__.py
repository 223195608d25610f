"""Teaching aids for the docs and notebooks: race pictures drawn from real runs.

Not a pattern: never copied, never imported by a pattern module. Docs: docs/_ext/lanes.py
"""
