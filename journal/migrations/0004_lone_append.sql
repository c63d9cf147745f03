-- A batch of one append (issue 33: one appender, or a quiet moment) goes to
-- `turnstile.append_one`, which does what `turnstile.append_batch` does for one append
-- with scalar statements: no unnest-and-join of every column, no window over the
-- batch, about half the database's work. Same arguments, same answer, same checks.

-- Whether a replica is alive, by the database's clock. PL/pgSQL keeps its query's plan
-- for the connection; a SQL function that cannot be inlined (it holds a subquery) was
-- parsed and planned again at every call.
CREATE OR REPLACE FUNCTION turnstile.alive(p_replica text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN EXISTS (SELECT 1 FROM turnstile.replicas r
                  WHERE r.replica_id = p_replica AND r.expires_at > now());
END $$;

-- `turnstile.append_batch` for a batch of exactly one append (its columns' `*_of`
-- arrays all name it, and are not read). The checks, their order and the verdicts are
-- the batch's: the global order's lock first, then the stream's row.
CREATE FUNCTION turnstile.append_one(
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
LANGUAGE plpgsql AS $$
DECLARE
  v_session  text   := p_sessions[1];
  v_asked    bigint := p_epochs[1];
  v_expected bigint := p_expected[1];
  v_n        bigint := p_counts[1];
  v_zero     bytea  := decode(repeat('00', 32), 'hex');
  v_next     bigint;
  v_held_by  text;
  v_held     bigint;
  v_actual   bigint;
  v_hash     bytea;
  v_verdict  text;
  v_epoch    bigint;
  v_freed    boolean;
BEGIN
  IF cardinality(p_sessions) <> 1 THEN
    RAISE EXCEPTION 'turnstile.append_one takes one append, not %', cardinality(p_sessions);
  END IF;
  -- The global order's lock first, taken by moving the order past this append's
  -- records (moved back if the append is refused).
  UPDATE turnstile.positions p SET next_pos = p.next_pos + v_n
  RETURNING p.next_pos - v_n INTO v_next;

  -- The common case in one statement: the stream's head where the append expects it,
  -- the lease free (or its holder's heartbeat lapsed) or this replica's with this
  -- token, and this replica alive. A session's first append makes its row.
  IF v_expected = 0 AND v_asked IS NULL THEN
    INSERT INTO turnstile.streams AS x (session_id, next_seq, head_hash, owner, lease_epoch)
    SELECT v_session, v_n, p_head_hashes[1], p_owner, 1
     WHERE EXISTS (SELECT 1 FROM turnstile.replicas r
                    WHERE r.replica_id = p_owner AND r.expires_at > now())
    ON CONFLICT (session_id) DO NOTHING
    RETURNING x.lease_epoch INTO v_epoch;
  END IF;
  IF v_epoch IS NULL THEN
    UPDATE turnstile.streams x
       SET owner = p_owner,
           lease_epoch = CASE WHEN v_asked IS NOT NULL THEN v_asked
                              WHEN x.owner IS DISTINCT FROM p_owner THEN x.lease_epoch + 1
                              ELSE x.lease_epoch END,
           next_seq = v_expected + v_n,
           head_hash = p_head_hashes[1]
     WHERE x.session_id = v_session
       AND x.next_seq = v_expected
       AND CASE WHEN v_asked IS NULL
                THEN x.owner IS NULL OR x.owner = p_owner OR NOT turnstile.alive(x.owner)
                ELSE x.owner = p_owner AND x.lease_epoch = v_asked END
       AND EXISTS (SELECT 1 FROM turnstile.replicas r
                    WHERE r.replica_id = p_owner AND r.expires_at > now())
    RETURNING x.lease_epoch INTO v_epoch;
  END IF;

  IF v_epoch IS NULL THEN
    -- Refused: the order moved back, and why, by the batch's checks in the batch's
    -- order (an append expecting sequence 0 still makes the stream's row).
    UPDATE turnstile.positions SET next_pos = v_next;
    IF v_expected = 0 THEN
      INSERT INTO turnstile.streams (session_id, next_seq, head_hash)
      VALUES (v_session, 0, v_zero) ON CONFLICT (session_id) DO NOTHING;
    END IF;
    SELECT x.owner, x.lease_epoch, x.next_seq, x.head_hash
      INTO v_held_by, v_held, v_actual, v_hash
      FROM turnstile.streams x WHERE x.session_id = v_session FOR UPDATE;
    -- No row (an append expecting more than sequence 0): a conflict at 0.
    v_held := coalesce(v_held, 0);
    v_actual := coalesce(v_actual, 0);
    v_hash := coalesce(v_hash, v_zero);
    v_verdict := CASE
      WHEN v_asked IS NULL AND v_held_by IS NOT NULL AND v_held_by <> p_owner
           AND turnstile.alive(v_held_by) THEN 'owned'
      WHEN v_asked IS NULL AND NOT turnstile.alive(p_owner) THEN 'fenced'
      WHEN v_asked IS NOT NULL AND (v_held_by IS DISTINCT FROM p_owner OR v_held <> v_asked
           OR NOT turnstile.alive(p_owner)) THEN 'fenced'
      WHEN v_actual <> v_expected THEN 'conflict'
      ELSE 'ok' END;
    IF v_verdict = 'ok' THEN
      RAISE EXCEPTION 'turnstile.append_one: its checks disagree on session %', v_session;
    END IF;
    status := v_verdict;
    next_seq := v_actual;
    head_hash := CASE WHEN v_verdict = 'conflict' THEN v_hash END;
    lease_epoch := CASE WHEN v_verdict = 'conflict' AND v_asked IS NULL
                             AND v_held_by IS DISTINCT FROM p_owner THEN v_held + 1
                        WHEN v_verdict = 'conflict' AND v_asked IS NOT NULL THEN v_asked
                        ELSE v_held END;
    owner := CASE WHEN v_verdict IN ('owned', 'fenced') THEN v_held_by ELSE p_owner END;
    released := false;
    RETURN NEXT;
    RETURN;
  END IF;

  INSERT INTO turnstile.events (session_id, seq, pos, record)
  SELECT v_session, v_expected + r.off, v_next + r.off, r.rec
    FROM unnest(p_record_offsets, p_records) AS r(off, rec);
  IF cardinality(p_blobs) > 0 THEN
    INSERT INTO turnstile.blobs (digest, bytes)
    SELECT r.d, r.b FROM unnest(p_blob_digests, p_blobs) AS r(d, b)
    ON CONFLICT (digest) DO NOTHING;
  END IF;
  IF cardinality(p_created_agents) > 0 THEN
    INSERT INTO turnstile.sessions (session_id, agent_id, user_id, created_at_us)
    SELECT v_session, r.a, r.u, r.us
      FROM unnest(p_created_agents, p_created_users, p_created_us) AS r(a, u, us)
    ON CONFLICT (session_id) DO UPDATE
      SET agent_id = EXCLUDED.agent_id, user_id = EXCLUDED.user_id,
          created_at_us = EXCLUDED.created_at_us;
  END IF;
  IF cardinality(p_queued_runs) > 0 THEN
    INSERT INTO turnstile.runs (run_id, session_id, agent_id, queued_seq, queued_pos, status)
    SELECT r.r, v_session, r.a, r.s, v_next + (r.s - v_expected), 'P'
      FROM unnest(p_queued_runs, p_queued_agents, p_queued_seqs) AS r(r, a, s)
    ON CONFLICT (run_id) DO NOTHING;
  END IF;
  -- In the order the records give them: a run's last change in its append wins.
  IF cardinality(p_status_runs) > 0 THEN
    UPDATE turnstile.runs r
       SET status = c.st::"char", open = r.open AND NOT c.term
      FROM (SELECT DISTINCT ON (x.r) x.r, x.st, x.term
              FROM unnest(p_status_runs, p_statuses, p_terminal)
                     WITH ORDINALITY AS x(r, st, term, k)
             ORDER BY x.r, x.k DESC) AS c
     WHERE r.run_id = c.r;
  END IF;
  IF cardinality(p_keys) > 0 THEN
    INSERT INTO turnstile.idempotency_keys (key, run_id)
    SELECT DISTINCT ON (k.k) k.k, k.r
      FROM unnest(p_keys, p_key_runs) WITH ORDINALITY AS k(k, r, n)
     ORDER BY k.k, k.n DESC
    ON CONFLICT (key) DO UPDATE SET run_id = EXCLUDED.run_id;
  END IF;
  IF p_deleted[1] THEN
    DELETE FROM turnstile.sessions x WHERE x.session_id = v_session;
    UPDATE turnstile.runs x SET listed = false WHERE x.session_id = v_session AND x.listed;
  END IF;
  -- The append that ends the session's last open run gives its lease back with it.
  IF true = ANY (p_terminal) THEN
    UPDATE turnstile.streams x SET owner = NULL
     WHERE x.session_id = v_session
       AND NOT EXISTS (SELECT 1 FROM turnstile.runs r
                        WHERE r.session_id = v_session AND r.open)
    RETURNING true INTO v_freed;
  END IF;

  status := 'ok';
  next_seq := v_expected + v_n;
  lease_epoch := v_epoch;
  owner := p_owner;
  first_pos := v_next;
  released := coalesce(v_freed, false);
  RETURN NEXT;
END $$;

-- Takes a session's lease (as in migration 1: when it is free, its owner's heartbeat
-- has lapsed, or p_owner has it already; a change of hands gives a new fencing token),
-- in one statement for the common case rather than an insert, a locking read and an
-- update.
CREATE OR REPLACE FUNCTION turnstile.acquire(p_session text, p_owner text)
RETURNS TABLE (status text, lease_epoch bigint, next_seq bigint, owner text)
LANGUAGE plpgsql AS $$
DECLARE
  v_epoch bigint;
  v_next  bigint;
  v_owner text;
BEGIN
  IF NOT turnstile.alive(p_owner) THEN
    RETURN QUERY SELECT 'fenced'::text, NULL::bigint, NULL::bigint, p_owner;
    RETURN;
  END IF;
  INSERT INTO turnstile.streams AS x (session_id, next_seq, head_hash, owner, lease_epoch)
  VALUES (p_session, 0, decode(repeat('00', 32), 'hex'), p_owner, 1)
  ON CONFLICT (session_id) DO UPDATE
    SET owner = p_owner,
        lease_epoch = CASE WHEN x.owner IS DISTINCT FROM p_owner THEN x.lease_epoch + 1
                           ELSE x.lease_epoch END
    WHERE x.owner IS NULL OR x.owner = p_owner OR NOT turnstile.alive(x.owner)
  RETURNING x.lease_epoch, x.next_seq INTO v_epoch, v_next;
  IF FOUND THEN
    RETURN QUERY SELECT 'ok'::text, v_epoch, v_next, p_owner;
    RETURN;
  END IF;
  -- Another live replica holds it (the conflicting row is locked by the statement).
  SELECT x.lease_epoch, x.next_seq, x.owner INTO v_epoch, v_next, v_owner
    FROM turnstile.streams x WHERE x.session_id = p_session;
  RETURN QUERY SELECT 'owned'::text, v_epoch, v_next, v_owner;
END $$;
