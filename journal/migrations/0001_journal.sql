-- turnstile's PostgreSQL journal, schema version 1: streams, records, their global
-- positions, the indexes sled keeps under its own keys, and what several replicas
-- share (their heartbeats, session leases with fencing tokens, commands for a session
-- another replica owns). Applied by the binary (journal/src/postgres.rs) under an
-- advisory lock, in one transaction.

-- One row per running process (a new id at every start); alive while expires_at is
-- ahead of the database's clock.
CREATE TABLE turnstile.replicas (
  replica_id  text        PRIMARY KEY,
  name        text        NOT NULL,
  started_at  timestamptz NOT NULL DEFAULT now(),
  expires_at  timestamptz NOT NULL
);

-- One row per session stream: its head, so an append checks and extends the chain
-- under this row's lock.
-- `owner` holds the session's lease (NULL: free) and `lease_epoch` is its fencing
-- token, one more at every change of hands: an append must carry the owner's token.
CREATE TABLE turnstile.streams (
  session_id   text   PRIMARY KEY,
  next_seq     bigint NOT NULL,
  head_hash    bytea  NOT NULL,
  owner        text,
  lease_epoch  bigint NOT NULL DEFAULT 0
);

-- The records: turnstile's record bytes (format 3: version, CRC32, bincode body with
-- the session, sequence and hash link; no global position). `tx` is the writing
-- transaction; `pos` the global position, contiguous from 0 in commit order, given by
-- `position_records` once the transaction has finished (NULL until then).
CREATE TABLE turnstile.events (
  session_id  text   NOT NULL,
  seq         bigint NOT NULL,
  tx          xid8   NOT NULL DEFAULT pg_current_xact_id(),
  pos         bigint UNIQUE,
  record      bytea  NOT NULL,
  PRIMARY KEY (session_id, seq)
);
CREATE INDEX events_unpositioned ON turnstile.events (tx, seq) WHERE pos IS NULL;

-- The next global position: one row, locked by whoever positions records.
CREATE TABLE turnstile.positions (
  one       boolean PRIMARY KEY DEFAULT true CHECK (one),
  next_pos  bigint  NOT NULL
);
INSERT INTO turnstile.positions VALUES (true, 0);

-- Events stored apart from their records (larger than a record holds inline).
CREATE TABLE turnstile.blobs (
  digest  bytea PRIMARY KEY,
  bytes   bytea NOT NULL
);

-- Sessions that exist (created, not deleted).
CREATE TABLE turnstile.sessions (
  session_id     text   PRIMARY KEY,
  agent_id       text   NOT NULL,
  user_id        text,
  created_at_us  bigint NOT NULL
);

