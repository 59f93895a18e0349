-- Delayed delivery (Message.NotBefore): NULL for a message deliverable at
-- once. An ordered partition waits at a delayed message; an ungrouped one
-- gets a claim row visible from not_before. Adding a nullable column last
-- is an instant change on MariaDB >= 10.3 and MySQL 8. A column that exists
-- already (a migration cut short) counts as added (Migrate).
ALTER TABLE queue_messages ADD COLUMN not_before DATETIME(6) NULL;
ALTER TABLE queue_half_messages ADD COLUMN not_before DATETIME(6) NULL;
