-- Join tokens: an administrator issues one per host to add (`edgevirt node token create`);
-- an agent presents it once and receives its own credential. Only the SHA-256 of the
-- secret is kept; `used_by` is set by the one join that redeemed it.
CREATE TABLE join_tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    description TEXT NOT NULL DEFAULT '',
    created TEXT NOT NULL,
    expires INTEGER NOT NULL,
    used_by TEXT,
    used_at TEXT
);
