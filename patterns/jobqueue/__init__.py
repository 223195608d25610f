"""A small durable job queue built from the pattern modules (see docs/jobqueue)."""
