-- Replicas hand a paused run's decision to the session's owner (approvals): a third
-- kind of inbox command. Runs may be paused ('Z' in the status column, which has no
-- check).
ALTER TABLE turnstile.inbox DROP CONSTRAINT IF EXISTS inbox_kind_check;
ALTER TABLE turnstile.inbox ADD CONSTRAINT inbox_kind_check
  CHECK (kind IN ('enqueue', 'cancel', 'decide'));
