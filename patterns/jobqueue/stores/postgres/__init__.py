"""The PostgreSQL store, ``store.PostgresStore``, and its parts.

The schema, connections, LISTEN/NOTIFY wake-ups and the operator's queries. psycopg is
needed only once a store is made. ``from patterns.jobqueue import PostgresStore`` is the
usual import.
"""
