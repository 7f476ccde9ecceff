"""PostgreSQL: the event-log recorder, its SQL, schema management, notifications, embedded server."""
