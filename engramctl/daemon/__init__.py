"""The local daemon: one model behind an OpenAI-compatible and Engram-compatible HTTP API.

Nothing heavy is imported here; `engramctl.daemon.runner` has serve, `engramctl.daemon.background`
start/stop/status, and
`engramctl.daemon.app.create_app` builds the ASGI app.
"""
