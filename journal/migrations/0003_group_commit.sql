-- Group commit (issue 33): the appends waiting at one moment, of many sessions, go to
-- the database together, one call of `turnstile.append_batch`: one round trip, one
-- transaction, one WAL flush. Each append is still checked against its stream's
-- expected sequence and its lease's fencing token, and a refused one (a conflict, a
-- fenced or owned lease) writes nothing while the others of its batch are written.
--
-- Positions are given inside the appending transaction, from the `positions` row
-- locked first and held to the commit: one positioning transaction at a time, so
-- positions are contiguous from 0 and become visible in order (a reader that saw
-- position n never finds a record below n later). The records are written with their
-- positions, never updated afterwards.

-- Records an earlier version left unpositioned (a process killed between its commit and
-- its positioning) get their positions now, in the order that version gave them.
SELECT turnstile.position_records('', -1, 2147483647);

DROP FUNCTION turnstile.append(text, text, bigint, bigint, bytea, bytea[], bytea[], bytea[],
  text, text, bigint, text[], text[], bigint[], text[], text[], boolean[], text[], text[],
  boolean);

-- The accepted appends of a batch: their place, session, first sequence and position.
CREATE FUNCTION turnstile.accepted(p_sessions text[], p_expected bigint[], p_first bigint[],
                                   p_status text[])
RETURNS TABLE (i bigint, session text, expected bigint, first bigint)
LANGUAGE sql IMMUTABLE AS $$
  SELECT t.i, t.session, t.expected, t.first
    FROM unnest(p_sessions, p_expected, p_first, p_status) WITH ORDINALITY
           AS t(session, expected, first, verdict, i)
   WHERE t.verdict = 'ok'
$$;

-- One row per append, in the order given: ('ok', its new next_seq, NULL, its token, the
-- owner, its first position, whether it gave the lease back), ('conflict', the real
-- next_seq, the real head hash, the token, the owner, NULL, false), ('owned', …, the
-- other owner, …) or ('fenced', …). At most one
-- append of a session per call (the caller's rule: the checks read each stream once).
-- An append without a token (`p_epochs[i]` NULL) takes the session's lease when it is
-- free and the append is accepted.
CREATE FUNCTION turnstile.append_batch(
    p_owner          text,
    p_sessions       text[],
    p_epochs         bigint[],
    p_expected       bigint[],
    p_head_hashes    bytea[],
    p_counts         int[],
    p_deleted        boolean[],
    p_record_of      int[],
    p_record_offsets int[],
    p_records        bytea[],
    p_blob_of        int[],
    p_blob_digests   bytea[],
    p_blobs          bytea[],
    p_created_of     int[],
    p_created_agents text[],
    p_created_users  text[],
    p_created_us     bigint[],
    p_queued_of      int[],
    p_queued_runs    text[],
    p_queued_agents  text[],
    p_queued_seqs    bigint[],
    p_status_of      int[],
    p_status_runs    text[],
    p_statuses       text[],
    p_terminal       boolean[],
    p_key_of         int[],
    p_keys           text[],
    p_key_runs       text[])
RETURNS TABLE (status text, next_seq bigint, head_hash bytea, lease_epoch bigint,
               owner text, first_pos bigint, released boolean)
LANGUAGE plpgsql
-- Its statements' plans are made once per connection (the arrays' sizes change every
-- call, and a plan made for each would cost more than the append).
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  v_next   bigint;
  v_alive  boolean;
  v_status text[];
  v_epoch  bigint[];
  v_first  bigint[];
  v_actual bigint[];
  v_hash   bytea[];
  v_owner  text[];
  v_total  bigint;
  v_freed  bigint[] := '{}';
