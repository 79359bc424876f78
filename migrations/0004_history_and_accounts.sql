-- When each recorded change was made and by whom (the logged-in user or API token's user,
-- an agent's node credential), for the dashboard's history of an object. Changes the
-- controller makes on its own have no actor; rows from before this migration have neither.
ALTER TABLE events ADD COLUMN at TEXT;
ALTER TABLE events ADD COLUMN actor TEXT;

-- API tokens may expire (Unix seconds; NULL: never), and say when they were last used
-- (written at most once a minute per token). Sessions say when they were last used too.
ALTER TABLE tokens ADD COLUMN expires INTEGER;
ALTER TABLE tokens ADD COLUMN last_used TEXT;
ALTER TABLE sessions ADD COLUMN last_used TEXT;