-- Runs: their session, agent, queued sequence and position, status (P, R, C, E, X),
-- whether they are still open, and whether their session's and agent's lists show them
-- (a deleted session's runs leave the lists).
CREATE TABLE turnstile.runs (
  run_id      text    PRIMARY KEY,
  session_id  text    NOT NULL,
  agent_id    text    NOT NULL,
  queued_seq  bigint  NOT NULL,
  queued_pos  bigint,
  status      "char"  NOT NULL,
  open        boolean NOT NULL DEFAULT true,
  listed      boolean NOT NULL DEFAULT true
);
CREATE UNIQUE INDEX runs_by_queued_record ON turnstile.runs (session_id, queued_seq);
CREATE INDEX runs_by_agent ON turnstile.runs (agent_id, queued_pos) WHERE listed AND queued_pos IS NOT NULL;
CREATE INDEX runs_open ON turnstile.runs (run_id) WHERE open;

CREATE TABLE turnstile.idempotency_keys (
  key     text PRIMARY KEY,
  run_id  text NOT NULL
);

-- Commands for a session another live replica owns (enqueue a turn, cancel a run),
-- answered by the owner; the sender waits for the reply.
CREATE TABLE turnstile.inbox (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  session_id  text   NOT NULL,
  target      text   NOT NULL,
  kind        text   NOT NULL CHECK (kind IN ('enqueue', 'cancel')),
  body        text   NOT NULL,
  state       text   NOT NULL DEFAULT 'pending'
              CHECK (state IN ('pending', 'taken', 'done', 'abandoned')),
  reply       text,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inbox_pending ON turnstile.inbox (target, id) WHERE state = 'pending';

-- Whether a replica is alive, by the database's clock.
CREATE FUNCTION turnstile.alive(p_replica text) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM turnstile.replicas r
                  WHERE r.replica_id = p_replica AND r.expires_at > now())
$$;

-- Takes a session's lease for p_owner when it is free, its owner's heartbeat has lapsed,
-- or p_owner has it already; a change of hands gives a new fencing token. Answers
-- ('ok', token, next_seq) or ('owned', token, next_seq, owner).
CREATE FUNCTION turnstile.acquire(p_session text, p_owner text)
RETURNS TABLE (status text, lease_epoch bigint, next_seq bigint, owner text)
LANGUAGE plpgsql AS $$
DECLARE
  s turnstile.streams%ROWTYPE;
BEGIN
  IF NOT turnstile.alive(p_owner) THEN
    RETURN QUERY SELECT 'fenced'::text, NULL::bigint, NULL::bigint, p_owner;
    RETURN;
  END IF;
  INSERT INTO turnstile.streams (session_id, next_seq, head_hash)
  VALUES (p_session, 0, decode(repeat('00', 32), 'hex'))
  ON CONFLICT (session_id) DO NOTHING;
  SELECT * INTO s FROM turnstile.streams x WHERE x.session_id = p_session FOR UPDATE;
  IF s.owner IS NOT NULL AND s.owner <> p_owner AND turnstile.alive(s.owner) THEN
    RETURN QUERY SELECT 'owned'::text, s.lease_epoch, s.next_seq, s.owner;
    RETURN;
  END IF;
  IF s.owner IS DISTINCT FROM p_owner THEN
    UPDATE turnstile.streams x SET owner = p_owner, lease_epoch = s.lease_epoch + 1
     WHERE x.session_id = p_session;
    s.lease_epoch := s.lease_epoch + 1;
  END IF;
  RETURN QUERY SELECT 'ok'::text, s.lease_epoch, s.next_seq, p_owner;
END $$;

-- Sessions with open runs and no live owner, oldest first: what a replica with free
-- worker slots takes over (their owner died or stalled past its lease).
CREATE FUNCTION turnstile.claimable(p_limit int)
RETURNS TABLE (session_id text)
LANGUAGE sql STABLE AS $$
  -- From the open runs (a partial index), not from every stream.
  SELECT DISTINCT s.session_id FROM turnstile.runs r
    JOIN turnstile.streams s ON s.session_id = r.session_id
   WHERE r.open AND (s.owner IS NULL OR NOT turnstile.alive(s.owner))
   LIMIT p_limit
$$;

-- Stored projections: derived, rebuildable.
CREATE TABLE turnstile.projections (
  key    text  PRIMARY KEY,
  value  bytea NOT NULL
);

-- Stores a projection without waiting for the WAL flush (as sled writes them without a
-- sync): a write lost in a crash is refolded from the records, which are durable.
CREATE FUNCTION turnstile.put_projection(p_key text, p_value bytea) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  INSERT INTO turnstile.projections (key, value) VALUES (p_key, p_value)
  ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
END $$;

-- One append: one statement, one transaction. Locks the stream's head, checks the
-- lease (the caller's fencing token, or takes a free lease when it has none) and the
-- expected sequence, inserts the records and the indexes they change. Answers 'ok',
-- 'conflict' (with the real head), 'owned' (another live replica's) or 'fenced' without
-- raising, so a refused append writes nothing.
CREATE FUNCTION turnstile.append(
    p_session       text,
    p_owner         text,
    p_epoch         bigint,
    p_expected      bigint,
    p_head_hash     bytea,
    p_records       bytea[],
    p_blob_digests  bytea[],
    p_blobs         bytea[],
    p_created_agent text,
    p_created_user  text,
    p_created_us    bigint,
    p_queued_runs   text[],
    p_queued_agents text[],
    p_queued_seqs   bigint[],
    p_status_runs   text[],
    p_statuses      text[],
    p_terminal      boolean[],
    p_keys          text[],
    p_key_runs      text[],
    p_deleted       boolean)
RETURNS TABLE (status text, next_seq bigint, head_hash bytea, lease_epoch bigint, owner text)
LANGUAGE plpgsql AS $$
DECLARE
  s turnstile.streams%ROWTYPE;
  v_epoch bigint;
BEGIN
  INSERT INTO turnstile.streams (session_id, next_seq, head_hash)
  VALUES (p_session, 0, decode(repeat('00', 32), 'hex'))
  ON CONFLICT (session_id) DO NOTHING;
  SELECT * INTO s FROM turnstile.streams x WHERE x.session_id = p_session FOR UPDATE;
  IF p_epoch IS NULL THEN
    -- The caller holds no lease: it takes it when the session is free.
    IF s.owner IS NOT NULL AND s.owner <> p_owner AND turnstile.alive(s.owner) THEN
      RETURN QUERY SELECT 'owned'::text, s.next_seq, NULL::bytea, s.lease_epoch, s.owner;
      RETURN;
    END IF;
    IF NOT turnstile.alive(p_owner) THEN
      RETURN QUERY SELECT 'fenced'::text, s.next_seq, NULL::bytea, s.lease_epoch, s.owner;
      RETURN;
    END IF;
    v_epoch := s.lease_epoch;
    IF s.owner IS DISTINCT FROM p_owner THEN
      v_epoch := s.lease_epoch + 1;
      UPDATE turnstile.streams x SET owner = p_owner, lease_epoch = v_epoch
       WHERE x.session_id = p_session;
    END IF;
  ELSIF s.owner IS DISTINCT FROM p_owner OR s.lease_epoch <> p_epoch
        OR NOT turnstile.alive(p_owner) THEN
    -- Fencing: the lease changed hands, or this replica's own heartbeat lapsed.
    RETURN QUERY SELECT 'fenced'::text, s.next_seq, NULL::bytea, s.lease_epoch, s.owner;
    RETURN;
  ELSE
    v_epoch := p_epoch;
  END IF;
  IF s.next_seq <> p_expected THEN
    RETURN QUERY SELECT 'conflict'::text, s.next_seq, s.head_hash, v_epoch, p_owner;
    RETURN;
  END IF;

  INSERT INTO turnstile.events (session_id, seq, record)
  SELECT p_session, p_expected + t.i - 1, t.r
    FROM unnest(p_records) WITH ORDINALITY AS t(r, i);
  INSERT INTO turnstile.blobs (digest, bytes)
  SELECT b.d, b.b FROM unnest(p_blob_digests, p_blobs) AS b(d, b)
  ON CONFLICT (digest) DO NOTHING;

  IF p_created_agent IS NOT NULL THEN
    INSERT INTO turnstile.sessions (session_id, agent_id, user_id, created_at_us)
    VALUES (p_session, p_created_agent, p_created_user, p_created_us)
    ON CONFLICT (session_id) DO UPDATE
      SET agent_id = EXCLUDED.agent_id, user_id = EXCLUDED.user_id,
          created_at_us = EXCLUDED.created_at_us;
  END IF;
  INSERT INTO turnstile.runs (run_id, session_id, agent_id, queued_seq, status)
  SELECT q.r, p_session, q.a, q.s, 'P'
    FROM unnest(p_queued_runs, p_queued_agents, p_queued_seqs) AS q(r, a, s)
  ON CONFLICT (run_id) DO NOTHING;
  -- In the order the records give them: a run's last change in this append wins.
  UPDATE turnstile.runs r
     SET status = c.st::"char", open = r.open AND NOT c.term
    FROM (SELECT DISTINCT ON (x.r) x.r, x.st, x.term
            FROM unnest(p_status_runs, p_statuses, p_terminal) WITH ORDINALITY AS x(r, st, term, i)
           ORDER BY x.r, x.i DESC) AS c
   WHERE r.run_id = c.r;
  INSERT INTO turnstile.idempotency_keys (key, run_id)
  SELECT k.k, k.r FROM unnest(p_keys, p_key_runs) AS k(k, r)
  ON CONFLICT (key) DO UPDATE SET run_id = EXCLUDED.run_id;
  IF p_deleted THEN
    DELETE FROM turnstile.sessions WHERE session_id = p_session;
    UPDATE turnstile.runs SET listed = false WHERE session_id = p_session AND listed;
  END IF;

  UPDATE turnstile.streams x
     SET next_seq = p_expected + cardinality(p_records), head_hash = p_head_hash
   WHERE x.session_id = p_session;
  RETURN QUERY SELECT 'ok'::text, p_expected + cardinality(p_records), NULL::bytea, v_epoch, p_owner;
END $$;

-- Gives global positions to the records of finished transactions, in (tx, seq) order,
-- from the next free position on: only a transaction older than every running one
-- (below the snapshot's xmin) is taken, so a late commit is never passed over and
-- positions are contiguous and final once seen. Answers the position of
-- (p_session, p_seq) when it has one (NULL while an older transaction still runs).
CREATE FUNCTION turnstile.position_records(p_session text, p_seq bigint, p_limit int)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  v_pos  bigint;
  v_next bigint;
  v_done bigint;
BEGIN
  SELECT e.pos INTO v_pos FROM turnstile.events e
   WHERE e.session_id = p_session AND e.seq = p_seq;
  IF v_pos IS NOT NULL THEN
    RETURN v_pos;
  END IF;
  -- Nothing finished waits for a position: come back (taking the lock would give this
  -- transaction an id, and its commit a flush, for nothing).
  IF NOT EXISTS (SELECT 1 FROM turnstile.events e
                  WHERE e.pos IS NULL AND e.tx < pg_snapshot_xmin(pg_current_snapshot())) THEN
    RETURN NULL;
  END IF;
  -- Another replica's or appender's call is positioning: it takes this record too, or
  -- the caller's next call does; queueing behind it would serialize commits.
  SELECT p.next_pos INTO v_next FROM turnstile.positions p FOR UPDATE SKIP LOCKED;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  WITH todo AS (
    SELECT e.session_id, e.seq,
           v_next - 1 + row_number() OVER (ORDER BY e.tx, e.seq) AS pos
      FROM turnstile.events e
     WHERE e.pos IS NULL AND e.tx < pg_snapshot_xmin(pg_current_snapshot())
     ORDER BY e.tx, e.seq
     LIMIT p_limit),
  placed AS (
    UPDATE turnstile.events e SET pos = todo.pos
      FROM todo WHERE e.session_id = todo.session_id AND e.seq = todo.seq
    RETURNING e.session_id, e.seq, e.pos),
  runs AS (
    UPDATE turnstile.runs r SET queued_pos = placed.pos
      FROM placed WHERE r.session_id = placed.session_id AND r.queued_seq = placed.seq
    RETURNING 1)
  SELECT count(*) INTO v_done FROM placed;
  IF v_done > 0 THEN
    UPDATE turnstile.positions SET next_pos = v_next + v_done;
  END IF;
  SELECT e.pos INTO v_pos FROM turnstile.events e
   WHERE e.session_id = p_session AND e.seq = p_seq;
  RETURN v_pos;
END $$;
