-- Ungrouped claims at two writes per message (see the MySQL migration).
ALTER TABLE queue_offsets ADD COLUMN claimed_offset INTEGER NULL;
DROP INDEX IF EXISTS idx_claims_open;
