-- Browser sessions of the dashboard. The cookie carries a random id; only its SHA-256 is
-- kept. Each session has its own CSRF token, sent with every form and state change.
CREATE TABLE sessions (
    hash TEXT PRIMARY KEY,
    user_name TEXT NOT NULL,
    role TEXT NOT NULL,
    csrf TEXT NOT NULL,
    created TEXT NOT NULL,
    expires INTEGER NOT NULL
);
CREATE INDEX sessions_by_user ON sessions (user_name);

-- The dashboard shows an object's recent changes.
CREATE INDEX events_by_object ON events (kind, namespace, name, rv);