BEGIN
  -- First the global order's lock (every appender takes it first, so appenders never
  -- deadlock on each other's streams), then the streams in one order.
  SELECT p.next_pos INTO v_next FROM turnstile.positions p FOR UPDATE;
  v_alive := turnstile.alive(p_owner);
  -- A stream's row is made by its first append (one expecting sequence 0).
  IF 0 = ANY (p_expected) THEN
    INSERT INTO turnstile.streams (session_id, next_seq, head_hash)
    SELECT s.s, 0, decode(repeat('00', 32), 'hex')
      FROM unnest(p_sessions, p_expected) AS s(s, e) WHERE s.e = 0 ORDER BY s.s
    ON CONFLICT (session_id) DO NOTHING;
  END IF;

  WITH s AS (
    SELECT x.* FROM turnstile.streams x WHERE x.session_id = ANY (p_sessions)
     ORDER BY x.session_id FOR UPDATE),
  a AS (
    SELECT a.i, a.asked, a.expected, a.n, s.owner AS held_by,
           coalesce(s.lease_epoch, 0) AS held, coalesce(s.next_seq, 0) AS actual,
           coalesce(s.head_hash, decode(repeat('00', 32), 'hex')) AS hash,
           CASE WHEN a.asked IS NULL AND s.owner IS NOT NULL AND s.owner <> p_owner
                THEN turnstile.alive(s.owner) ELSE false END AS other_alive
      FROM unnest(p_sessions, p_epochs, p_expected, p_counts)
             WITH ORDINALITY AS a(session, asked, expected, n, i)
      -- No row yet (an append expecting more than sequence 0): a conflict at 0.
      LEFT JOIN s ON s.session_id = a.session),
  v AS (
    SELECT a.*,
      CASE
        WHEN a.asked IS NULL AND a.other_alive THEN 'owned'
        WHEN a.asked IS NULL AND NOT v_alive THEN 'fenced'
        WHEN a.asked IS NOT NULL AND (a.held_by IS DISTINCT FROM p_owner
             OR a.held <> a.asked OR NOT v_alive) THEN 'fenced'
        WHEN a.actual <> a.expected THEN 'conflict'
        ELSE 'ok' END AS verdict
      FROM a),
  w AS (
    SELECT v.*,
      CASE WHEN v.verdict IN ('owned', 'fenced') THEN v.held
           WHEN v.asked IS NOT NULL THEN v.asked
           WHEN v.held_by IS DISTINCT FROM p_owner THEN v.held + 1
           ELSE v.held END AS epoch,
      v_next + coalesce(sum(CASE WHEN v.verdict = 'ok' THEN v.n ELSE 0 END)
        OVER (ORDER BY v.i ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS first
      FROM v)
  SELECT array_agg(w.verdict ORDER BY w.i), array_agg(w.epoch ORDER BY w.i),
         array_agg(w.first ORDER BY w.i), array_agg(w.actual ORDER BY w.i),
         array_agg(w.hash ORDER BY w.i), array_agg(w.held_by ORDER BY w.i),
         coalesce(sum(w.n) FILTER (WHERE w.verdict = 'ok'), 0)
    INTO v_status, v_epoch, v_first, v_actual, v_hash, v_owner, v_total
    FROM w;

  -- Leases taken and heads moved, one update of each stream.
  UPDATE turnstile.streams x
     SET owner = CASE WHEN t.asked IS NULL THEN p_owner ELSE x.owner END,
         lease_epoch = CASE WHEN t.asked IS NULL THEN t.epoch ELSE x.lease_epoch END,
         next_seq = CASE WHEN t.verdict = 'ok' THEN t.expected + t.n ELSE x.next_seq END,
         head_hash = CASE WHEN t.verdict = 'ok' THEN t.hash ELSE x.head_hash END
    FROM unnest(p_sessions, p_epochs, v_epoch, v_status, p_expected, p_counts, p_head_hashes)
           AS t(session, asked, epoch, verdict, expected, n, hash)
   WHERE x.session_id = t.session
     AND t.verdict = 'ok';

  -- What the records change, of the accepted appends only (`b.i` is an append's place).
  INSERT INTO turnstile.events (session_id, seq, pos, record)
  SELECT b.session, b.expected + r.off, b.first + r.off, r.rec
    FROM unnest(p_record_of, p_record_offsets, p_records) AS r(of, off, rec)
    JOIN turnstile.accepted(p_sessions, p_expected, v_first, v_status) b ON b.i = r.of;
  IF cardinality(p_blob_of) > 0 THEN
    INSERT INTO turnstile.blobs (digest, bytes)
    SELECT r.d, r.b FROM unnest(p_blob_of, p_blob_digests, p_blobs) AS r(of, d, b)
      JOIN turnstile.accepted(p_sessions, p_expected, v_first, v_status) b ON b.i = r.of
    ON CONFLICT (digest) DO NOTHING;
  END IF;
  IF cardinality(p_created_of) > 0 THEN
    INSERT INTO turnstile.sessions (session_id, agent_id, user_id, created_at_us)
    SELECT b.session, r.a, r.u, r.us
      FROM unnest(p_created_of, p_created_agents, p_created_users, p_created_us) AS r(of, a, u, us)
      JOIN turnstile.accepted(p_sessions, p_expected, v_first, v_status) b ON b.i = r.of
    ON CONFLICT (session_id) DO UPDATE
      SET agent_id = EXCLUDED.agent_id, user_id = EXCLUDED.user_id,
          created_at_us = EXCLUDED.created_at_us;
  END IF;
  IF cardinality(p_queued_of) > 0 THEN
    INSERT INTO turnstile.runs (run_id, session_id, agent_id, queued_seq, queued_pos, status)
    SELECT r.r, b.session, r.a, r.s, b.first + (r.s - b.expected), 'P'
      FROM unnest(p_queued_of, p_queued_runs, p_queued_agents, p_queued_seqs) AS r(of, r, a, s)
      JOIN turnstile.accepted(p_sessions, p_expected, v_first, v_status) b ON b.i = r.of
    ON CONFLICT (run_id) DO NOTHING;
  END IF;
  -- In the order the records give them: a run's last change in its append wins.
  IF cardinality(p_status_of) > 0 THEN
    UPDATE turnstile.runs r
       SET status = c.st::"char", open = r.open AND NOT c.term
      FROM (SELECT DISTINCT ON (x.r) x.r, x.st, x.term
              FROM unnest(p_status_of, p_status_runs, p_statuses, p_terminal)
                     WITH ORDINALITY AS x(of, r, st, term, k)
              JOIN turnstile.accepted(p_sessions, p_expected, v_first, v_status) b ON b.i = x.of
             ORDER BY x.r, x.k DESC) AS c
     WHERE r.run_id = c.r;
  END IF;
  IF cardinality(p_key_of) > 0 THEN
    INSERT INTO turnstile.idempotency_keys (key, run_id)
    SELECT DISTINCT ON (k.k) k.k, k.r
      FROM unnest(p_key_of, p_keys, p_key_runs) WITH ORDINALITY AS k(of, k, r, n)
      JOIN turnstile.accepted(p_sessions, p_expected, v_first, v_status) b ON b.i = k.of
     ORDER BY k.k, k.n DESC
    ON CONFLICT (key) DO UPDATE SET run_id = EXCLUDED.run_id;
  END IF;
  IF true = ANY (p_deleted) THEN
    DELETE FROM turnstile.sessions x
     USING unnest(p_deleted) WITH ORDINALITY AS d(deleted, i),
           turnstile.accepted(p_sessions, p_expected, v_first, v_status) b
     WHERE d.deleted AND b.i = d.i AND x.session_id = b.session;
    UPDATE turnstile.runs x SET listed = false
      FROM unnest(p_deleted) WITH ORDINALITY AS d(deleted, i),
           turnstile.accepted(p_sessions, p_expected, v_first, v_status) b
     WHERE d.deleted AND b.i = d.i AND x.session_id = b.session AND x.listed;
  END IF;

  -- The append that ends a session's last open run gives its lease back with it (the
  -- lease is one of a session with work to do): the session's next turn may be taken
  -- by any replica as soon as this end is seen. Its owner takes it again with its next
  -- append if it has more to do.
  IF cardinality(p_status_of) > 0 THEN
    WITH freed AS (
      UPDATE turnstile.streams x SET owner = NULL
        FROM turnstile.accepted(p_sessions, p_expected, v_first, v_status) b
       WHERE x.session_id = b.session AND x.owner = p_owner
         AND b.i IN (SELECT t.of FROM unnest(p_status_of, p_terminal) AS t(of, term) WHERE t.term)
         AND NOT EXISTS (SELECT 1 FROM turnstile.runs r WHERE r.session_id = b.session AND r.open)
      RETURNING b.i)
    SELECT coalesce(array_agg(freed.i), '{}') INTO v_freed FROM freed;
  END IF;

  IF v_total > 0 THEN
    UPDATE turnstile.positions SET next_pos = v_next + v_total;
  END IF;

  RETURN QUERY
  SELECT t.verdict,
         CASE WHEN t.verdict = 'ok' THEN t.expected + t.n ELSE t.actual END,
         CASE WHEN t.verdict = 'conflict' THEN t.hash END,
         t.epoch,
         CASE WHEN t.verdict IN ('owned', 'fenced') THEN t.held_by ELSE p_owner END,
         CASE WHEN t.verdict = 'ok' THEN t.first END,
         t.i = ANY (v_freed)
    FROM unnest(v_status, p_expected, p_counts, v_actual, v_hash, v_epoch, v_owner, v_first)
           WITH ORDINALITY AS t(verdict, expected, n, actual, hash, epoch, held_by, first, i)
   ORDER BY t.i;
END $$;

-- Stored projections, several in one statement (a replica writes them behind, the
-- newest value of each key): without waiting for the WAL flush, as `put_projection`.
CREATE FUNCTION turnstile.put_projections(p_keys text[], p_values bytea[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  INSERT INTO turnstile.projections (key, value)
  SELECT k.k, k.v FROM unnest(p_keys, p_values) AS k(k, v) ORDER BY k.k
  ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;
END $$;
