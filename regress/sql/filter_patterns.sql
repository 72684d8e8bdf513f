-- realtime.match_patterns(patterns, ops, subjects, asked, budget_ms): the pattern filters of
-- Postgres Changes (like, ilike, match, imatch) judged by Postgres's own LIKE, ILIKE, ~ and
-- ~*, each distinct pattern under a time budget of its own, so that one costly pattern
-- fails alone and the others of the call are answered.

-- Supabase's verdicts (fixtures/filter_verdicts.csv: for each column type, value, operator,
-- negation and filter value, what Supabase's realtime.check_equality_op returned; NULL is
-- no delivery) against ours: the raw verdict of match_patterns, negated as the sidecar
-- negates it (a NULL stays no delivery). Escapes (%, _, backslash), `*` as a plain
-- character, case, anchors, back references, character classes, NULL values. The rows of
-- the operators the sidecar judges itself (eq, is, isdistinct...) are compared with the
-- same file by its unit test (postgres_changes::binding).
\getenv abs_srcdir PG_ABS_SRCDIR
\set fixture :abs_srcdir '/fixtures/filter_verdicts.csv'
CREATE TEMP TABLE facts (type text, value text, op text, negate boolean, pattern text, supabase boolean);
COPY facts FROM :'fixture' WITH (FORMAT csv, HEADER, NULL 'NULL');
CREATE TEMP TABLE pattern_facts AS
    SELECT (row_number() OVER ())::int AS n, * FROM facts WHERE op IN ('like', 'ilike', 'match', 'imatch');
CREATE TEMP TABLE judged AS
    SELECT * FROM realtime.match_patterns(
        (SELECT array_agg(pattern ORDER BY n) FROM pattern_facts),
        (SELECT array_agg(op ORDER BY n) FROM pattern_facts),
        (SELECT array_agg(value ORDER BY n) FROM pattern_facts),
        (SELECT array_agg(x ORDER BY n, k) FROM pattern_facts, LATERAL (VALUES (1, n), (2, n)) v(k, x)),
        10000);
SELECT f.op, count(*) AS rows,
       count(*) FILTER (WHERE coalesce(j.matched <> f.negate, false) = coalesce(f.supabase, false)) AS same_verdict,
       count(*) FILTER (WHERE f.supabase) AS delivered, count(*) FILTER (WHERE j.error IS NOT NULL) AS errors
FROM pattern_facts f LEFT JOIN judged j ON j.pattern = f.n AND (j.subject = f.n OR j.subject IS NULL)
GROUP BY f.op ORDER BY f.op;
-- Any disagreement, named (none expected).
SELECT f.value, f.op, f.negate, f.pattern, f.supabase, j.matched, j.error
FROM pattern_facts f LEFT JOIN judged j ON j.pattern = f.n AND (j.subject = f.n OR j.subject IS NULL)
WHERE coalesce(j.matched <> f.negate, false) <> coalesce(f.supabase, false) OR j.error IS NOT NULL;

-- A few of the facts, readable: `*` is no wildcard, a backslash escapes, ILIKE and ~* fold
-- case, Postgres's regular expressions have back references, classes and embedded options.
SELECT pattern, subject, matched, error FROM realtime.match_patterns(
    ARRAY['a*c', 'a\_c', 'A%', '^(a)\1$', '[[:digit:]]', '(?i)ABC', '^post-', '^post-'],
    ARRAY['like', 'like', 'ilike', 'match', 'match', 'match', 'match', 'imatch'],
    ARRAY['abc', 'a*c', 'a_c', 'abc', 'aa', 'a1', NULL, 'Post-1'],
    ARRAY[1,1, 1,2, 2,3, 2,4, 3,4, 4,5, 4,4, 5,6, 5,1, 6,4, 7,8, 8,8, 8,7]) ORDER BY pattern, subject;

-- Only the pairs asked are judged; without `asked`, every pattern against every subject.
SELECT pattern, subject, matched FROM realtime.match_patterns(ARRAY['^a', 'b$'], ARRAY['match', 'match'],
    ARRAY['ab', 'ba']) ORDER BY pattern, subject;

-- An invalid pattern (which the join's check refuses) fails alone, with Postgres's reason.
SELECT pattern, subject, matched, error FROM realtime.match_patterns(ARRAY['(open', 'ok'], ARRAY['match', 'match'],
    ARRAY['ok'], ARRAY[1,1, 2,1]) ORDER BY pattern;
SELECT pattern, subject, matched, error FROM realtime.match_patterns(ARRAY['a\'], ARRAY['like'], ARRAY['ab'], ARRAY[1,1]);

-- A costly pattern (back references over a long value take seconds; measured about 1.6 s
-- over 61 characters on this machine, and its cost grows with each one) is cut at its
-- budget and fails alone: the cheap patterns before and after it in the same call are
-- answered, and the call returns in about its budget, not the pattern's cost.
CREATE TEMP TABLE slow_call AS
    SELECT clock_timestamp() AS started, m.*, clock_timestamp() AS ended
    FROM realtime.match_patterns(
        ARRAY['^a', '^(.*)(.*)(.*)(.*)(.*)\5\4\3\2\1$', 'b$'],
        ARRAY['match', 'match', 'imatch'],
        ARRAY[repeat('a', 200) || 'b'],
        ARRAY[1,1, 2,1, 3,1],
        200) m;
SELECT pattern, subject, matched, error FROM slow_call ORDER BY pattern;
SELECT max(ended) - min(started) < interval '3 s' AS cut_at_its_budget FROM slow_call;

-- The whole statement's timeout is not a pattern's: it still ends the call (the sidecar
-- treats that as a failed check), and is never taken for a budget.
SET statement_timeout = '300ms';
SELECT * FROM realtime.match_patterns(ARRAY['^(.*)(.*)(.*)(.*)(.*)\5\4\3\2\1$'], ARRAY['match'],
    ARRAY[repeat('a', 200) || 'b'], NULL, 60000);
RESET statement_timeout;
-- After the budget's cancel and the statement's, the session is intact and its next
-- statement runs normally (no cancel left pending).
SELECT pg_sleep(0.3), 'still here' AS after;

-- Refused calls: arrays that do not line up, an unknown operator, pairs out of range, no
-- budget.
SELECT * FROM realtime.match_patterns(ARRAY['a'], ARRAY['match', 'like'], ARRAY['a']);
SELECT * FROM realtime.match_patterns(ARRAY['a'], ARRAY['regex'], ARRAY['a']);
SELECT * FROM realtime.match_patterns(ARRAY['a'], ARRAY['match'], ARRAY['a'], ARRAY[1, 2]);
SELECT * FROM realtime.match_patterns(ARRAY['a'], ARRAY['match'], ARRAY['a'], ARRAY[1]);
SELECT * FROM realtime.match_patterns(ARRAY['a'], ARRAY['match'], ARRAY['a'], NULL, 0);

-- The sidecar's role only.
SELECT has_function_privilege('public', 'realtime.match_patterns(text[],text[],text[],integer[],integer)', 'EXECUTE') AS public_can_call;
