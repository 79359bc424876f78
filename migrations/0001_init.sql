-- Objects of every kind as JSON, with the columns lists and selectors need.
CREATE TABLE objects (
    kind TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    uid TEXT NOT NULL UNIQUE,
    resource_version INTEGER NOT NULL,
    node_name TEXT,
    phase TEXT,
    body TEXT NOT NULL,
    PRIMARY KEY (kind, namespace, name)
);
CREATE INDEX objects_by_node ON objects (kind, node_name);

-- Every change, in resourceVersion order: serves watches and lets a watcher resume.
CREATE TABLE events (
    rv INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    type TEXT NOT NULL,
    body TEXT NOT NULL
);

-- The one global resourceVersion counter.
CREATE TABLE counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO counters (name, value) VALUES ('resourceVersion', 0);

CREATE TABLE settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE users (
    name TEXT PRIMARY KEY,
    password_hash TEXT NOT NULL,
    role TEXT NOT NULL,
    created TEXT NOT NULL
);

-- API tokens are kept only as SHA-256 hashes.
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    user_name TEXT NOT NULL,
    role TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    created TEXT NOT NULL
);
