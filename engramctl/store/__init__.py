"""Snapshot files, the SQLite index, sessions, branches and transcripts."""
