"""Broken-on-purpose versions of the patterns, one file per pattern module, for tests, docs and notebooks."""  # noqa: E501
