"""The ``clarion`` commands (entry points): they compose the API, the relay and the workers."""
