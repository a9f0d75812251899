"""Agent tools: engramctl's state operations (checkpoint, branch, restore, ...) as tools an agent or the
model itself can call, defined once (tools.py) and served over REST, WebSocket and MCP.

    tools.py     names, descriptions, JSON Schemas of arguments and results, argument validation
    dispatch.py  running a tool inside the daemon (against its store and conversation service)
    calls.py     tool calls written by the model in its reply: the tools prompt, parsing, message shapes
    mcp.py       `engramctl mcp`: a Model Context Protocol server over stdio, backed by the daemon

Importing this package (or tools.py, calls.py) imports nothing heavy: no torch, no fastapi.
"""
