"""Agent tools: engramctl's state operations (checkpoint, branch, restore, ...) as tools an agent or the
model itself can call, defined once (tools.py) and served over REST, WebSocket and MCP.

    tools.py          names, descriptions, JSON Schemas of arguments and results (the catalogue)
    arguments.py      a call's arguments checked before anything runs (validate_arguments)
    schema_check.py   JSON Schema checking (jsonschema) whose errors name the field
    calls.py          tool calls written by the model in its reply: the tools prompt, parsing, message shapes
    tool_grammar.py   tool_choice, and the grammar that holds the reply's calls to the tools' schemas

Running a tool needs the daemon's store and conversation service: that is engramctl.daemon.dispatch.
The MCP server (`engramctl mcp`) is a client of the daemon: engramctl.cli.mcp_server.
This package sits below the daemon and imports nothing heavy: no torch, no fastapi.
"""
