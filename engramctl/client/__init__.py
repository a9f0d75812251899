"""The daemon's HTTP client (httpx): one method per endpoint, typed errors, autostart. torch is never
imported here.

    api.py         Client: one method per daemon route (usage in its docstring)
    connection.py  Connection: where the daemon listens, its token, autostart, one request or stream;
                   an error answer -> the EngramError subclass its `code` names (error_from_body)
    stream.py      ChatStream: a streamed reply's pieces, then its finish, usage and "engram" extension
"""

from engramctl.client.api import Client
from engramctl.client.connection import Connection, error_from_body
from engramctl.client.stream import ChatStream

__all__ = ["ChatStream", "Client", "Connection", "error_from_body"]
