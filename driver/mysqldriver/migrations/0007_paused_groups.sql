-- Pausing a consumer group on a tenant's topic (admin pause/resume): the
-- registry row says since when (NULL: running). Members read it at each
-- rebalance tick and stop taking work while it is set.
ALTER TABLE queue_consumer_groups ADD COLUMN paused_at DATETIME(6) NULL;
