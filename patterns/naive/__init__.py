"""Broken-on-purpose versions of the patterns, for tests, docs and notebooks.

One file per pattern module, under the same name; a pattern module never imports them.
"""
