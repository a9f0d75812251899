"""`engramctl bench serve`: the daemon measured as a client sees it, against llama-server (runner.py)."""
