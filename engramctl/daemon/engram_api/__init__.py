"""The Engram API: the snapshot routes of the original Engram server (an SGLang fork), served over the same
conversation service the OpenAI routes use. Everything that speaks that server's API is here:

    routes.py        the routes (/save_snapshot, /restore_snapshot, /list_snapshots, /get_snapshot_info,
                     /delete_snapshot, and ours beside them: /branch_snapshot, /pin_snapshot, ...)
    naming.py        their selectors and names (turn_number, branch_name, custom snapshot_id, the latest save)
                     over the store's name table (store/name_table.py, `store.names`)
    restore.py       restoring and saving a session's state (a restore with a continuation is a service turn)
    continuation.py  restore-and-generate: their continuation_ids fed to a restored state as one turn
    answers.py       their answer fields (success, message, conversation_id, turn_number, ...) and failure shape
    schemas.py       the routes' request bodies, over daemon/schemas.py's message and sampling fields

`session`, `conversation_id` and `rid` name one conversation
(store/names.py `named_session`). docs/engram-api.md is the reference.
"""
