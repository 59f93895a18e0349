-- Ungrouped claims at two writes per message (docs/groups.md, "Competing
-- consumers"): an ack deletes its claim row, and claimers take new
-- messages one at a time per group, in offset order, above claimed_offset,
-- which they lock and move. A message at or below the mark and above the
-- cursor without a claim row is done. NULL: no claim since the cursor
-- (it is the cursor). Only the ungrouped partition's row ('') has one.
ALTER TABLE queue_offsets ADD COLUMN claimed_offset BIGINT NULL;
-- Acked rows no longer stay until the cursor passes them, so no index of
-- open claims: the primary key serves every read. The previous release
-- names this index in each claim and advance (a missing claim row meant
-- a failed claimer's gap to it): a member of it still running fails
-- those with the database's error instead of delivering acked messages
-- again, and its binary refuses this schema (_contract).
DROP INDEX idx_claims_open ON queue_message_claims;
