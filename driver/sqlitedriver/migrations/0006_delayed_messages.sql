-- Delayed delivery (see the MySQL migration): NULL means at once.
ALTER TABLE queue_messages ADD COLUMN not_before INTEGER;
ALTER TABLE queue_half_messages ADD COLUMN not_before INTEGER;
