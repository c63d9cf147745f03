-- A batch of one append whose records change no index (no session created or deleted,
-- no run queued or changing status, no idempotency key, no event stored apart: a run's
-- transcript lines and tool events, the most common append) goes to
-- `turnstile.append_plain`: seven arguments instead of twenty-eight, and the common
-- case (the lease held with its token, the head where the append expects it) in three
-- statements. Anything else is `turnstile.append_one`'s, called with the same append:
-- one place for the refusals and the lease taken by an append.

CREATE FUNCTION turnstile.append_plain(
    p_owner          text,
    p_session        text,
    p_epoch          bigint,
    p_expected       bigint,
    p_head_hash      bytea,
    p_record_offsets int[],
    p_records        bytea[])
RETURNS TABLE (status text, next_seq bigint, head_hash bytea, lease_epoch bigint,
               owner text, first_pos bigint, released boolean)
LANGUAGE plpgsql AS $$
DECLARE
  v_n     bigint := cardinality(p_records);
  v_next  bigint;
  v_epoch bigint;
BEGIN
  IF p_epoch IS NOT NULL THEN
    -- The global order's lock first (as every appender), then the stream's head and
    -- lease in one statement.
    UPDATE turnstile.positions p SET next_pos = p.next_pos + v_n
    RETURNING p.next_pos - v_n INTO v_next;
    UPDATE turnstile.streams x
       SET next_seq = p_expected + v_n, head_hash = p_head_hash
     WHERE x.session_id = p_session
       AND x.next_seq = p_expected
       AND x.owner = p_owner AND x.lease_epoch = p_epoch
       AND EXISTS (SELECT 1 FROM turnstile.replicas r
                    WHERE r.replica_id = p_owner AND r.expires_at > now())
    RETURNING x.lease_epoch INTO v_epoch;
    IF v_epoch IS NOT NULL THEN
      INSERT INTO turnstile.events (session_id, seq, pos, record)
      SELECT p_session, p_expected + r.off, v_next + r.off, r.rec
        FROM unnest(p_record_offsets, p_records) AS r(off, rec);
      status := 'ok';
      next_seq := p_expected + v_n;
      lease_epoch := v_epoch;
      owner := p_owner;
      first_pos := v_next;
      released := false;
      RETURN NEXT;
      RETURN;
    END IF;
    -- Not the common case: the order moved back, and the append is append_one's.
    UPDATE turnstile.positions SET next_pos = v_next;
  END IF;
  RETURN QUERY SELECT * FROM turnstile.append_one(
    p_owner, ARRAY[p_session], ARRAY[p_epoch], ARRAY[p_expected], ARRAY[p_head_hash],
    ARRAY[v_n::int], ARRAY[false], array_fill(1, ARRAY[v_n::int]), p_record_offsets,
    p_records, '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}',
    '{}', '{}', '{}', '{}', '{}');
END $$;
