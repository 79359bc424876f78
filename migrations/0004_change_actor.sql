-- When each recorded change was made and by whom (the logged-in user or API token's user,
-- an agent's node credential), for the dashboard's history of an object. Changes the
-- controller makes on its own have no actor; rows from before this migration have neither.
ALTER TABLE events ADD COLUMN at TEXT;
ALTER TABLE events ADD COLUMN actor TEXT;
