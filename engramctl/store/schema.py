"""The index schema, as append-only numbered migrations.

Rules: never edit or reorder a migration that has shipped; add a new one at the end. PRAGMA
user_version records how many have been applied. An index written by a newer engramctl (a higher
user_version than len(MIGRATIONS)) is refused rather than guessed at.

Invariants the store keeps (and reconcile restores after a crash):
- snapshots.parent, sessions.head and sessions.base are NULL or name an existing snapshot row;
- a row with durable = 1 has a complete, checksummed file snapshots/<id>.safetensors;
- a row with durable = 0 is being written by this process (its payload is held in memory); after a
  crash reconcile either finds its complete file (and marks it durable) or drops the row;
- transcripts are a tree of immutable messages: a session (and every snapshot) points at its last
  message ("tip"); the transcript is the chain from the tip to the root. Branching shares messages.
- names (2) are the Engram API's names for snapshots (store/name_table.py): a saved turn number, a
  custom snapshot id or a session's latest save (kind 'saved', name '') names a snapshot row that exists
  (deleting the snapshot deletes the name); a branch name names a session that exists (deleting either
  session deletes the name).
- KV blocks (3): a snapshot whose payload names its token axes keeps its attention KV's full blocks of
  store/blocks.py BLOCK_TOKENS tokens in blocks/<block id>.safetensors, shared by every snapshot with the same
  tokens and bytes. snapshot_blocks lists a snapshot's blocks in token order: those rows are the reference
  counts (a block's count is its number of rows), written with the snapshot's row before its files, so no
  retention can free a block a snapshot being written needs. A block with durable = 1 has a complete,
  checksummed file; a durable snapshot's blocks are all durable. A block no row references is deleted in the
  transaction that drops its last reference, its file after that transaction commits (reconcile deletes a
  file left behind by a crash in between).
- snapshots.kind (3): 'snapshot', or 'prefix' for a prefix state (store/prefixes.py): session '', no parent,
  tip or names, hidden from the snapshot listings and lookups, kept within its own byte budget.
- snapshots.nbytes is the snapshot's own file (the constant part once it has blocks); the records add its
  blocks' bytes (index.py).
- totals (4) holds the durable rows' bytes and count, of snapshots and of blocks, kept by triggers in the
  transaction that changes the rows: a write asks whether it fits without summing the store. The eviction
  order (store/retention.py) has its index, so the least recently used victim is found without a listing.
- block sums (5): blocks.users is the block's number of snapshot_blocks rows; snapshots.block_bytes is the sum of
  its blocks' nbytes, snapshots.shared_block_bytes that of those with users > 1 (another snapshot or prefix state,
  durable or not, uses them too). Triggers keep them in the transaction that changes snapshot_blocks or a block's
  nbytes, each O(the rows changed): a listing reads them instead of grouping every snapshot_blocks row. A
  snapshot's blocks are distinct (their ids chain: store/blocks.py), and its row is inserted before its
  snapshot_blocks rows. INSERT OR REPLACE into snapshot_blocks needs PRAGMA recursive_triggers (index.py sets it).
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: sessions, snapshots, transcript messages
    """
    CREATE TABLE sessions (
        name        TEXT PRIMARY KEY,
        fingerprint TEXT,
        model_id    TEXT,
        head        TEXT,
        base        TEXT,
        tip         INTEGER,
        created     REAL NOT NULL,
        last_used   REAL NOT NULL
    );
    CREATE TABLE snapshots (
        id          TEXT PRIMARY KEY,
        session     TEXT NOT NULL,
        parent      TEXT,
        n_tokens    INTEGER NOT NULL,
        token_hash  TEXT,
        nbytes      INTEGER NOT NULL,
        checksum    TEXT,
        fingerprint TEXT,
        model_id    TEXT,
        tip         INTEGER,
        n_messages  INTEGER NOT NULL,
        created     REAL NOT NULL,
        last_access REAL NOT NULL,
        pinned      INTEGER NOT NULL DEFAULT 0,
        label       TEXT,
        durable     INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX snapshots_by_session ON snapshots (session, id);
    CREATE INDEX snapshots_by_parent ON snapshots (parent);
    CREATE INDEX snapshots_by_prefix ON snapshots (fingerprint, token_hash);
    CREATE INDEX sessions_by_head ON sessions (head);
    CREATE INDEX sessions_by_base ON sessions (base);
    CREATE TABLE messages (
        id     INTEGER PRIMARY KEY AUTOINCREMENT,
        parent INTEGER,
        depth  INTEGER NOT NULL,
        body   TEXT NOT NULL
    );
    CREATE INDEX messages_by_parent ON messages (parent);
    """,
    # 2: the Engram server's names: saved turn numbers, branch names, custom snapshot ids
    """
    CREATE TABLE names (
        kind     TEXT NOT NULL,  -- 'turn' | 'branch' | 'id'
        scope    TEXT NOT NULL,  -- the session a turn or branch belongs to, '' for an id (unique store-wide)
        name     TEXT NOT NULL,  -- the turn number (decimal), the branch name or the custom snapshot id
        snapshot TEXT,           -- 'turn', 'id': the snapshot it names
        session  TEXT,           -- 'branch': the session that is the branch
        created  REAL NOT NULL,
        PRIMARY KEY (kind, scope, name)
    );
    CREATE INDEX names_by_snapshot ON names (snapshot);
    CREATE INDEX names_by_session ON names (session);
    """,
    # 3: KV blocks shared between snapshots; prefix states
    """
    ALTER TABLE snapshots ADD COLUMN kind TEXT NOT NULL DEFAULT 'snapshot';
    CREATE INDEX snapshots_by_kind ON snapshots (kind, fingerprint, token_hash);
    CREATE TABLE blocks (
        id          TEXT PRIMARY KEY,
        fingerprint TEXT,
        n_tokens    INTEGER NOT NULL,
        nbytes      INTEGER NOT NULL,
        checksum    TEXT,
        durable     INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE snapshot_blocks (
        snapshot TEXT NOT NULL,
        seq      INTEGER NOT NULL,
        block    TEXT NOT NULL,
        PRIMARY KEY (snapshot, seq)
    );
    CREATE INDEX snapshot_blocks_by_block ON snapshot_blocks (block);
    """,
    # 4: running totals of the durable bytes and the eviction order's index (a write's bookkeeping must not
    # grow with the store: retention.py); triggers keep the totals in the transaction that changes a row
    """
    CREATE TABLE totals (
        name   TEXT PRIMARY KEY,  -- 'snapshots' | 'blocks'
        nbytes INTEGER NOT NULL,  -- of the durable rows
        count  INTEGER NOT NULL
    );
    INSERT INTO totals SELECT 'snapshots', COALESCE(SUM(nbytes), 0), COUNT(*) FROM snapshots WHERE durable <> 0;
    INSERT INTO totals SELECT 'blocks', COALESCE(SUM(nbytes), 0), COUNT(*) FROM blocks WHERE durable <> 0;
    CREATE TRIGGER snapshots_total_insert AFTER INSERT ON snapshots WHEN NEW.durable <> 0 BEGIN
        UPDATE totals SET nbytes = nbytes + NEW.nbytes, count = count + 1 WHERE name = 'snapshots';
    END;
    CREATE TRIGGER snapshots_total_delete AFTER DELETE ON snapshots WHEN OLD.durable <> 0 BEGIN
        UPDATE totals SET nbytes = nbytes - OLD.nbytes, count = count - 1 WHERE name = 'snapshots';
    END;
    CREATE TRIGGER snapshots_total_update AFTER UPDATE OF durable, nbytes ON snapshots
    WHEN OLD.durable <> 0 OR NEW.durable <> 0 BEGIN
        UPDATE totals SET
            nbytes = nbytes - (CASE WHEN OLD.durable <> 0 THEN OLD.nbytes ELSE 0 END)
                            + (CASE WHEN NEW.durable <> 0 THEN NEW.nbytes ELSE 0 END),
            count = count - (OLD.durable <> 0) + (NEW.durable <> 0)
        WHERE name = 'snapshots';
    END;
    CREATE TRIGGER blocks_total_insert AFTER INSERT ON blocks WHEN NEW.durable <> 0 BEGIN
        UPDATE totals SET nbytes = nbytes + NEW.nbytes, count = count + 1 WHERE name = 'blocks';
    END;
    CREATE TRIGGER blocks_total_delete AFTER DELETE ON blocks WHEN OLD.durable <> 0 BEGIN
        UPDATE totals SET nbytes = nbytes - OLD.nbytes, count = count - 1 WHERE name = 'blocks';
    END;
    CREATE TRIGGER blocks_total_update AFTER UPDATE OF durable, nbytes ON blocks
    WHEN OLD.durable <> 0 OR NEW.durable <> 0 BEGIN
        UPDATE totals SET
            nbytes = nbytes - (CASE WHEN OLD.durable <> 0 THEN OLD.nbytes ELSE 0 END)
                            + (CASE WHEN NEW.durable <> 0 THEN NEW.nbytes ELSE 0 END),
            count = count - (OLD.durable <> 0) + (NEW.durable <> 0)
        WHERE name = 'blocks';
    END;
    CREATE INDEX snapshots_by_eviction ON snapshots (durable, pinned, (label IS NOT NULL), last_access, id);
    """,
    # 5: each snapshot's KV block bytes, all and shared, and each block's users, kept by triggers: a listing of
    # every snapshot reads its row, not a grouping of every snapshot_blocks row (issue 46: `ls` at 10,000)
    """
    ALTER TABLE blocks ADD COLUMN users INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE snapshots ADD COLUMN block_bytes INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE snapshots ADD COLUMN shared_block_bytes INTEGER NOT NULL DEFAULT 0;
    UPDATE blocks SET users = (SELECT COUNT(*) FROM snapshot_blocks sb WHERE sb.block = blocks.id);
    UPDATE snapshots SET
        block_bytes = (SELECT COALESCE(SUM(b.nbytes), 0) FROM snapshot_blocks sb JOIN blocks b ON b.id = sb.block
                       WHERE sb.snapshot = snapshots.id),
        shared_block_bytes = (SELECT COALESCE(SUM(b.nbytes), 0) FROM snapshot_blocks sb JOIN blocks b ON b.id = sb.block
                              WHERE sb.snapshot = snapshots.id AND b.users > 1);
    -- a new reference: the block's bytes join its snapshot's sums, shared if it has another user, and its second user
    -- makes it shared for the first too (found along snapshot_blocks_by_block only then)
    CREATE TRIGGER snapshot_blocks_sums_insert AFTER INSERT ON snapshot_blocks BEGIN
        UPDATE blocks SET users = users + 1 WHERE id = NEW.block;
        UPDATE snapshots SET
            block_bytes = block_bytes + IFNULL((SELECT nbytes FROM blocks WHERE id = NEW.block), 0),
            shared_block_bytes = shared_block_bytes
                + IFNULL((SELECT CASE WHEN users > 1 THEN nbytes ELSE 0 END FROM blocks WHERE id = NEW.block), 0)
        WHERE id = NEW.snapshot;
        UPDATE snapshots SET
            shared_block_bytes = shared_block_bytes + (SELECT nbytes FROM blocks WHERE id = NEW.block)
        WHERE id = (SELECT CASE WHEN users = 2 THEN (
                        SELECT snapshot FROM snapshot_blocks
                        WHERE block = NEW.block AND (snapshot <> NEW.snapshot OR seq <> NEW.seq) LIMIT 1) END
                    FROM blocks WHERE id = NEW.block);
    END;
    -- a reference dropped: its bytes leave its snapshot's sums (a no-op once the row is deleted), and a block left
    -- with one user is no longer shared for that one
    CREATE TRIGGER snapshot_blocks_sums_delete AFTER DELETE ON snapshot_blocks BEGIN
        UPDATE blocks SET users = users - 1 WHERE id = OLD.block;
        UPDATE snapshots SET
            block_bytes = block_bytes - IFNULL((SELECT nbytes FROM blocks WHERE id = OLD.block), 0),
            shared_block_bytes = shared_block_bytes
                - IFNULL((SELECT CASE WHEN users > 0 THEN nbytes ELSE 0 END FROM blocks WHERE id = OLD.block), 0)
        WHERE id = OLD.snapshot;
        UPDATE snapshots SET
            shared_block_bytes = shared_block_bytes - (SELECT nbytes FROM blocks WHERE id = OLD.block)
        WHERE id = (SELECT CASE WHEN users = 1 THEN (
                        SELECT snapshot FROM snapshot_blocks WHERE block = OLD.block LIMIT 1) END
                    FROM blocks WHERE id = OLD.block);
    END;
    -- a block's size known once its file is written: every user's sums follow (a new block: its few users)
    CREATE TRIGGER blocks_sums_nbytes AFTER UPDATE OF nbytes ON blocks WHEN NEW.nbytes <> OLD.nbytes BEGIN
        UPDATE snapshots SET
            block_bytes = block_bytes + NEW.nbytes - OLD.nbytes,
            shared_block_bytes = shared_block_bytes + (CASE WHEN NEW.users > 1 THEN NEW.nbytes - OLD.nbytes ELSE 0 END)
        WHERE id IN (SELECT snapshot FROM snapshot_blocks WHERE block = NEW.id);
    END;
    """,
    # 6: each message's role and the user messages up to it, itself included (users), kept by a trigger: the turn
    # a snapshot ends (store/name_table.py) is its tip's, not a walk of its whole transcript (each snapshot of a
    # conversation walked all its messages: quadratic in the turns; 0.19 s of a 10,000-snapshot listing). A
    # parent is always inserted before its children; a message whose parent is gone counts from itself, as that
    # walk stopped there.
    """
    ALTER TABLE messages ADD COLUMN role TEXT;
    ALTER TABLE messages ADD COLUMN users INTEGER NOT NULL DEFAULT 0;
    UPDATE messages SET role = json_extract(body, '$.role');
    WITH RECURSIVE counted(id, users) AS (
        SELECT id, role IS 'user' FROM messages WHERE parent IS NULL OR parent NOT IN (SELECT id FROM messages)
        UNION ALL SELECT m.id, c.users + (m.role IS 'user') FROM messages m JOIN counted c ON m.parent = c.id
    )
    UPDATE messages SET users = counted.users FROM counted WHERE counted.id = messages.id;
    CREATE TRIGGER messages_counted AFTER INSERT ON messages BEGIN
        UPDATE messages SET
            role = json_extract(NEW.body, '$.role'),
            users = (json_extract(NEW.body, '$.role') IS 'user')
                + IFNULL((SELECT users FROM messages WHERE id = NEW.parent), 0)
        WHERE id = NEW.id;
    END;
    """,
)
